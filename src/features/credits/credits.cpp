// compcntr::credit_tracker (modules/features/credits.cppm): the waiting half of acquire,
// release, outstanding and flush (creation and adoption: create.cpp). Built from the public
// counter and wait API only.
//
// Model, per peer p (all counts unsigned 64-bit, compared modulo the counter's range):
//   issued(p)      credits ever taken by acquire() (a lock-free atomic of the tracker)
//   completed(p)   value + errors of p's counter: network completions, successful or not, and
//                  credits given back by release()
//   outstanding(p) = issued(p) - completed(p), never more than credits_per_peer.
//   acquire(p, n) takes n credits when outstanding + n <= credits_per_peer, atomically (one CAS
//   on issued), else waits (compcntr::wait_since on the completion count that would admit it:
//   spin, back off, sleep in the kernel; drive functions run meanwhile).
//   release(p, n) gives back n credits whose operations will never complete into the counter
//   (cancelled before they were posted): it adds n to the counter (a "software completion"),
//   refusing more than is outstanding.
// Errors: an operation that completed in error is over and returns its credit (the counter's
// error count is part of completed). A call that has to wait reports the failure: it returns
// io_error when the error count changes during the call (sampled by its first check) and the
// change did not satisfy it; a call satisfied at the same check succeeds (compcntr::wait's rule).
// Inconsistent counts (completed ahead of issued: the counter was set(), counts completions that
// took no credit, or a credit was both released and completed) are value_too_large (EOVERFLOW).
//
// Wrap-around: every difference is taken modulo max_value + 1 of the device (2^64 on the
// software device), so issued and completed may wrap freely: outstanding stays exact while it
// is below half that range (credits_per_peer is limited to a quarter of it). Waiters wait on a
// distance modulo that range (detail::wait_slot with a wait_goal: "n more than the value I
// saw"), so a counter that wraps on the way, or jumps over the goal and wraps, still wakes them.
//
// Memory ordering:
//   * acquire success: the counter is read with acquire loads before the CAS on issued, so
//     everything the thread that completed (or released) the operations whose credits were
//     reused wrote before its completion is visible after acquire returns. The CAS itself is
//     relaxed: admission depends only on the modification order of `issued` (the CAS reads its
//     latest value) and on the counter being monotone (an earlier read is never larger than its
//     value at the CAS), so it needs no fence; acquire loads keep the read of issued after the
//     read of the counter (a stale completed count only makes admission stricter, and a stale
//     issued count fails the CAS).
//   * release: a per-peer spin lock (acquire exchange / release store) serialises releasers of
//     one peer, so two releases can never both pass the "outstanding >= n" check; the counter
//     add inside is a seq_cst RMW (it wakes sleeping acquirers, compcntr:slot). Acquirers,
//     completions and flushes never take this lock.
//   * flush success: acquire (acquire loads of the counter, or compcntr::wait_since).
module;
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <system_error>
module compcntr;

namespace compcntr {
namespace {

using clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The caller's timeout over several waits. The clock is read only when a wait is needed.
class budget {
 public:
  // Timeouts above 2^40 ms (~34.8 years) are forever, as in compcntr::wait: now + ms in
  // steady_clock's int64 nanoseconds would overflow for the largest ones.
  explicit budget(std::int64_t ms) noexcept : ms_(ms > (std::int64_t{1} << 40) ? -1 : ms) {}
  // The timeout of the next wait: what is left of the caller's, rounded up to whole ms so the
  // call never times out early (wait_forever if it has none).
  milliseconds next() noexcept {
    if (ms_ < 0) return wait_forever;
    if (ms_ == 0) return milliseconds(0);
    const clock::time_point now = clock::now();
    if (!started_) {
      started_ = true;
      end_ = now + milliseconds(ms_);
    }
    return now >= end_ ? milliseconds(0) : std::chrono::ceil<milliseconds>(end_ - now);
  }
  // Has the caller's timeout passed? (Asked after a wait timed out.)
  bool expired() const noexcept { return ms_ == 0 || (ms_ > 0 && clock::now() >= end_); }

 private:
  std::int64_t ms_;
  bool started_ = false;
  clock::time_point end_{};
};

// One wait of acquire() or flush() for `need` more completions after the completion count
// `value` (the error count staying `err0`), counted modulo the counter's range: a counter that
// wraps past max_value on the way (or jumps over the goal and wraps, a multi-credit release)
// still ends the wait. Sets `last` when the caller's timeout has passed: the check after this
// wait is then the last one. Returns invalid_argument only for an empty counter.
std::errc wait_for_more(counter_view c, std::uint64_t value, std::uint64_t need, std::uint64_t err0,
                        std::uint64_t mask, budget& b, const wait_options& o, bool& last) noexcept {
  detail::slot* s = c.native_slot();
  if (s == nullptr) [[unlikely]]
    return detail::wait_on_empty();
  const std::errc w = detail::wait_slot(
      *s, {.base = value, .need = need, .mask = mask, .errors_seen = err0, .sample_errors = false},
      b.next().count(), o);
  last = w == std::errc::timed_out && b.expired();
  return w;
}

std::errc inconsistent(const char* call, std::uint32_t peer, std::uint64_t issued,
                       std::uint64_t completed) noexcept {
  return std::errc(detail::fail(EOVERFLOW,
                                "%s: peer %u's counts are inconsistent: %llu "
                                "credits completed but %llu issued (was its counter set() or "
                                "fed completions that took no credit?)",
                                call, peer, static_cast<unsigned long long>(completed),
                                static_cast<unsigned long long>(issued))
                       .value());
}

} // namespace

std::errc credit_tracker::bad_request(const char* call, std::uint32_t peer,
                                      std::uint64_t n) const noexcept {
  using detail::fail;
  if (npeers_ == 0) return std::errc(fail(EINVAL, "%s: the credit tracker is empty", call).value());
  if (peer >= npeers_)
    return std::errc(
        fail(EINVAL, "%s: peer %u out of range (%u peers)", call, peer, npeers_).value());
  if (n == 0) return std::errc(fail(EINVAL, "%s: n must be > 0", call).value());
  return std::errc(fail(EINVAL,
                        "%s: n = %llu is more than credits_per_peer (%llu, peer %u's "
                        "window): it could never be satisfied",
                        call, static_cast<unsigned long long>(n),
                        static_cast<unsigned long long>(peers_[peer]->window), peer)
                       .value());
}

std::errc credit_tracker::acquire_slow(std::uint32_t peer, std::uint64_t n, detail::credit_check r,
                                       std::int64_t timeout_ms, const wait_options& opts) noexcept {
  detail::credit_peer& p = *peers_[peer];
  // The first check's error count is the call's baseline: a change after it is "during the
  // call". wait_since() compares with it directly, so no change can slip between a check here
  // and the wait's own start.
  const std::uint64_t err0 = r.errors;
  budget b(timeout_ms);
  bool errors_changed = false;
  for (bool last = false;;) {
    if (r.result == detail::credit_check::taken) return std::errc{};
    if (r.result == detail::credit_check::inconsistent)
      return inconsistent("acquire", peer, (r.value + r.errors + r.outstanding) & mask_,
                          (r.value + r.errors) & mask_);
    // Not admitted at this check: an error change seen since the call began is reported
    // (by this check, or by the wait's, even if set_error() restored the count since).
    if (errors_changed || r.errors != err0) return std::errc::io_error;
    if (last) return std::errc::timed_out;
    // n more credits are free once `need` more operations completed, errors staying err0.
    const std::uint64_t need = r.outstanding + n - p.window; // >= 1, no overflow
    const std::errc w = wait_for_more(p.c, r.value, need, err0, mask_, b, opts, last);
    if (w == std::errc::invalid_argument) return w; // an empty counter (misuse)
    errors_changed = w == std::errc::io_error;
    r = try_take(p, n);
  }
}

std::errc credit_tracker::release(std::uint32_t peer, std::uint64_t n) noexcept {
  if (peer >= npeers_ || n - 1 >= peers_[peer]->window) [[unlikely]]
    return bad_request("release", peer, n);
  detail::credit_peer& p = *peers_[peer];
  // Short critical section (three loads and the add): releasers of one peer only.
  // Memory ordering: acquire exchange / release store, so each releaser sees the previous
  // one's add.
  for (backoff b; p.release_lock.exchange(1, std::memory_order_acquire) != 0;) b.snooze();
  const std::uint64_t v = p.c.value();
  const std::uint64_t e = p.c.errors();
  const std::uint64_t i = p.issued.load(std::memory_order_relaxed);
  const std::uint64_t out = (i - v - e) & mask_;
  std::errc r{};
  if (out > (mask_ >> 1)) {
    r = inconsistent("release", peer, i & mask_, (v + e) & mask_);
  } else if (n > out) {
    r = std::errc(detail::fail(EINVAL,
                               "release: %llu credit(s) of peer %u but only %llu "
                               "outstanding",
                               static_cast<unsigned long long>(n), peer,
                               static_cast<unsigned long long>(out))
                      .value());
  } else {
    p.c.add(n);
  }
  p.release_lock.store(0, std::memory_order_release);
  return r;
}

std::errc credit_tracker::outstanding(std::uint32_t peer, std::uint64_t& out) const noexcept {
  if (peer >= npeers_) [[unlikely]]
    return bad_request("outstanding", peer, 1);
  const counter_view c = peers_[peer]->c;
  const std::uint64_t done = c.value() + c.errors();
  const std::uint64_t i = peers_[peer]->issued.load(std::memory_order_relaxed);
  const std::uint64_t o = (i - done) & mask_;
  if (o > (mask_ >> 1)) return inconsistent("outstanding", peer, i & mask_, done & mask_);
  out = o;
  return std::errc{};
}

std::errc credit_tracker::flush(std::uint32_t peer, std::chrono::milliseconds timeout,
                                const wait_options& opts) noexcept {
  if (peer >= npeers_) [[unlikely]]
    return bad_request("flush", peer, 1);
  detail::credit_peer& p = *peers_[peer];
  // Every acquire that happened before this call is in this load (coherence).
  const std::uint64_t target = p.issued.load(std::memory_order_relaxed);
  std::uint64_t v = p.c.value();
  std::uint64_t e = p.c.errors();
  const std::uint64_t err0 = e;
  budget b(timeout.count());
  bool errors_changed = false;
  for (bool last = false;;) {
    // Operations still to complete, counted from the target; "negative" (above half the range)
    // means completed went past it (operations issued after the call completed too).
    const std::uint64_t rem = (target - v - e) & mask_;
    if (rem == 0 || rem > (mask_ >> 1)) return std::errc{};
    if (errors_changed || e != err0) return std::errc::io_error;
    if (last) return std::errc::timed_out;
    const std::errc w = wait_for_more(p.c, v, rem, err0, mask_, b, opts, last);
    if (w == std::errc::invalid_argument) return w;
    errors_changed = w == std::errc::io_error;
    v = p.c.value();
    e = p.c.errors();
  }
}

} // namespace compcntr
