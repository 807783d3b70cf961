// compcntr_opcount: runs N operations of one kind in a loop of its own, for instruction counting
// with callgrind (stable on a noisy machine, unlike time). Each loop is an extern "C" noinline
// function named opcount_<op>, so callgrind can count just that function:
//
//   valgrind --tool=callgrind --toggle-collect=opcount_add --callgrind-out-file=/dev/null \
//       build-release/bench/compcntr_opcount add 1000000
//   -> "Collected : 9000012"  => 9 instructions per add (loop overhead included; compare with
//      the raw_* ops, which run the same loop around a bare std::atomic)
//
// bench/opcount.sh does this for every op and prints instructions per operation.
//
// Ops whose count of iterations is not N (the poll loops of a wait: they spin until another
// thread updates the counter) are counted per *iteration*: opcount.sh runs them with
// --dump-instr=yes and divides the collected instructions by the execution count of the loop's
// instructions (the largest per-instruction count: every instruction of the loop body runs
// once per iteration), see opcount_iter.py.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <system_error>
#include <thread>
#include <vector>

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "harness.hpp"
#include "rows/freelist.hpp"
#include "rows/p11_c_loops.h"

#include <compcntr/compcntr.h>

import compcntr;

extern "C" {

__attribute__((noinline)) void opcount_read(const compcntr::counter& c, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) bench::keep(c.value());
}
__attribute__((noinline)) void opcount_raw_load(const std::atomic<std::uint64_t>& a,
                                                std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) bench::keep(a.load(std::memory_order_acquire));
}
__attribute__((noinline)) void opcount_add(compcntr::counter& c, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) c.add(1);
}
/// An add of a counter whose triggers are armed above its value (the watcher path: two loads
/// more, no lock), and adds that each fire one pre-armed arm_add trigger (compcntr:trigger).
__attribute__((noinline)) void opcount_add_armed_ahead(compcntr::counter& c, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) c.add(1);
}
__attribute__((noinline)) void opcount_trigger_fire(compcntr::counter& c, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) c.add(1);
}
__attribute__((noinline)) void opcount_raw_add(std::atomic<std::uint64_t>& a, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) a.fetch_add(1);
}
/// n creates then n destroys (P7's pattern); callgrind follows the calls into libcompcntr.
__attribute__((noinline)) void opcount_create_destroy(compcntr::device& dev,
                                                      std::vector<compcntr::counter>& v,
                                                      std::uint64_t n) {
  std::error_code ec;
  for (std::uint64_t i = 0; i < n; ++i) v[i] = dev.create_counter(compcntr::counter_type::wrs, ec);
  for (std::uint64_t i = 0; i < n; ++i) v[i].reset();
}

/// P12's operations on a striped counter (one thread: the stripe choice and the RMW).
__attribute__((noinline)) void opcount_striped_add(compcntr::counter& c, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) c.add(1);
}
__attribute__((noinline)) void opcount_striped_read(const compcntr::counter& c, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) bench::keep(c.value());
}
/// One create + destroy at a time (the pool's hot path, P7's "one at a time").
/// P18's operations on a shared counter (device "shm:..."): an add (the stripe, the RMW, the
/// segment's sleeper word), and a spin wait whose threshold is already reached (the call's entry
/// and exit: what a ping-pong side adds around its poll).
__attribute__((noinline)) void opcount_shared_add(compcntr::counter& c, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) c.add(1);
}
__attribute__((noinline)) void opcount_shared_wait_satisfied(const compcntr::counter& c,
                                                             std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i)
    bench::keep(static_cast<std::uint64_t>(
        compcntr::wait(c, 1, std::chrono::milliseconds(2000), {.spin = compcntr::spin_forever})));
}
__attribute__((noinline)) void opcount_create_destroy_one(compcntr::device& dev, std::uint64_t n) {
  std::error_code ec;
  for (std::uint64_t i = 0; i < n; ++i) {
    auto c = dev.create_counter(compcntr::counter_type::wrs, ec);
    bench::escape(&c);
  }
}
/// P7's references: the minimal free list (rows/freelist.hpp), one at a time and n live.
__attribute__((noinline)) void opcount_freelist_one(bench::rows::free_list& fl, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) {
    bench::rows::block128* b = fl.pop();
    bench::escape(b);
    fl.push(*b);
  }
}
__attribute__((noinline)) void opcount_freelist_all(bench::rows::free_list& fl,
                                                    std::vector<bench::rows::block128*>& held,
                                                    std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) held[i] = fl.pop();
  for (std::uint64_t i = 0; i < n; ++i) fl.push(*held[i]);
}
/// n creates then n destroys through the C API.
__attribute__((noinline)) void opcount_c_create_destroy(compcntr_device* dev,
                                                        std::vector<compcntr_comp_cntr*>& v,
                                                        std::uint64_t n) {
  compcntr_comp_cntr_init_attr attr{};
  for (std::uint64_t i = 0; i < n; ++i) v[i] = compcntr_create_comp_cntr(dev, &attr);
  for (std::uint64_t i = 0; i < n; ++i) compcntr_destroy_comp_cntr(v[i]);
}

/// The spin wait's poll loop: compcntr::wait in spin-only mode on a counter another thread
/// completes later (per iteration, see the file comment). Without a timeout (no clock read in
/// the loop) and with a 2 s one (a clock read every 16 polls).
__attribute__((noinline)) void opcount_wait_poll(const compcntr::counter& c) {
  bench::keep(static_cast<std::uint64_t>(
      compcntr::wait(c, 1, compcntr::wait_forever, {.spin = compcntr::spin_forever})));
}
__attribute__((noinline)) void opcount_shared_wait_poll(const compcntr::counter& c) {
  bench::keep(static_cast<std::uint64_t>(
      compcntr::wait(c, 1, std::chrono::milliseconds(2000), {.spin = compcntr::spin_forever})));
}
__attribute__((noinline)) void opcount_wait_poll_timeout(const compcntr::counter& c) {
  bench::keep(static_cast<std::uint64_t>(
      compcntr::wait(c, 1, std::chrono::milliseconds(2000), {.spin = compcntr::spin_forever})));
}
/// The raw reference of P4: `pause` + acquire load until the value is reached; and the same with
/// P4's 16-poll clock check.
__attribute__((noinline)) void opcount_raw_poll(const std::atomic<std::uint64_t>& a) {
  while (a.load(std::memory_order_acquire) < 1) compcntr::cpu_relax();
}
__attribute__((noinline)) void opcount_raw_poll_timeout(const std::atomic<std::uint64_t>& a) {
  if (a.load(std::memory_order_acquire) >= 1) return;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(2000);
  for (unsigned k = 1;; ++k) {
    compcntr::cpu_relax();
    if (a.load(std::memory_order_acquire) >= 1) return;
    if (k % 16 == 0 && std::chrono::steady_clock::now() >= end) return;
  }
}

/// P5's user-space halves (one call each; the kernel's part is not counted by callgrind): a
/// forced-sleep wait that sleeps until another thread's update 200 ms later wakes it, and that
/// update (an add() that finds a sleeper registered and calls FUTEX_WAKE); the same for
/// libstdc++'s atomic<uint64_t>::wait / fetch_add + notify_one, and for P5's raw futex pair
/// (fetch_add + FUTEX_WAKE_PRIVATE; load, compare, FUTEX_WAIT_PRIVATE on the low half).
__attribute__((noinline)) void opcount_sleep_wait(const compcntr::counter& c) {
  bench::keep(static_cast<std::uint64_t>(compcntr::wait(c, 1, std::chrono::milliseconds(2000),
                                                        {.spin = std::chrono::nanoseconds(0)})));
}
__attribute__((noinline)) void opcount_sleep_wake(compcntr::counter& c) { c.add(1); }
__attribute__((noinline)) void opcount_atomic_wait(const std::atomic<std::uint64_t>& a) {
  a.wait(0);
}
__attribute__((noinline)) void opcount_atomic_wake(std::atomic<std::uint64_t>& a) {
  a.fetch_add(1);
  a.notify_one();
}
__attribute__((noinline)) void opcount_futex_wait(std::atomic<std::uint64_t>& a) {
  const timespec ts{2, 0};
  while (a.load(std::memory_order_acquire) < 1)
    ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&a), FUTEX_WAIT_PRIVATE, 0u, &ts, nullptr,
              0);
}
__attribute__((noinline)) void opcount_futex_wake(std::atomic<std::uint64_t>& a) {
  a.fetch_add(1);
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&a), FUTEX_WAKE_PRIVATE, 1, nullptr,
            nullptr, 0);
}

}  // extern "C"

namespace {
/// Runs poll(word) while another thread sets the word after `ms` milliseconds (of wall time:
/// under valgrind the poll loop runs millions of iterations meanwhile).
template <class Poll, class Set>
void poll_until_set(Poll poll, Set set, int ms) {
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    set();
  });
  poll();
  t.join();
}
} // namespace

/// Not counted (name does not match opcount_*): fills the pool so the counted pass recycles slots.
__attribute__((noinline)) static void warm_pool(compcntr::device& dev,
                                                std::vector<compcntr::counter>& v,
                                                std::uint64_t n) {
  std::error_code ec;
  for (std::uint64_t i = 0; i < n; ++i) v[i] = dev.create_counter(compcntr::counter_type::wrs, ec);
  for (std::uint64_t i = 0; i < n; ++i) v[i].reset();
}

int main(int argc, char** argv) {
  const char* ops = "read raw_load add raw_add create_destroy create_destroy_one freelist_one "
                    "freelist_all c_read c_read_err c_inc c_inc_err c_wait_satisfied c_raw_load "
                    "c_raw_fetch_add c_create_destroy wait_poll wait_poll_timeout raw_poll "
                    "raw_poll_timeout striped_add striped_read sleep atomic_sleep futex_sleep "
                    "shared_add shared_wait_satisfied shared_wait_poll";
  if (argc != 3) {
    std::fprintf(stderr, "usage: compcntr_opcount OP N   (OP: %s)\n", ops);
    return 2;
  }
  const std::string op = argv[1];
  const std::uint64_t n = std::strtoull(argv[2], nullptr, 10);
  std::error_code ec;
  auto dev = compcntr::device::open("soft", ec);
  if (ec) return std::fprintf(stderr, "open soft: %s\n", compcntr::last_error_message().data()), 1;
  auto c = dev.create_counter(compcntr::counter_type::wrs, ec);
  if (ec) return std::fprintf(stderr, "create: %s\n", compcntr::last_error_message().data()), 1;
  std::atomic<std::uint64_t> a{0};
  compcntr_device* cdev = nullptr;
  compcntr_comp_cntr* cc = nullptr;
  if (op.rfind("c_", 0) == 0) {
    cdev = compcntr_open_device("soft");
    compcntr_comp_cntr_init_attr attr{};
    if (cdev) cc = compcntr_create_comp_cntr(cdev, &attr);
    if (!cc) return std::fprintf(stderr, "C create: %s\n", compcntr_last_error_message()), 1;
    compcntr_set_comp_cntr(cc, 42);
  }
  std::uint64_t failures = 0;
  if (op == "read")
    opcount_read(c, n);
  else if (op == "raw_load")
    opcount_raw_load(a, n);
  else if (op == "add")
    opcount_add(c, n);
  else if (op == "raw_add")
    opcount_raw_add(a, n);
  else if (op == "add_armed_ahead" || op == "trigger_fire") {
    auto target = dev.create_counter(compcntr::counter_type::wrs, ec);
    std::vector<compcntr::trigger> ts;
    const bool fire = op == "trigger_fire";
    for (std::uint64_t t = 1; t <= (fire ? n : 1) && !ec; ++t)
      ts.push_back(compcntr::trigger::arm_add(c, fire ? t : ~std::uint64_t{0}, target, 1, ec));
    if (ec) return std::fprintf(stderr, "arm: %s\n", compcntr::last_error_message().data()), 1;
    if (fire)
      opcount_trigger_fire(c, n);
    else
      opcount_add_armed_ahead(c, n);
    if (fire && target.value() != n) return std::fprintf(stderr, "trigger_fire: lost\n"), 1;
  } else if (op == "create_destroy") {
    std::vector<compcntr::counter> v(n);
    warm_pool(dev, v, n);
    opcount_create_destroy(dev, v, n);
  } else if (op == "striped_add" || op == "striped_read") {
    auto sc = dev.create_counter(compcntr::counter_options{.stripes = 2}, ec);
    if (ec)
      return std::fprintf(stderr, "create striped: %s\n", compcntr::last_error_message().data()), 1;
    if (op == "striped_add")
      opcount_striped_add(sc, n);
    else
      opcount_striped_read(sc, n);
  } else if (op == "shared_add" || op == "shared_wait_satisfied" || op == "shared_wait_poll") {
    const std::string name = "opcount-" + std::to_string(::getpid());
    auto sdev = compcntr::device::open_shared(name, compcntr::shared_create, 0600, ec);
    auto sc = sdev ? sdev.create_counter(compcntr::counter_type::wrs, ec) : compcntr::counter{};
    if (ec) return std::fprintf(stderr, "shared: %s\n", compcntr::last_error_message().data()), 1;
    if (op == "shared_add") {
      opcount_shared_add(sc, n);
    } else if (op == "shared_wait_satisfied") {
      sc.add(1);
      opcount_shared_wait_satisfied(sc, n);
    } else {
      poll_until_set([&] { opcount_shared_wait_poll(sc); }, [&] { sc.add(1); },
                     static_cast<int>(n));
    }
  } else if (op == "create_destroy_one") {
    opcount_create_destroy_one(dev, n);
  } else if (op == "freelist_one" || op == "freelist_all") {
    bench::rows::block128* mem = bench::rows::map_blocks(n);
    if (!mem) return std::fprintf(stderr, "mmap failed\n"), 1;
    bench::rows::free_list fl(mem, static_cast<std::uint32_t>(n));
    std::vector<bench::rows::block128*> held(n);
    if (op == "freelist_one")
      opcount_freelist_one(fl, n);
    else
      opcount_freelist_all(fl, held, n);
    bench::rows::unmap_blocks(mem, n);
  } else if (op == "c_read")
    p11_c_read(cc, n, &failures);
  else if (op == "c_read_err")
    p11_c_read_err(cc, n, &failures);
  else if (op == "c_inc")
    p11_c_inc(cc, n, &failures);
  else if (op == "c_inc_err")
    p11_c_inc_err(cc, n, &failures);
  else if (op == "c_wait_satisfied")
    p11_c_wait_satisfied(cc, 1, n, &failures);
  else if (op == "c_raw_load")
    p11_c_raw_load(&a, n);
  else if (op == "c_raw_fetch_add")
    p11_c_raw_fetch_add(&a, n);
  else if (op == "c_create_destroy") {
    std::vector<compcntr_comp_cntr*> v(n);
    compcntr_comp_cntr_init_attr attr{};
    for (std::uint64_t i = 0; i < n; ++i) v[i] = compcntr_create_comp_cntr(cdev, &attr);  // warm
    for (std::uint64_t i = 0; i < n; ++i) compcntr_destroy_comp_cntr(v[i]);
    opcount_c_create_destroy(cdev, v, n);
  } else if (op == "wait_poll" || op == "wait_poll_timeout") {
    const int ms = static_cast<int>(n);  // N is the waker's delay in ms for the poll ops
    poll_until_set([&] { op == "wait_poll" ? opcount_wait_poll(c) : opcount_wait_poll_timeout(c); },
                   [&] { c.add(1); }, ms);
  } else if (op == "sleep") {  // N: the waker's delay in ms (the waiter is asleep by then)
    poll_until_set([&] { opcount_sleep_wait(c); }, [&] { opcount_sleep_wake(c); },
                   static_cast<int>(n));
  } else if (op == "atomic_sleep") {
    poll_until_set([&] { opcount_atomic_wait(a); }, [&] { opcount_atomic_wake(a); },
                   static_cast<int>(n));
  } else if (op == "futex_sleep") {
    poll_until_set([&] { opcount_futex_wait(a); }, [&] { opcount_futex_wake(a); },
                   static_cast<int>(n));
  } else if (op == "raw_poll" || op == "raw_poll_timeout") {
    const int ms = static_cast<int>(n);
    poll_until_set([&] { op == "raw_poll" ? opcount_raw_poll(a) : opcount_raw_poll_timeout(a); },
                   [&] { a.fetch_add(1); }, ms);
  } else {
    std::fprintf(stderr, "unknown op '%s' (OP: %s)\n", op.c_str(), ops);
    return 2;
  }
  if (failures != 0)
    return std::fprintf(stderr, "%llu C calls failed\n", static_cast<unsigned long long>(failures)),
           1;
  if (cc) compcntr_destroy_comp_cntr(cc);
  if (cdev) compcntr_close_device(cdev);
  std::printf("%s x %llu done (value %llu)\n", op.c_str(), static_cast<unsigned long long>(n),
              static_cast<unsigned long long>(c.value() + a.load()));
  return 0;
}
