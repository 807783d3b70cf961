// compcntr::poll_any: poll_slots, one wait over a list of slots (Portals 4 PtlCTPoll), and the
// public poll_any overloads that map their counter lists onto it. One futex word per call,
// registered in every slot's extension block (src/core/wait/ext.cpp). The phase engine it runs:
// the internal partition compcntr:wait_impl (src/core/wait/wait_impl.cppm); single-counter
// waits: wait.cpp. See modules/core/wait.cppm for the contract.
module;
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <system_error>
#include "core/wait/futex.hpp"
module compcntr;
import :wait_impl;

namespace compcntr::detail {
namespace {

// Where each thread's next poll_any scan starts: just after the index it last returned.
thread_local std::size_t poll_cursor = 0;

// Per-counter state of one poll_any call. Up to small_poll of them live on the stack.
struct poll_entry {
  slot* s = nullptr;
  std::uint64_t err0 = 0;
  poll_link link;
};
constexpr std::size_t small_poll = 32;

} // namespace

poll_result poll_slots(const slot_list& list, const std::uint64_t* thresholds,
                       std::int64_t timeout_ms, const wait_options& o) noexcept {
  const std::size_t n = list.size;
  if (n == 0) return {std::errc(fail(EINVAL, "poll: no counters to poll (n == 0)").value()), 0};
  if (thresholds == nullptr)
    return {std::errc(fail(EINVAL, "poll: thresholds is NULL").value()), 0};
  bool any_hw = false;
  for (std::size_t i = 0; i < n; ++i) {
    const slot* s = list.at(list.base, i);
    if (s == nullptr)
      return {std::errc(fail(EINVAL, "poll: counter %zu is NULL or empty", i).value()), 0};
    // A shared counter's updates in other processes do not reach this process's poll
    // registrations: sleep in slices (1 ms), as for a hardware-backed counter.
    any_hw |= hardware_backed(*s) || !s->dev->progress_sources().empty() || is_shared(*s);
  }
  const std::size_t start = poll_cursor % n;

  // Something already ready: no allocation, no error samples, no clock.
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t i = start + k < n ? start + k : start + k - n;
    if (list.at(list.base, i)->load_value() >= thresholds[i]) {
      poll_cursor = i + 1;
      return {std::errc{}, i};
    }
  }

  poll_entry small[small_poll];
  std::unique_ptr<poll_entry[]> big;
  poll_entry* e = small;
  if (n > small_poll) {
    big.reset(new (std::nothrow) poll_entry[n]);
    if (!big)
      return {std::errc(fail(ENOMEM, "poll: out of memory for %zu counters' state", n).value()), 0};
    e = big.get();
  }
  for (std::size_t i = 0; i < n; ++i) {
    e[i].s = list.at(list.base, i);
    if (e[i].s->hw != nullptr && e[i].s->hw->refresh != nullptr) e[i].s->hw->refresh(*e[i].s);
    e[i].err0 = e[i].s->errors_seq_cst();
  }

  auto test = [&]() noexcept -> outcome {
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = start + k < n ? start + k : start + k - n;
      const slot& s = *e[i].s;
      if (s.value_seq_cst() >= thresholds[i]) return {true, std::errc{}, i};
      if (s.errors_seq_cst() != e[i].err0) return {true, std::errc::io_error, i};
    }
    return pending;
  };
  auto check = [&]() noexcept -> outcome {
    if (o.drive) o.drive(o.drive_ctx);
    if (any_hw)
      for (std::size_t i = 0; i < n; ++i) {
        // Each device's progress sources once per check (consecutive counters usually share one).
        if (i == 0 || e[i].s->dev != e[i - 1].s->dev) e[i].s->dev->progress();
        if (e[i].s->hw != nullptr && e[i].s->hw->refresh != nullptr) e[i].s->hw->refresh(*e[i].s);
      }
    return test();
  };
  // One futex word for the whole call (w.seq), registered in every slot's extension block:
  // an update of any of them bumps it (compcntr:wait, file comment).
  poll_waiter w;
  auto sleep = [&](nanoseconds rel, nanoseconds slice) noexcept -> outcome {
    const std::uint32_t seq = w.seq.load(std::memory_order_acquire);
    bool all_registered = true;
    for (std::size_t i = 0; i < n; ++i) {
      e[i].link.waiter = &w;
      e[i].link.s = e[i].s;
      all_registered &= register_poller(e[i].link);
    }
    // After registering (see slot_needs_progress): a device that gained progress sources since
    // the call began is driven by check() from now on.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!any_hw)
      for (std::size_t i = 0; i < n && !any_hw; ++i) any_hw = slot_needs_progress(*e[i].s);
    const outcome r = test();
    if (!r.done) {
      // A slot without an extension block (no memory) cannot wake us: poll it in slices.
      if (!all_registered) rel = capped(rel, nanoseconds(default_drive_interval), true);
      rel = sleep_cap(rel, slice, o.drive != nullptr, any_hw);
      // Dekker with notify_ext(): it bumps seq, then loads sleeping; we store sleeping, then
      // load seq. One of the two sees the other, so a bump we miss here comes with a wake.
      w.sleeping.store(1, std::memory_order_seq_cst);
      if (w.seq.load(std::memory_order_seq_cst) == seq) futex::wait(w.seq, seq, rel);
      w.sleeping.store(0, std::memory_order_relaxed);
    }
    for (std::size_t i = 0; i < n; ++i)
      if (e[i].link.linked) unregister_poller(e[i].link);
    return r;
  };
  const outcome r = run_phases(
      timeout_ms, o, check, [&](unsigned k) noexcept { return poll_with(check, k); }, sleep);
  if (r.ec == std::errc{}) poll_cursor = r.index + 1;
  return {r.ec, r.ec == std::errc::timed_out ? 0 : r.index};
}

} // namespace compcntr::detail

namespace compcntr {

namespace {
poll_result length_mismatch(std::size_t counters, std::size_t thresholds) noexcept {
  return {std::errc(detail::fail(EINVAL, "poll_any: %zu counters but %zu thresholds", counters,
                                 thresholds)
                        .value()),
          0};
}
} // namespace

poll_result poll_any(std::span<const counter> counters, std::span<const std::uint64_t> thresholds,
                     std::chrono::milliseconds timeout, const wait_options& opts) noexcept {
  if (counters.size() != thresholds.size())
    return length_mismatch(counters.size(), thresholds.size());
  const detail::slot_list list{counters.data(), counters.size(),
                               [](const void* base, std::size_t i) noexcept -> detail::slot* {
                                 return static_cast<const counter*>(base)[i].native_slot();
                               }};
  return detail::poll_slots(list, thresholds.data(), timeout.count(), opts);
}

poll_result poll_any(std::span<const counter_view> counters,
                     std::span<const std::uint64_t> thresholds, std::chrono::milliseconds timeout,
                     const wait_options& opts) noexcept {
  if (counters.size() != thresholds.size())
    return length_mismatch(counters.size(), thresholds.size());
  const detail::slot_list list{counters.data(), counters.size(),
                               [](const void* base, std::size_t i) noexcept -> detail::slot* {
                                 return static_cast<const counter_view*>(base)[i].native_slot();
                               }};
  return detail::poll_slots(list, thresholds.data(), timeout.count(), opts);
}

poll_result poll_any(std::span<const counter* const> counters,
                     std::span<const std::uint64_t> thresholds, std::chrono::milliseconds timeout,
                     const wait_options& opts) noexcept {
  if (counters.size() != thresholds.size())
    return length_mismatch(counters.size(), thresholds.size());
  const detail::slot_list list{counters.data(), counters.size(),
                               [](const void* base, std::size_t i) noexcept -> detail::slot* {
                                 const counter* c = static_cast<const counter* const*>(base)[i];
                                 return c != nullptr ? c->native_slot() : nullptr;
                               }};
  return detail::poll_slots(list, thresholds.data(), timeout.count(), opts);
}

} // namespace compcntr
