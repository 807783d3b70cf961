// compcntr::completion_tracker (import compcntr;): baseline, issue/quiet arithmetic, timeouts
// (0, finite, forever), exact EIO-once semantics (also among concurrent quiets), wrap-around,
// drive functions, counters fed by real loopback RDMA writes, bad input, the counter kept alive,
// and issuers racing with quiet (run under ThreadSanitizer in CI). The C API is tested in
// tests/c_api/tracker_c_api_test.cpp.
#include <doctest/doctest.h>

#include <sys/syscall.h>
#include <unistd.h>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "blocked.hpp"
#include "wait_util.hpp"

import compcntr;

#include "support.hpp"

using test_support::make_counter;
using test_support::open_soft;

using namespace std::chrono_literals;
using compcntr::completion_tracker;
using std::errc;

namespace {

std::string msg() { return std::string(compcntr::last_error_message()); }
pid_t this_tid() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

struct fixture {
  compcntr::device dev = open_soft();
  compcntr::counter c = make_counter(dev);
  completion_tracker tr;
  fixture() { make(); }
  void make() {
    std::error_code ec;
    tr = completion_tracker::create(dev, c, ec);
    REQUIRE_FALSE(ec);
    REQUIRE(tr);
  }
};

// Runs `f` in a thread that records its tid first; join() returns f's result.
struct waiter {
  std::atomic<pid_t> tid{0};
  std::atomic<int> rc{-1};
  std::atomic<std::uint64_t> completed_at_return{0};
  std::thread t;
  template <class F>
  waiter(F f, const completion_tracker& tr)
      : t([this, f, &tr] {
          tid = this_tid();
          const errc r = f();
          completed_at_return = tr.completed();
          rc = static_cast<int>(r);
        }) {}
  bool blocked() { return eventually_blocked(tid); }
  int join() {
    t.join();
    return rc.load();
  }
};

compcntr::wait_options sleep_at_once() { return compcntr::wait_options{.spin = 0ns}; }

} // namespace

TEST_CASE("tracker: the baseline is the counter's value + errors at creation") {
  auto dev = open_soft();
  auto c = make_counter(dev);
  c.add(5);
  c.add_error(2);
  std::error_code ec;
  auto tr = completion_tracker::create(dev, c, ec);
  REQUIRE_FALSE(ec);
  CHECK(tr.issued() == 0);
  CHECK(tr.completed() == 0);
  CHECK(tr.outstanding() == 0);
  CHECK(tr.errors_reported() == 2);
  // Errors counted before the tracker existed are not reported; nothing issued: done at once.
  CHECK(tr.quiet(0ms) == errc{});
  CHECK(tr.quiet(compcntr::wait_forever) == errc{});
  c.add(1);
  CHECK(tr.completed() == 1);
  CHECK(&tr.completions() != nullptr);
  CHECK(tr.completions().value() == 6);
}

TEST_CASE("tracker: quiet waits for exactly what was issued, completions and errors alike") {
  fixture f;
  auto& tr = f.tr;
  CHECK(tr.issue(3) == errc{});
  CHECK(tr.issued() == 3);
  CHECK(tr.outstanding() == 3);
  CHECK(tr.quiet(0ms) == errc::timed_out);
  f.c.add(2);
  CHECK(tr.outstanding() == 1);
  CHECK(tr.quiet(0ms) == errc::timed_out);
  f.c.add(1);
  CHECK(tr.quiet(0ms) == errc{});
  CHECK(tr.completed() == 3);
  CHECK(tr.outstanding() == 0);
  // issue() with the default n and n == 0.
  CHECK(tr.issue() == errc{});
  CHECK(tr.issue(0) == errc{});
  CHECK(tr.issued() == 4);
  CHECK(tr.quiet(0ms) == errc::timed_out);
  f.c.add(1);
  CHECK(tr.quiet(0ms) == errc{});
}

TEST_CASE("tracker: bad input is EINVAL, names its cause and changes nothing") {
  auto dev = open_soft();
  auto other = open_soft();
  auto c = make_counter(dev);
  auto bytes = make_counter(dev, compcntr::counter_type::bytes);
  auto foreign = make_counter(other);
  std::error_code ec;

  auto t = completion_tracker::create(compcntr::device{}, c, ec);
  CHECK(ec == std::errc::invalid_argument);
  CHECK_FALSE(t);
  CHECK(msg().find("device is empty") != std::string::npos);
  compcntr::counter empty;
  t = completion_tracker::create(dev, empty, ec);
  CHECK(ec == std::errc::invalid_argument);
  CHECK(msg().find("counter is empty") != std::string::npos);
  t = completion_tracker::create(dev, foreign, ec);
  CHECK(ec == std::errc::invalid_argument);
  CHECK(msg().find("another device") != std::string::npos);
  t = completion_tracker::create(dev, bytes, ec);
  CHECK(ec == std::errc::invalid_argument);
  CHECK(msg().find("counts bytes") != std::string::npos);
  CHECK_FALSE(t);
  // The refused creations hold nothing: the counters can be destroyed.
  foreign.destroy(ec);
  CHECK_FALSE(ec);
  bytes.destroy(ec);
  CHECK_FALSE(ec);

  // An empty tracker answers invalid_argument.
  CHECK(t.issue(1) == errc::invalid_argument);
  CHECK(msg().find("tracker is empty") != std::string::npos);
  CHECK(t.quiet(0ms) == errc::invalid_argument);
  CHECK(t.quiet(compcntr::wait_forever) == errc::invalid_argument);

  t = completion_tracker::create(dev, c, ec);
  REQUIRE_FALSE(ec);
  const std::uint64_t limit = (UINT64_MAX >> 2) + 1;  // a quarter of the range, 2^62
  CHECK(t.issue(limit + 1) == errc::invalid_argument);
  CHECK(msg().find("quarter of the counter range") != std::string::npos);
  CHECK(t.issue(UINT64_MAX) == errc::invalid_argument);
  CHECK(t.issued() == 0);  // nothing changed
  CHECK(t.issue(limit) == errc{});
  CHECK(t.issued() == limit);

  // Moving leaves the source empty.
  completion_tracker moved = std::move(t);
  CHECK(moved);
  CHECK_FALSE(t);
  CHECK(t.issue(1) == errc::invalid_argument);
  CHECK(moved.issued() == limit);
}

TEST_CASE("tracker: the counter is kept alive; its owner's destroy is EBUSY meanwhile") {
  auto dev = open_soft();
  auto c = make_counter(dev);
  std::error_code ec;
  {
    auto tr = completion_tracker::create(dev, c, ec);
    REQUIRE_FALSE(ec);
    c.destroy(ec);
    CHECK(ec == std::errc::device_or_resource_busy);
    CHECK(msg().find("completion tracker") != std::string::npos);
    REQUIRE(c);           // still usable
    tr.issue(1);
    c.add(1);
    CHECK(tr.quiet(0ms) == errc{});
  }
  c.destroy(ec);          // the tracker is gone: destroy works
  CHECK_FALSE(ec);

  // The owner drops the counter (RAII) while the tracker lives: the tracker's reference keeps
  // the slot, and the device cannot be closed until the tracker goes.
  auto c2 = make_counter(dev);
  auto tr = completion_tracker::create(dev, c2, ec);
  REQUIRE_FALSE(ec);
  tr.issue(2);
  tr.completions().native_slot()->add(2);  // completions still land in it (as a QP would add)
  c2.reset();
  CHECK(tr.quiet(0ms) == errc{});
  CHECK(tr.completed() == 2);
  dev.close(ec);
  CHECK(ec == std::errc::device_or_resource_busy);
  tr = completion_tracker{};
  dev.close(ec);
  CHECK_FALSE(ec);
}

TEST_CASE("tracker: EIO exactly once per error growth, only once everything is accounted for") {
  fixture f;
  auto& tr = f.tr;
  tr.issue(3);
  f.c.add_error(1);
  // One failed, two still in flight: not over yet, so no EIO (and nothing is consumed).
  CHECK(tr.quiet(0ms) == errc::timed_out);
  CHECK(tr.quiet(20ms) == errc::timed_out);
  CHECK(tr.errors_reported() == 0);
  f.c.add(2);
  CHECK(tr.quiet(0ms) == errc::io_error);   // everything over; one failed
  CHECK(tr.errors_reported() == 1);
  CHECK(tr.quiet(0ms) == errc{});           // reported once only
  CHECK(tr.quiet(compcntr::wait_forever) == errc{});

  // Failures count as accounted for: two issued, both failed -> done, EIO once.
  tr.issue(2);
  f.c.add_error(2);
  CHECK(tr.completed() == 5);
  CHECK(tr.quiet(compcntr::wait_forever) == errc::io_error);
  CHECK(tr.quiet(0ms) == errc{});
  CHECK(tr.errors_reported() == 3);

  // Two separate growths before one quiet: one report.
  tr.issue(2);
  f.c.add_error(1);
  f.c.add_error(1);
  CHECK(tr.quiet(0ms) == errc::io_error);
  CHECK(tr.quiet(0ms) == errc{});

  // An error with nothing outstanding (completed ahead of issued) is still reported once.
  f.c.add_error(1);
  CHECK(tr.quiet(0ms) == errc::io_error);
  CHECK(tr.quiet(0ms) == errc{});
  CHECK(tr.errors_reported() == 6);
}

TEST_CASE("tracker: a sleeping quiet wakes for completions, not early for an error") {
  fixture f;
  auto& tr = f.tr;
  tr.issue(3);
  waiter w([&] { return tr.quiet(compcntr::wait_forever, sleep_at_once()); }, tr);
  REQUIRE(w.blocked());
  f.c.add_error(1);           // wakes it (error change); 2 still outstanding: it sleeps again
  REQUIRE(test_util::eventually([&] { return w.blocked(); }));
  CHECK(w.rc.load() == -1);
  f.c.add(1);
  REQUIRE(w.blocked());
  CHECK(w.rc.load() == -1);
  f.c.add(1);
  CHECK(w.join() == static_cast<int>(errc::io_error));
  CHECK(w.completed_at_return.load() == 3);

  // Default options (spin, back off, sleep) and a finite timeout.
  tr.issue(2);
  waiter w2([&] { return tr.quiet(60s); }, tr);
  REQUIRE(w2.blocked());
  f.c.add(2);
  CHECK(w2.join() == 0);
  CHECK(w2.completed_at_return.load() == 5);
}

TEST_CASE("tracker: timeouts are never early; timeout 0 checks once") {
  fixture f;
  auto& tr = f.tr;
  tr.issue(1);
  for (auto ms : {1ms, 15ms, 40ms}) {
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(tr.quiet(ms) == errc::timed_out);
    CHECK(std::chrono::steady_clock::now() - t0 >= ms);
  }
  // Sleep-at-once and spin-forever modes time out too.
  auto t0 = std::chrono::steady_clock::now();
  CHECK(tr.quiet(10ms, sleep_at_once()) == errc::timed_out);
  CHECK(std::chrono::steady_clock::now() - t0 >= 10ms);
  t0 = std::chrono::steady_clock::now();
  CHECK(tr.quiet(10ms, {.spin = compcntr::spin_forever}) == errc::timed_out);
  CHECK(std::chrono::steady_clock::now() - t0 >= 10ms);

  // timeout 0 with a drive function: exactly one drive call when the first check fails, and a
  // drive function that completes the operation makes it succeed.
  struct drive_state {
    int calls = 0;
    compcntr::counter* c = nullptr;
    bool complete = false;
  } hs{0, &f.c, false};
  compcntr::wait_options o{.drive =
                               [](void* p) {
                                 auto* s = static_cast<drive_state*>(p);
                                 ++s->calls;
                                 if (s->complete) s->c->add(1);
                               },
                           .drive_ctx = &hs};
  CHECK(tr.quiet(0ms, o) == errc::timed_out);
  CHECK(hs.calls == 1);
  hs.calls = 0;
  hs.complete = true;
  CHECK(tr.quiet(0ms, o) == errc{});
  CHECK(hs.calls == 1);
  hs.calls = 0;
  CHECK(tr.quiet(0ms, o) == errc{});   // done at the first check: no drive call
  CHECK(hs.calls == 0);

  // The largest finite timeouts are forever (no overflow into an immediate timeout).
  tr.issue(1);
  waiter w([&] { return tr.quiet(std::chrono::milliseconds(INT64_MAX)); }, tr);
  REQUIRE(w.blocked());
  f.c.add(1);
  CHECK(w.join() == 0);
}

TEST_CASE("tracker: a drive function alone drives completions (forever)") {
  fixture f;
  auto& tr = f.tr;
  tr.issue(100);
  struct st {
    compcntr::counter* c;
    int calls;
  } s{&f.c, 0};
  compcntr::wait_options o{.spin = 0ns,
                           .drive =
                               [](void* p) {
                                 auto* x = static_cast<st*>(p);
                                 if (++x->calls % 3 == 0) x->c->add(7);
                               },
                           .drive_ctx = &s,
                           .drive_interval = 100us};
  CHECK(tr.quiet(compcntr::wait_forever, o) == errc{});
  CHECK(tr.completed() >= 100);
  CHECK(tr.completed() < 107);
  CHECK(s.calls == 3 * 15);   // 15 x 7 = 105 >= 100 after exactly 45 calls
}

TEST_CASE("tracker: wrap-around of the counter and of issued") {
  auto dev = open_soft();
  auto c = make_counter(dev);
  c.set(UINT64_MAX - 1);      // the tracker starts 2 below the wrap
  c.set_error(UINT64_MAX);
  std::error_code ec;
  auto tr = completion_tracker::create(dev, c, ec);
  REQUIRE_FALSE(ec);
  tr.issue(4);
  waiter w([&] { return tr.quiet(compcntr::wait_forever, sleep_at_once()); }, tr);
  REQUIRE(w.blocked());
  for (int i = 0; i < 3; ++i) c.add(1);   // value wraps through 0
  REQUIRE(w.blocked());
  CHECK(w.rc.load() == -1);
  c.add(1);
  CHECK(w.join() == 0);
  CHECK(c.value() == 2);
  CHECK(tr.completed() == 4);
  // The error value wraps too: UINT64_MAX -> 0 is a growth, reported once.
  tr.issue(1);
  c.add_error(1);
  CHECK(c.errors() == 0);
  CHECK(tr.quiet(0ms) == errc::io_error);
  CHECK(tr.quiet(0ms) == errc{});

  // issued wraps past 2^64: four batches of 2^62 operations completed in four adds.
  const std::uint64_t q = UINT64_MAX >> 2;   // 2^62 - 1
  for (int i = 0; i < 4; ++i) {
    REQUIRE(tr.issue(q) == errc{});
    CHECK(tr.quiet(0ms) == errc::timed_out);
    c.add(q);
    CHECK(tr.quiet(0ms) == errc{});
  }
  CHECK(tr.issued() == 1);                    // 5 + 4 * (2^62 - 1) = 2^64 + 1: wrapped
  tr.issue(5);
  CHECK(tr.quiet(0ms) == errc::timed_out);
  c.add(4);
  CHECK(tr.quiet(0ms) == errc::timed_out);
  c.add(1);
  CHECK(tr.quiet(0ms) == errc{});
  CHECK(tr.outstanding() == 0);
}

TEST_CASE("tracker: RDMA writes over loopback QPs, completed or failed, finished by quiet") {
  auto dev = open_soft();
  std::error_code ec;
  auto done = make_counter(dev);
  auto tr = completion_tracker::create(dev, done, ec);
  REQUIRE_FALSE(ec);
  auto a = dev.create_qp(ec), b = dev.create_qp(ec);
  REQUIRE_FALSE(ec);
  a.attach(done, compcntr::attach_op::rdma_write, ec);
  REQUIRE_FALSE(ec);
  a.modify(compcntr::qp_state::init, ec);
  b.modify(compcntr::qp_state::init, ec);
  a.connect(b, ec);
  REQUIRE_FALSE(ec);
  std::vector<char> src(4096, 'x'), win(4096, '.');
  auto smr = dev.reg_mr(src.data(), src.size(), 0, ec);
  auto wmr = dev.reg_mr(win.data(), win.size(), compcntr::access::all, ec);
  REQUIRE_FALSE(ec);
  const auto raddr = reinterpret_cast<std::uint64_t>(win.data());
  for (int i = 0; i < 64; ++i) {
    REQUIRE(tr.issue(1) == errc{});
    a.post_rdma_write(i, src.data(), 64, smr.lkey(), raddr + 64 * i, wmr.rkey(), ec);
    REQUIRE_FALSE(ec);
  }
  CHECK(tr.quiet(1s) == errc{});
  CHECK(done.value() == 64);
  CHECK(win[4095] == 'x');
  // A write with a wrong rkey completes in error (and moves the QP to ERR, as in verbs):
  // quiet reports it once.
  tr.issue(1);
  a.post_rdma_write(100, src.data(), 8, smr.lkey(), raddr, wmr.rkey() + 1, ec);
  REQUIRE_FALSE(ec);
  CHECK(tr.quiet(1s) == errc::io_error);
  CHECK(done.errors() == 1);
  CHECK(tr.quiet(1s) == errc{});
}

TEST_CASE("tracker: concurrent quiets report each error growth exactly once") {
  fixture f;
  auto& tr = f.tr;
  constexpr int threads = 4;
  constexpr int rounds = 1000;
  std::atomic<int> eio[rounds] = {};
  std::atomic<int> bad{0};
  std::barrier sync(threads + 1);
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&] {
      for (int r = 0; r < rounds; ++r) {
        sync.arrive_and_wait();   // the error of round r is counted
        const errc q = tr.quiet(compcntr::wait_forever);
        if (q == errc::io_error)
          ++eio[r];
        else if (q != errc{})
          ++bad;
        sync.arrive_and_wait();   // round r is over
      }
    });
  for (int r = 0; r < rounds; ++r) {
    tr.issue(2);
    f.c.add(1);
    f.c.add_error(1);
    sync.arrive_and_wait();
    sync.arrive_and_wait();
  }
  for (auto& t : ts) t.join();
  CHECK(bad.load() == 0);
  int wrong = 0;
  for (auto& e : eio) wrong += e.load() != 1;
  CHECK(wrong == 0);
  CHECK(tr.errors_reported() == rounds);
}

TEST_CASE("tracker: stress: issuers racing with quiet; quiet never returns early") {
#if defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
  constexpr int per_issuer = 20000;
#else
  constexpr int per_issuer = 60000;
#endif
#else
  constexpr int per_issuer = 60000;
#endif
  constexpr int issuers = 3;
  fixture f;
  auto& tr = f.tr;
  auto& c = f.c;
  // Each issuer issues, then hands the operation to the completer ("posts" it); posted counts
  // only operations whose issue() happened before, so a quiet that starts after reading
  // posted == P must not return before P operations are accounted for.
  std::atomic<std::uint64_t> posted{0};
  std::atomic<int> issuers_done{0};
  std::atomic<std::uint64_t> errors_made{0};
  std::atomic<int> early{0}, bad{0}, eio{0}, quiets{0};

  std::vector<std::thread> ts;
  for (int t = 0; t < issuers; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < per_issuer; ++i) {
        if (tr.issue(1) != errc{}) ++bad;
        posted.fetch_add(1, std::memory_order_release);
        // Every 2000 operations, let at least one more quiet finish while this issuer is
        // mid-stream, so quiets really overlap issuing (on 2 cores the issuers could
        // otherwise be done before a quieter is scheduled). A guard, not a sleep.
        if (i % 2000 == 1999) {
          const int q0 = quiets.load();
          if (!test_util::eventually([&] { return quiets.load() > q0; })) ++bad;
        }
      }
      ++issuers_done;
    });
  std::thread completer([&] {
    std::uint64_t k = 0;
    for (;;) {
      const std::uint64_t p = posted.load(std::memory_order_acquire);
      if (k == p) {
        if (issuers_done.load() == issuers && posted.load() == k) break;
        std::this_thread::yield();
        continue;
      }
      if (++k % 97 == 0) {
        c.add_error(1);
        errors_made.fetch_add(1);
      } else {
        c.add(1);
      }
    }
  });
  auto quieter = [&](compcntr::wait_options o) {
    while (issuers_done.load() < issuers) {
      const std::uint64_t lower = posted.load(std::memory_order_acquire);
      const errc q = tr.quiet(compcntr::wait_forever, o);
      ++quiets;
      if (q == errc::io_error)
        ++eio;
      else if (q != errc{})
        ++bad;
      if (c.value() + c.errors() < lower) ++early;
    }
  };
  std::thread q1([&] { quieter({}); });
  std::thread q2([&] { quieter(sleep_at_once()); });
  for (auto& t : ts) t.join();
  completer.join();
  q1.join();
  q2.join();

  const std::uint64_t total = std::uint64_t{issuers} * per_issuer;
  CHECK(bad.load() == 0);
  CHECK(early.load() == 0);
  CHECK(quiets.load() > 0);
  CHECK(tr.issued() == total);
  CHECK(c.value() + c.errors() == total);
  CHECK(errors_made.load() == total / 97);
  // Every growth reported at most once; a final quiet reports what is left, then nothing.
  const errc last = tr.quiet(0ms);
  CHECK((last == errc{} || last == errc::io_error));
  CHECK(static_cast<std::uint64_t>(eio.load() + (last == errc::io_error)) <= errors_made.load());
  CHECK(tr.errors_reported() == errors_made.load());
  CHECK(tr.quiet(0ms) == errc{});
}

// Review of issue 11: quiet counts operations, it cannot tell them apart. With another thread
// issuing meanwhile, the completion of an operation issued *after* quiet read its target stands
// in for one issued before it: quiet then returns while that earlier operation is still in
// flight. This pins the documented contract (docs/tracker.md, "what quiet guarantees"): quiet
// returns once as many operations as were issued at its start are accounted for.
TEST_CASE("tracker: quiet counts operations: a later operation's completion stands in") {
  fixture f;
  auto& tr = f.tr;
  REQUIRE(tr.issue(1) == errc{});                      // operation X, slow: never completes here
  waiter w([&] { return tr.quiet(compcntr::wait_forever, sleep_at_once()); }, tr);
  REQUIRE(w.blocked());                                // its target (1) is read
  REQUIRE(tr.issue(1) == errc{});                      // operation Y, issued after quiet began
  f.c.add(1);                                          // Y completes first
  CHECK(w.join() == 0);                                // quiet is over, X still in flight
  CHECK(tr.outstanding() == 1);
  CHECK(tr.quiet(0ms) == errc::timed_out);             // a new quiet waits for both
  f.c.add(1);                                          // X
  CHECK(tr.quiet(0ms) == errc{});
}
