// compcntr::credit_tracker (modules/features/credits.cppm): creation, the waiting half of acquire,
// release and flush. Built from the public counter and wait API only.
//
// Model, per peer p (all counts unsigned 64-bit, compared modulo the counter's range):
//   issued(p)      credits ever taken by acquire() (a lock-free atomic of the tracker)
//   completed(p)   value + errors of p's counter: network completions, successful or not, and
//                  credits given back by release()
//   outstanding(p) = issued(p) - completed(p), never more than credits_per_peer.
//   acquire(p, n) takes n credits when outstanding + n <= credits_per_peer, atomically (one CAS
//   on issued), else waits (compcntr::wait_since on the completion count that would admit it:
//   spin, back off, sleep in the kernel; wait hooks run meanwhile).
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
#include <functional>
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

}  // namespace

std::uint64_t detail::check_credit_shape(const char* call, const device& dev, std::size_t npeers,
                                         std::uint64_t credits, std::error_code& ec) noexcept {
  using detail::fail_into;
  if (!dev) return fail_into(ec, EINVAL, "%s: the device is empty", call), 0;
  if (npeers == 0) return fail_into(ec, EINVAL, "%s: npeers must be > 0", call), 0;
  if (npeers > UINT32_MAX)
    return fail_into(ec, EINVAL, "%s: %zu peers (at most 2^32 - 1)", call, npeers), 0;
  if (credits == 0) return fail_into(ec, EINVAL, "%s: credits_per_peer must be > 0", call), 0;
  const std::uint64_t mask = dev.caps().max_value;
  if (mask == 0 || (mask & (mask + 1)) != 0)
    return fail_into(ec, ENOTSUP,
                     "%s: the device's counters wrap at max_value %llu + 1, not a "
                     "power of two: credit arithmetic needs one",
                     call, static_cast<unsigned long long>(mask)),
           0;
  // A quarter of the range (mask + 1) / 4, e.g. 2^62 on the software device (docs/credits.md):
  // outstanding counts then stay <= a quarter, far from the inconsistent half.
  const std::uint64_t quarter = mask >= 3 ? (mask >> 2) + 1 : 0;
  if (credits > quarter)
    return fail_into(ec, EINVAL,
                     "%s: credits_per_peer %llu is above a quarter of the counter "
                     "range (%llu): outstanding counts could not be told from wrapped ones",
                     call, static_cast<unsigned long long>(credits),
                     static_cast<unsigned long long>(quarter)),
           0;
  return mask;
}

std::uint64_t detail::check_credit_windows(const char* call, const device& dev,
                                           std::span<const std::uint64_t> windows,
                                           std::error_code& ec) noexcept {
  using detail::fail_into;
  // The shape with a window of 1, then every window against the same limits.
  const std::uint64_t mask = check_credit_shape(call, dev, windows.size(), 1, ec);
  if (mask == 0) return 0;
  const std::uint64_t quarter = (mask >> 2) + 1;  // as check_credit_shape: 2^62 on soft
  for (std::size_t i = 0; i < windows.size(); ++i) {
    if (windows[i] == 0)
      return fail_into(ec, EINVAL, "%s: the window of peer %zu is 0 (each must be > 0)", call, i),
             0;
    if (windows[i] > quarter)
      return fail_into(ec, EINVAL,
                       "%s: the window of peer %zu, %llu, is above a quarter of the "
                       "counter range (%llu): outstanding counts could not be told from wrapped "
                       "ones",
                       call, i, static_cast<unsigned long long>(windows[i]),
                       static_cast<unsigned long long>(quarter)),
             0;
  }
  return mask;
}

credit_tracker credit_tracker::create(device& dev, std::uint32_t npeers,
                                      std::uint64_t credits_per_peer,
                                      std::error_code& ec) noexcept {
  const std::uint64_t mask =
      detail::check_credit_shape("credits_create", dev, npeers, credits_per_peer, ec);
  if (mask == 0) return {};
  return make(dev, npeers, nullptr, credits_per_peer, mask, ec);
}

credit_tracker credit_tracker::create(device& dev, std::span<const std::uint64_t> windows,
                                      std::error_code& ec) noexcept {
  const std::uint64_t mask = detail::check_credit_windows("credits_create", dev, windows, ec);
  if (mask == 0) return {};
  return make(dev, static_cast<std::uint32_t>(windows.size()), windows.data(), 0, mask, ec);
}

credit_tracker credit_tracker::make(device& dev, std::uint32_t npeers, const std::uint64_t* windows,
                                    std::uint64_t credits, std::uint64_t mask,
                                    std::error_code& ec) noexcept {
  const counter_caps caps = dev.caps();
  if (npeers > caps.max_counters - std::min(caps.max_counters, dev.live_counters())) {
    detail::fail_into(ec, ENOMEM,
                      "credits_create: %u peers need %u counters, the device has "
                      "room for %u more",
                      npeers, npeers,
                      caps.max_counters - std::min(caps.max_counters, dev.live_counters()));
    return {};
  }
  credit_tracker t;
  t.owned_.reset(new (std::nothrow) counter[npeers]);
  t.peers_.reset(new (std::nothrow) cache_padded<detail::credit_peer>[npeers]);
  if (!t.owned_ || !t.peers_) {
    detail::fail_into(ec, ENOMEM, "credits_create: out of memory for %u peers", npeers);
    return {};
  }
  std::uint64_t largest = 0;
  for (std::uint32_t i = 0; i < npeers; ++i) {
    t.owned_[i] = dev.create_counter(counter_type::wrs, ec);
    if (ec) return {};  // t's destructor destroys the counters made so far
    t.peers_[i]->c = t.owned_[i];
    t.peers_[i]->window = windows != nullptr ? windows[i] : credits;
    largest = std::max(largest, t.peers_[i]->window);
  }
  t.npeers_ = npeers;
  t.credits_ = largest;
  t.mask_ = mask;
  ec.clear();
  return t;
}

namespace {
// adopt() over any list of counters: `at(i)` is the i-th counter's view (empty for a null one);
// windows[i] is peer i's window, or credits_per_peer for every peer when windows is null.
// `largest` gets the largest window.
template <class At>
bool adopt_views(const device& dev, std::size_t n, At at, std::uint64_t credits_per_peer,
                 const std::uint64_t* windows, std::error_code& ec,
                 std::unique_ptr<cache_padded<detail::credit_peer>[]>& peers, std::uint64_t& mask,
                 std::uint64_t& largest) noexcept {
  mask = windows == nullptr
             ? detail::check_credit_shape("credits_adopt", dev, n, credits_per_peer, ec)
             : detail::check_credit_windows("credits_adopt", dev, {windows, n}, ec);
  if (mask == 0) return false;
  for (std::size_t i = 0; i < n; ++i) {
    const counter_view c = at(i);
    if (!c) {
      detail::fail_into(ec, EINVAL, "credits_adopt: counter %zu is null or empty", i);
      return false;
    }
    if (c.native_slot()->owner != dev.core()) {
      // Its range may differ from the mask computed from dev, and waits on it would not drive
      // dev's progress sources: refused, as completion_tracker::create and the C adopt do.
      detail::fail_into(ec, EINVAL, "credits_adopt: counter %zu belongs to another device", i);
      return false;
    }
    if (c.type() != counter_type::wrs) {
      detail::fail_into(ec, EINVAL,
                        "credits_adopt: counter %zu counts bytes: credits need a WRS "
                        "counter (one completion or error per operation)",
                        i);
      return false;
    }
  }
  // One counter per peer: a counter shared by two peers would count the completions of both,
  // so either peer's completions would return the other's credits (over-subscription). Sorted
  // by slot, O(n log n) for the large peer counts of MPI jobs.
  if (n > 1) {
    struct entry {
      const detail::slot* s;
      std::size_t i;
    };
    std::unique_ptr<entry[]> e(new (std::nothrow) entry[n]);
    if (!e) {
      detail::fail_into(ec, ENOMEM, "credits_adopt: out of memory for %zu peers", n);
      return false;
    }
    for (std::size_t i = 0; i < n; ++i) e[i] = {at(i).native_slot(), i};
    std::sort(e.get(), e.get() + n, [](const entry& x, const entry& y) {
      return x.s != y.s ? std::less<const detail::slot*>{}(x.s, y.s) : x.i < y.i;
    });
    for (std::size_t k = 1; k < n; ++k)
      if (e[k].s == e[k - 1].s) {
        detail::fail_into(ec, EINVAL,
                          "credits_adopt: counters %zu and %zu are the same counter "
                          "(each peer needs its own: a shared one would return one peer's "
                          "credits for the other's completions)",
                          e[k - 1].i, e[k].i);
        return false;
      }
  }
  peers.reset(new (std::nothrow) cache_padded<detail::credit_peer>[n]);
  if (!peers) {
    detail::fail_into(ec, ENOMEM, "credits_adopt: out of memory for %zu peers", n);
    return false;
  }
  largest = 0;
  for (std::size_t i = 0; i < n; ++i) {
    detail::credit_peer& p = *peers[i];
    p.c = at(i);
    p.window = windows != nullptr ? windows[i] : credits_per_peer;
    largest = std::max(largest, p.window);
    // What the counter counted so far is not outstanding. Relaxed: the tracker is published
    // to other threads by whatever hands it over (a happens-before edge).
    p.issued.store(p.c.value() + p.c.errors(), std::memory_order_relaxed);
  }
  return true;
}
} // namespace

credit_tracker credit_tracker::adopt(const device& dev, std::span<const counter_view> counters,
                                     std::uint64_t credits_per_peer, std::error_code& ec) noexcept {
  credit_tracker t;
  if (!adopt_views(
          dev, counters.size(), [&](std::size_t i) noexcept { return counters[i]; },
          credits_per_peer, nullptr, ec, t.peers_, t.mask_, t.credits_))
    return {};
  t.npeers_ = static_cast<std::uint32_t>(counters.size());
  ec.clear();
  return t;
}

credit_tracker credit_tracker::adopt(const device& dev, std::span<const counter_view> counters,
                                     std::span<const std::uint64_t> windows,
                                     std::error_code& ec) noexcept {
  if (windows.size() != counters.size()) {
    detail::fail_into(ec, EINVAL, "credits_adopt: %zu counters but %zu windows", counters.size(),
                      windows.size());
    return {};
  }
  credit_tracker t;
  if (!adopt_views(
          dev, counters.size(), [&](std::size_t i) noexcept { return counters[i]; }, 0,
          windows.data(), ec, t.peers_, t.mask_, t.credits_))
    return {};
  t.npeers_ = static_cast<std::uint32_t>(counters.size());
  ec.clear();
  return t;
}

credit_tracker credit_tracker::adopt(const device& dev, std::span<counter* const> counters,
                                     std::span<const std::uint64_t> windows,
                                     std::error_code& ec) noexcept {
  if (windows.size() != counters.size()) {
    detail::fail_into(ec, EINVAL, "credits_adopt: %zu counters but %zu windows", counters.size(),
                      windows.size());
    return {};
  }
  credit_tracker t;
  if (!adopt_views(
          dev, counters.size(),
          [&](std::size_t i) noexcept {
            return counters[i] != nullptr ? counters[i]->view() : counter_view();
          },
          0, windows.data(), ec, t.peers_, t.mask_, t.credits_))
    return {};
  t.npeers_ = static_cast<std::uint32_t>(counters.size());
  ec.clear();
  return t;
}

credit_tracker credit_tracker::adopt(const device& dev, std::span<counter* const> counters,
                                     std::uint64_t credits_per_peer, std::error_code& ec) noexcept {
  credit_tracker t;
  if (!adopt_views(
          dev, counters.size(),
          [&](std::size_t i) noexcept {
            return counters[i] != nullptr ? counters[i]->view() : counter_view();
          },
          credits_per_peer, nullptr, ec, t.peers_, t.mask_, t.credits_))
    return {};
  t.npeers_ = static_cast<std::uint32_t>(counters.size());
  ec.clear();
  return t;
}

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
