// compcntr:credits -- per-peer credit flow control over completion counters (MPI runtimes).
//
// Purpose: at most `credits_per_peer` operations in flight to each peer (receive buffers the
// peer posted, send-queue slots, an RMA window); that window may differ per peer (create/adopt
// with a span of windows; `credits_per_peer` below then means the peer's window). The tracker counts what was issued; the network
// counts what came back into each peer's completion counter (attach it to the QP, or bind it to
// a libfabric CQ bridge). The MPICH pattern as one object. Per peer: outstanding = issued -
// (value + errors of its counter), modulo the counter's range; acquire(p, n) takes n credits in
// one CAS when outstanding + n <= credits_per_peer, else waits (drive function, backoff, sleep);
// release(p, n) gives back credits that will never complete; flush(p) waits for everything
// issued (MPI_Win_flush). Design notes: src/features/credits/credits.cpp; docs/credits.md.
//
// Requirements: WRS counters, changed only by completions of credited operations and release()
// (no set(), no add()); the tracker outlives every call on it; any number of threads.
// Guarantees: no over-subscription, whatever the races: the acquire that brings issued(p) to I
// returns only after I - credits_per_peer completions or releases of p that happened-before
// it. A refused call changes nothing. An error completion returns its credit; a waiting call
// reports io_error when the error count changes without admitting it. Inconsistent counts
// (completed ahead of issued) are value_too_large. Wrap-around is exact (credits_per_peer is at
// most a quarter of the counter range).
// Memory ordering: acquire success is acquire (the counter is read with acquire loads before a
// relaxed CAS on issued: admission depends only on the modification order of issued and on the
// counter being monotone); release takes a per-peer spin lock and adds with a seq_cst RMW
// (waking acquirers); flush success is acquire.
//
// Example (see examples/credits.c for the C version over loopback QPs):
//     auto tr = compcntr::credit_tracker::create(dev, npeers, 64, ec);
//     qp_to[p].attach(tr.peer_counter(p), compcntr::attach_op::send, ec);   // in RESET
//     if (tr.acquire(p, 1, compcntr::wait_forever, {.drive = poll_net}) == std::errc{})
//       qp_to[p].post_send(...);                 // its completion returns the credit
//     tr.flush(p, compcntr::wait_forever);       // MPI_Win_flush: all of p's operations done
module;
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <system_error>
#include <utility>
export module compcntr:credits;
import :cache_padded;
import :types;
import :counter;
import :device;
import :wait;

namespace compcntr::detail {

/// One peer's state. Internal. One per 128-byte block: threads working for different peers
/// never share a line.
struct credit_peer {
  /// Credits ever taken by acquire(), modulo 2^64. Written only by the acquire CAS.
  std::atomic<std::uint64_t> issued{0};
  /// Serialises release() calls for this peer (0 free, 1 held).
  std::atomic<std::uint32_t> release_lock{0};
  /// The peer's completion counter (owned by the tracker, or by whoever adopted it).
  counter_view c;
  /// The peer's window: at most this many credits outstanding. Fixed at creation; on the
  /// peer's own block, so the admission fast path loads nothing more than with one window.
  std::uint64_t window = 0;
};

/// What one admission check found. Internal.
struct credit_check {
  enum result_t : std::uint8_t { taken, short_of_credits, inconsistent };
  result_t result;
  std::uint64_t value; ///< completion count read
  std::uint64_t errors; ///< error count read
  std::uint64_t outstanding; ///< issued - completed, modulo the counter's range
};

/// Checks a tracker's shape for `call` (messages name it): dev non-empty, 0 < npeers < 2^32,
/// 0 < credits_per_peer <= a quarter of the counter range, max_value + 1 a power of two.
/// Returns the device's max_value (the modulus mask), or 0 and ec (EINVAL, ENOTSUP). Internal
/// (credit_tracker::create/adopt and the C layer). Defined in src/features/credits/create.cpp.
std::uint64_t check_credit_shape(const char* call, const device& dev, std::size_t npeers,
                                 std::uint64_t credits_per_peer, std::error_code& ec) noexcept;
/// check_credit_shape for per-peer windows: every windows[i] in (0, a quarter of the range];
/// the message names the first bad peer. npeers = windows.size().
std::uint64_t check_credit_windows(const char* call, const device& dev,
                                   std::span<const std::uint64_t> windows,
                                   std::error_code& ec) noexcept;

} // namespace compcntr::detail

export namespace compcntr {

/// Per-peer credits backed by completion counters (see the file comment). Move-only; an empty
/// tracker (default-constructed or moved from) answers every call with invalid_argument.
class credit_tracker {
 public:
  credit_tracker() noexcept = default;
  inline credit_tracker(credit_tracker&& o) noexcept
      : peers_(std::move(o.peers_)),
        owned_(std::move(o.owned_)),
        npeers_(std::exchange(o.npeers_, 0)),
        credits_(std::exchange(o.credits_, 0)),
        mask_(std::exchange(o.mask_, 0)) {}
  inline credit_tracker& operator=(credit_tracker&& o) noexcept {
    if (this != &o) {
      peers_ = std::move(o.peers_);
      owned_ = std::move(o.owned_);
      npeers_ = std::exchange(o.npeers_, 0);
      credits_ = std::exchange(o.credits_, 0);
      mask_ = std::exchange(o.mask_, 0);
    }
    return *this;
  }
  credit_tracker(const credit_tracker&) = delete;
  credit_tracker& operator=(const credit_tracker&) = delete;
  /// Destroys the counters it created (a counter still attached to a QP lives on, unread,
  /// until that QP is destroyed: compcntr::counter::reset()).
  ~credit_tracker() = default;

  /// A tracker with `npeers` peers of `credits_per_peer` credits each, and one new WRS counter
  /// per peer on `dev`. On failure an empty tracker and ec: EINVAL (empty device, npeers == 0,
  /// credits_per_peer == 0 or above a quarter of the device's counter range), ENOTSUP (the
  /// device's max_value + 1 is not a power of two), ENOMEM (no room for the counters).
  static credit_tracker create(device& dev, std::uint32_t npeers, std::uint64_t credits_per_peer,
                               std::error_code& ec) noexcept;
  /// create() with a window per peer: peer i may have windows[i] credits outstanding (npeers =
  /// windows.size(); e.g. the receive buffers each peer posted for this rank). Errors as
  /// create(); EINVAL names the first peer whose window is 0 or above a quarter of the range.
  static credit_tracker create(device& dev, std::span<const std::uint64_t> windows,
                               std::error_code& ec) noexcept;
  /// A tracker over counters the caller owns (created by `dev`, WRS, alive as long as the
  /// tracker; peer i is counters[i]). issued starts at each counter's value + errors: what the
  /// counters counted before is not outstanding, so adopt quiescent counters. EINVAL also for
  /// an empty list, a null or empty counter, a counter of another device, a BYTES counter, the
  /// same counter for two peers (its completions would return both peers' credits) or more
  /// than 2^32 - 1 counters.
  static credit_tracker adopt(const device& dev, std::span<const counter_view> counters,
                              std::uint64_t credits_per_peer, std::error_code& ec) noexcept;
  /// adopt() over pointers (a null pointer is EINVAL).
  static credit_tracker adopt(const device& dev, std::span<counter* const> counters,
                              std::uint64_t credits_per_peer, std::error_code& ec) noexcept;
  /// adopt() with a window per peer (windows.size() == counters.size(), else EINVAL).
  static credit_tracker adopt(const device& dev, std::span<const counter_view> counters,
                              std::span<const std::uint64_t> windows, std::error_code& ec) noexcept;
  static credit_tracker adopt(const device& dev, std::span<counter* const> counters,
                              std::span<const std::uint64_t> windows, std::error_code& ec) noexcept;

  inline explicit operator bool() const noexcept { return npeers_ != 0; }
  inline std::uint32_t peers() const noexcept { return npeers_; }
  /// The largest window of any peer (every peer's, for a tracker made with one credits_per_peer).
  inline std::uint64_t credits_per_peer() const noexcept { return credits_; }
  /// The window of `peer`: at most this many of its credits are outstanding. Precondition:
  /// peer < peers().
  inline std::uint64_t window(std::uint32_t peer) const noexcept { return peers_[peer]->window; }

  /// Takes `n` credits of `peer`: std::errc{} at once if outstanding + n <= credits_per_peer,
  /// else waits for completions (options as compcntr::wait). timed_out when `timeout` passes
  /// (timeout 0: check once, after one drive call if a drive function is set; < 0: forever);
  /// io_error when the peer's error count changes during the call without admitting it;
  /// value_too_large when the peer's counts are inconsistent; invalid_argument for peer >=
  /// peers(), n == 0 or n > window(peer). Only success takes credits.
  inline std::errc acquire(std::uint32_t peer, std::uint64_t n, std::chrono::milliseconds timeout,
                           const wait_options& opts = {}) noexcept {
    if (peer >= npeers_) [[unlikely]]
      return bad_request("acquire", peer, n);
    detail::credit_peer& p = *peers_[peer];
    // n - 1 >= window catches n == 0 (wraps to UINT64_MAX) and n > window in one compare.
    if (n - 1 >= p.window) [[unlikely]]
      return bad_request("acquire", peer, n);
    const detail::credit_check r = try_take(p, n);
    if (r.result == detail::credit_check::taken) [[likely]]
      return std::errc{};
    return acquire_slow(peer, n, r, timeout.count(), opts);
  }
  /// acquire(peer, n, 0ms): one check (which also drives the device's progress sources).
  inline std::errc try_acquire(std::uint32_t peer, std::uint64_t n) noexcept {
    return acquire(peer, n, std::chrono::milliseconds(0));
  }

  /// Gives back `n` credits of `peer` whose operations will never complete into its counter,
  /// by adding n to the counter (a software completion: it wakes waiting acquirers).
  /// invalid_argument (and nothing changes) for n > outstanding, n == 0, n > window(peer)
  /// or peer >= peers(); value_too_large for inconsistent counts.
  std::errc release(std::uint32_t peer, std::uint64_t n) noexcept;

  /// Waits until every credit of `peer` taken before the call has come back (completed >=
  /// issued as read at the call): MPI_Win_flush. Errors, timeout and options as acquire().
  std::errc flush(std::uint32_t peer, std::chrono::milliseconds timeout,
                  const wait_options& opts = {}) noexcept;

  /// The peer's completion counter: attach it to the QP (SEND) or bridge whose completions
  /// return this peer's credits. Precondition: peer < peers().
  inline counter_view peer_counter(std::uint32_t peer) const noexcept { return peers_[peer]->c; }

  /// Credits taken so far (modulo 2^64). Precondition: peer < peers(). Memory ordering: relaxed.
  inline std::uint64_t issued(std::uint32_t peer) const noexcept {
    return peers_[peer]->issued.load(std::memory_order_relaxed);
  }
  /// value + errors of the peer's counter (modulo its range). Precondition: peer < peers().
  inline std::uint64_t completed(std::uint32_t peer) const noexcept {
    const counter_view c = peers_[peer]->c;
    return (c.value() + c.errors()) & mask_;
  }
  /// issued - completed modulo the counter's range: <= window(peer) while the counts are
  /// consistent, above half the range when they are not. Precondition: peer < peers().
  inline std::uint64_t outstanding(std::uint32_t peer) const noexcept {
    const counter_view c = peers_[peer]->c;
    const std::uint64_t done = c.value() + c.errors(); // before issued (acquire loads)
    return (peers_[peer]->issued.load(std::memory_order_relaxed) - done) & mask_;
  }
  /// Checked outstanding(): std::errc{} and `out`, value_too_large (inconsistent counts, `out`
  /// unchanged) or invalid_argument (peer >= peers()).
  std::errc outstanding(std::uint32_t peer, std::uint64_t& out) const noexcept;

 private:
  /// One admission check for `n` credits: reads the counter first, then CASes issued.
  /// Memory ordering: file comment.
  inline detail::credit_check try_take(detail::credit_peer& p, std::uint64_t n) noexcept {
    const std::uint64_t v = p.c.value(); // acquire
    const std::uint64_t e = p.c.errors(); // acquire: the load of issued stays after both
    std::uint64_t i = p.issued.load(std::memory_order_relaxed);
    for (;;) {
      const std::uint64_t out = (i - v - e) & mask_;
      if (out > (mask_ >> 1)) [[unlikely]]
        return {detail::credit_check::inconsistent, v, e, out};
      // out <= mask/2 and n <= (mask + 1)/4: no overflow.
      if (out + n > p.window) return {detail::credit_check::short_of_credits, v, e, out};
      if (p.issued.compare_exchange_weak(i, i + n, std::memory_order_relaxed,
                                         std::memory_order_relaxed))
        return {detail::credit_check::taken, v, e, out + n};
    }
  }

  static credit_tracker make(device& dev, std::uint32_t npeers, const std::uint64_t* windows,
                             std::uint64_t credits, std::uint64_t mask,
                             std::error_code& ec) noexcept;
  std::errc bad_request(const char* call, std::uint32_t peer, std::uint64_t n) const noexcept;
  std::errc acquire_slow(std::uint32_t peer, std::uint64_t n, detail::credit_check first,
                         std::int64_t timeout_ms, const wait_options& opts) noexcept;

  std::unique_ptr<cache_padded<detail::credit_peer>[]> peers_;
  std::unique_ptr<counter[]> owned_; ///< the counters create() made; null after adopt()
  std::uint32_t npeers_ = 0;
  std::uint64_t credits_ = 0; ///< the largest window
  std::uint64_t mask_ = 0; ///< the counters' max_value (2^k - 1): the modulus of every count
};

} // namespace compcntr
