// Wrapped ibv_qps under emulation, seen from waiters and from shared CQs: wait and poll_any drive
// the device's progress with no drive function, a waiter asleep before an attach, completions
// left by a destroyed wrapper, one device per CQ, CQs that cannot read qp_num, refused wraps,
// slow drive functions.
module;
#include <doctest/doctest.h>

#include "compcntr_config.h"

#if COMPCNTR_HAVE_VERBS
#include <infiniband/verbs.h>
#endif

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <vector>
// Included before the module declaration for the headers below (they must not be
// included in the module purview).
#include <compcntr/verbs.h>
#include <cstddef>

module compcntr;  // a white-box test: a unit of the module (it reads compcntr::detail)

#include "qp_fixture.hpp"
#if COMPCNTR_HAVE_VERBS
#include "fake_verbs.hpp"
#endif

using namespace qpt;
#if COMPCNTR_HAVE_VERBS
using namespace fake_verbs;
#endif

#if COMPCNTR_HAVE_VERBS

TEST_CASE("wait and poll_any drive the device's progress: no drive needed for a wrapped QP's CQ") {
  using namespace std::chrono_literals;
  auto dev = open_soft();
  fake_cq cq;
  fake_qp vq(31);
  auto w = wrap(dev, &vq, on(cq));
  auto sends = make_counter(dev), recvs = make_counter(dev);
  attach(w, sends, bits(attach_op::send));

  // Already in the CQ when the wait starts: the wait's first check drains it.
  cq.ok(IBV_WC_SEND, 8);
  CHECK(compcntr::wait(sends, 1, 0ms) == std::errc{});
  CHECK(sends.value() == 1);

  // Arrives while the waiter sleeps (forced-sleep mode, no drive function): its bounded sleep
  // slices keep draining the CQ, so the completion ends the wait.
  // The producer pushes only once the waiter is registered as a sleeper on the counter: with
  // nothing driving the CQ the wait would then sleep until its timeout.
  const auto* slot = sends.native_slot();
  std::thread producer([&] {
    while ((slot->watch.load() & compcntr::detail::watch_sleepers_mask) == 0)
      std::this_thread::yield();
    cq.ok(IBV_WC_SEND, 8);
  });
  CHECK(compcntr::wait(sends, 2, 10s, compcntr::wait_options{.spin = 0ns}) == std::errc{});
  producer.join();
  CHECK(sends.value() == 2);

  // poll_any over counters of that device drives it too; an error completion is EIO.
  std::vector<const compcntr::counter*> list{&recvs, &sends};
  const std::uint64_t thresholds[] = {1, 100};
  cq.error(0, 31);
  const auto r = compcntr::poll_any(std::span<const compcntr::counter* const>(list),
                                    std::span<const std::uint64_t>(thresholds), 10s);
  CHECK(r.status == std::errc::io_error);
  CHECK(r.index == 1);
  CHECK(sends.errors() == 1);
}

TEST_CASE("a waiter asleep before its counter was attached to a wrapped QP drives that QP's CQ") {
  using namespace std::chrono_literals;
  auto dev = open_soft();
  auto sends = make_counter(dev), recvs = make_counter(dev);
  const auto* s_slot = sends.native_slot();
  const auto* r_slot = recvs.native_slot();

  std::atomic<int> wait_result{-1};
  std::atomic<long long> wait_ms{-1};
  std::thread waiter([&] {
    const auto t0 = std::chrono::steady_clock::now();
    wait_result =
        static_cast<int>(compcntr::wait(sends, 1, 20s, compcntr::wait_options{.spin = 0ns}));
    wait_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count();
  });
  std::atomic<int> poll_status{-1};
  std::atomic<long long> poll_ms{-1};
  std::thread poller([&] {
    const compcntr::counter* list[] = {&recvs};
    const std::uint64_t thresholds[] = {1};
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = compcntr::poll_any(std::span<const compcntr::counter* const>(list),
                                      std::span<const std::uint64_t>(thresholds), 20s,
                                      compcntr::wait_options{.spin = 0ns});
    poll_status = static_cast<int>(r.status);
    poll_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count();
  });
  // Both asleep in the kernel (registered) before the QP exists.
  while ((s_slot->watch.load() & compcntr::detail::watch_sleepers_mask) == 0 ||
         (r_slot->watch.load() & compcntr::detail::watch_pollers) == 0)
    std::this_thread::yield();

  fake_cq cq;
  fake_qp vq(41);
  auto w = wrap(dev, &vq, on(cq));
  attach(w, sends, bits(attach_op::send));
  attach(w, recvs, bits(attach_op::recv));
  cq.ok(IBV_WC_SEND, 8);
  cq.ok(IBV_WC_RECV, 8, 0, 41);
  waiter.join();
  poller.join();
  CHECK(wait_result.load() == 0);
  CHECK(wait_ms.load() < 10'000);
  CHECK(poll_status.load() == 0);
  CHECK(poll_ms.load() < 10'000);
  CHECK(sends.value() == 1);
  CHECK(recvs.value() == 1);
}

TEST_CASE("completions left in a CQ by a destroyed wrapper are not charged to the next one") {
  auto dev = open_soft();
  fake_cq cq;
  fake_qp a(61), b(62);
  auto wa = wrap(dev, &a, on(cq));
  auto ca = make_counter(dev);
  attach(wa, ca, bits(attach_op::send));
  cq.ok(IBV_WC_SEND, 0, 0, 61);
  cq.ok(IBV_WC_SEND, 0, 0, 61);
  wa.reset();                        // A's two completions were still in the CQ: dropped
  CHECK(ca.value() == 0);
  cq.ok(IBV_WC_SEND, 0, 0, 61);      // one of A's, arriving late
  auto wb = wrap(dev, &b, on(cq));
  auto cb = make_counter(dev);
  attach(wb, cb, bits(attach_op::send));
  cq.ok(IBV_WC_SEND, 0, 0, 62);
  dev.progress();
  CHECK(cb.value() == 1);            // B's own completion only (the late one is routed by qp_num)
  CHECK(ca.value() == 0);
  {
    std::lock_guard g(cq.mu);
    CHECK(cq.pending.empty());
  }
}

TEST_CASE("a CQ is drained by one device, an ibv_qp is wrapped once in the process") {
  auto d1 = open_soft(), d2 = open_soft();
  fake_cq cq, other;
  fake_qp a(71), b(72);
  auto wa = wrap(d1, &a, on(cq));
  std::error_code ec;
  auto again = d2.wrap_verbs_qp(&a, on(other), ec);   // the same ibv_qp on another device
  CHECK(ec == std::errc::device_or_resource_busy);
  CHECK(!again);
  auto wb = d2.wrap_verbs_qp(&b, on(cq), ec);         // another QP on the CQ d1 drains
  CHECK(ec == std::errc::device_or_resource_busy);
  CHECK(!wb);
  CHECK(std::string(compcntr::last_error_message()).find("another compcntr device") !=
        std::string::npos);
  // Refused: nothing registered on d2, d1 unchanged.
  auto ca = make_counter(d1);
  attach(wa, ca, bits(attach_op::send));
  cq.ok(IBV_WC_SEND, 0, 0, 71);
  CHECK(d2.progress() == 0);
  CHECK(d1.progress() == 1);
  CHECK(ca.value() == 1);
  // Once d1 lets go of the CQ, d2 may drain it.
  wa.reset();
  wb = wrap(d2, &b, on(cq));
  auto cb = make_counter(d2);
  attach(wb, cb, bits(attach_op::send));
  cq.ok(IBV_WC_SEND, 0, 0, 72);
  CHECK(d2.progress() == 1);
  CHECK(cb.value() == 1);
}

TEST_CASE("an error on a CQ without the QP's receives is never a RECV error") {
  auto dev = open_soft();
  fake_cq scq, rcq;
  fake_qp vq(81);
  auto w = wrap(dev, &vq, on(scq, &rcq));
  auto r = make_counter(dev), wr = make_counter(dev);
  attach(w, r, bits(attach_op::recv));
  attach(w, wr, bits(attach_op::rdma_write));
  scq.error();                       // a failed RDMA write on the send CQ, no wr_info
  rcq.error();                       // a failed receive on the receive CQ
  dev.progress();
  CHECK(r.errors() == 1);
  CHECK(wr.errors() == 1);
}

TEST_CASE("sharing a CQ that cannot read qp_num is refused and changes nothing") {
  auto dev = open_soft();
  fake_cq cq(true, false);           // created without IBV_WC_EX_WITH_QP_NUM
  fake_qp a(91), b(92);
  auto wa = wrap(dev, &a, on(cq));
  std::error_code ec;
  auto wb = dev.wrap_verbs_qp(&b, on(cq), ec);
  CHECK(ec == std::errc::invalid_argument);
  CHECK(!wb);
  auto ca = make_counter(dev);
  attach(wa, ca, bits(attach_op::send));
  cq.ok(IBV_WC_SEND, 0, 0, 0);
  CHECK(dev.progress() == 1);        // still A's CQ alone: no qp_num read (it would crash)
  CHECK(ca.value() == 1);
  wb = dev.wrap_verbs_qp(&b, on(cq), ec);   // b was not left half-registered
  CHECK(ec == std::errc::invalid_argument);
}

TEST_CASE("a refused wrap leaves the application's other CQ untouched") {
  auto dev = open_soft();
  fake_cq as, x;
  fake_cq y(true, false);            // receive CQ without qp_num: cannot be shared
  fake_qp a(101), b(102);
  auto wa = wrap(dev, &a, on(as, &y));
  x.ok(IBV_WC_SEND, 0, 0, 7);        // an entry of some QP of the application's, on X
  std::error_code ec;
  auto wb = dev.wrap_verbs_qp(&b, on(x, &y), ec);   // X is new, Y would be shared: refused
  CHECK(ec == std::errc::invalid_argument);
  CHECK(!wb);
  std::lock_guard g(x.mu);
  CHECK(x.pending.size() == 1);      // not drained by the refused wrap's cleanup
}

TEST_CASE("a drive function paced slowly does not slow down driving the device's CQs") {
  using namespace std::chrono_literals;
  auto dev = open_soft();
  fake_cq cq;
  fake_qp vq(111);
  auto w = wrap(dev, &vq, on(cq));
  auto c = make_counter(dev);
  attach(w, c, bits(attach_op::send));
  std::atomic<int> rc{-1};
  const auto t0 = std::chrono::steady_clock::now();
  std::thread waiter([&] {
    compcntr::wait_options o{.spin = 0ns};
    o.drive = [](void*) noexcept {};
    o.drive_interval = 10s;  // the drive wants 10 s slices; the CQ still needs 1 ms ones
    rc = static_cast<int>(compcntr::wait(c, 1, 20s, o));
  });
  while ((c.native_slot()->watch.load() & compcntr::detail::watch_sleepers_mask) == 0)
    std::this_thread::yield();
  cq.ok(IBV_WC_SEND, 8);
  waiter.join();
  CHECK(rc.load() == 0);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
}

#endif  // COMPCNTR_HAVE_VERBS
