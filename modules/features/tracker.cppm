// compcntr:tracker -- completion tracking for one-sided traffic (RMA flush, shmem_quiet).
//
// Purpose: a runtime issues one-sided operations (RMA writes, puts, atomics) whose completions
// land in a compcntr counter (attached to a QP, bound to a libfabric bridge or mirrored from a
// provider counter). It must be able to wait until everything it issued has completed:
// MPICH's RMA flush, OpenSHMEM's shmem_quiet, an MPI_Win_flush_all. The completion_tracker keeps
// the issued count in software beside the counter and waits on the counter for the difference.
// Reference: docs/tracker.md.
//
// Model (all counts unsigned 64-bit, compared modulo the counter range, max_value + 1):
//   baseline       value + errors of the counter when the tracker was created
//   issued         operations issue()d since creation (one atomic of the tracker)
//   completed      value + errors - baseline: operations accounted for, successful or not
//   quiet()        reads issued once (its target), then waits until completed reaches it.
//                  Operations issued after that read are not waited for, so concurrent issuers
//                  cannot starve it. A count, not a set: while others issue, a later
//                  operation's completion can stand in for an earlier one (docs/tracker.md);
//                  with no concurrent issuer, everything issued before the call is complete.
// Errors: an operation that failed is accounted for (it will never complete otherwise), so it
// does not keep quiet waiting. The failure is reported once: a quiet that finds everything
// accounted for returns io_error (EIO) if the counter's error value grew since the value the
// previous reporting quiet saw (the tracker's creation at first), and records the new value;
// any number of concurrent quiets report each growth exactly once between them. A quiet that
// times out reports nothing (the next one that finishes does).
//
// Requirements: the counter is a WRS counter of `dev` (one completion or error per operation),
// whose values only grow (no set()/set_error() while the tracker lives; a decrease of either
// would make completed move backwards). Completions of operations issued through the tracker
// should be its only source, or quiet returns early by what else was counted. The tracker keeps
// the counter alive (a counted reference: the owner's destroy(ec) is EBUSY while it lives).
// Any number of threads may issue and quiet at once.
// Guarantees: quiet never returns success or io_error before completed >= its target; issue
// never blocks (one relaxed fetch_add); a refused call changes nothing.
//
// Wrap-around: issued and the counter may wrap freely; quiet is exact while fewer than half the
// counter range (2^63 on the software device) operations are outstanding. issue(n) refuses n
// above a quarter of the range.
//
// Memory ordering:
//   * issue: relaxed fetch_add. A quiet that happens-after the issue reads it (coherence); the
//     issuing thread's writes are published by the operation itself, not by the tracker.
//   * quiet success and io_error: acquire. The counter is read with acquire loads (and waited on
//     with compcntr::wait_since), so everything the thread that counted the completions wrote
//     before counting them is visible after quiet returns.
//   * error reporting: acq_rel CAS on the reported error value (one winner per growth).
//
// Example (shmem_quiet over a libfabric endpoint whose provider counter is mirrored in `done`):
//     std::error_code ec;
//     auto tr = compcntr::completion_tracker::create(dev, done, ec);
//     tr.issue(1);
//     fi_write(ep, buf, len, desc, peer, raddr, key, nullptr);   // its completion counts in `done`
//     ...
//     if (tr.quiet(compcntr::wait_forever, {.drive = drive_network}) == std::errc::io_error)
//       report("a put failed");                                   // all issued puts are over
module;
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <system_error>
#include <utility>
export module compcntr:tracker;
import :cache_padded;
import :types;
import :counter;
import :counter_ref;
import :device;
import :wait;

namespace compcntr::detail {

/// The shared state of one completion_tracker. Internal. issued is written by issuers, the
/// other fields are fixed or written only by reporting quiets: two blocks, so issuers never
/// pull the line quiet reads.
struct tracker_state {
  cache_padded<std::atomic<std::uint64_t>> issued; ///< operations issued since creation
  cache_padded<std::atomic<std::uint64_t>> reported; ///< error value the last report saw
  counter_ref ref; ///< keeps the counter alive
  std::uint64_t base = 0; ///< value + errors at creation
  std::uint64_t mask = 0; ///< the counter range - 1 (2^k - 1)
};

} // namespace compcntr::detail

export namespace compcntr {

/// Issued vs completed operations over one completion counter (see the file comment).
/// Move-only; an empty tracker (default-constructed or moved from) answers invalid_argument.
class completion_tracker {
 public:
  completion_tracker() noexcept = default;
  completion_tracker(completion_tracker&&) noexcept = default;
  completion_tracker& operator=(completion_tracker&&) noexcept = default;
  completion_tracker(const completion_tracker&) = delete;
  completion_tracker& operator=(const completion_tracker&) = delete;
  /// Drops the tracker's reference on the counter (if its owner destroyed it meanwhile, this
  /// finishes the destruction).
  ~completion_tracker() = default;

  /// A tracker over `completions`, a live WRS counter created by `dev`; its baseline is the
  /// counter's value + errors now. On failure an empty tracker and ec: EINVAL (empty device or
  /// counter, a counter of another device, a BYTES counter), ENOTSUP (the device's max_value + 1
  /// is not a power of two), ESTALE/ENOMEM as device::resolve.
  static completion_tracker create(const device& dev, counter_view completions,
                                   std::error_code& ec) noexcept;

  inline explicit operator bool() const noexcept { return s_ != nullptr; }

  /// `n` more operations issued (0: nothing). invalid_argument (nothing changes) for an empty
  /// tracker or n above a quarter of the counter range. Memory ordering: relaxed.
  inline std::errc issue(std::uint64_t n = 1) noexcept {
    if (s_ == nullptr || n > (s_->mask >> 2) + 1) [[unlikely]]
      return bad_issue(n); // > 2^62
    s_->issued->fetch_add(n, std::memory_order_relaxed);
    return std::errc{};
  }

  /// Operations issued since creation (modulo 2^64). Precondition: not empty. Relaxed.
  inline std::uint64_t issued() const noexcept {
    return s_->issued->load(std::memory_order_relaxed);
  }
  /// Operations accounted for since creation: value + errors - baseline, modulo the counter
  /// range. Precondition: not empty. Acquire loads.
  inline std::uint64_t completed() const noexcept {
    return (s_->ref.value() + s_->ref.errors() - s_->base) & s_->mask;
  }
  /// issued - completed modulo the counter range: what is still in flight while the counts are
  /// consistent; above half the range when completions were counted before their issue().
  inline std::uint64_t outstanding() const noexcept {
    const std::uint64_t done = completed(); // before issued: a stale issued only shrinks it
    return (issued() - done) & s_->mask;
  }
  /// Error value the last reporting quiet recorded (the counter's at creation before any).
  inline std::uint64_t errors_reported() const noexcept {
    return s_->reported->load(std::memory_order_acquire);
  }

  /// Waits until every operation issued before the call is accounted for (completed >= issued
  /// as read at the call). std::errc{} then, or io_error if the counter's error value grew
  /// since the last report (once per growth, file comment); timed_out when `timeout` passes
  /// first (timeout 0: check once, after one drive call if a drive function is set and the
  /// first check failed; < 0: forever). invalid_argument for an empty tracker. Options as
  /// compcntr::wait (a drive function that drives the network). Memory ordering: acquire.
  inline std::errc quiet(std::chrono::milliseconds timeout,
                         const wait_options& opts = {}) noexcept {
    if (s_ == nullptr) [[unlikely]]
      return bad_issue(0);
    const std::uint64_t target = s_->issued->load(std::memory_order_relaxed);
    const std::uint64_t v = s_->ref.value();
    const std::uint64_t e = s_->ref.errors();
    const std::uint64_t rem = (target - (v + e - s_->base)) & s_->mask;
    if (rem == 0 || rem > (s_->mask >> 1)) [[likely]] {
      if (e == s_->reported->load(std::memory_order_relaxed)) [[likely]]
        return std::errc{};
      return report(e);
    }
    return quiet_slow(target, v, e, timeout.count(), opts);
  }

  /// The counter the tracker waits on (the one given to create). Precondition: not empty.
  inline const counter_ref& completions() const noexcept { return s_->ref; }

 private:
  std::errc bad_issue(std::uint64_t n) const noexcept;
  std::errc report(std::uint64_t errors) noexcept;
  std::errc quiet_slow(std::uint64_t target, std::uint64_t v, std::uint64_t e,
                       std::int64_t timeout_ms, const wait_options& opts) noexcept;

  std::unique_ptr<detail::tracker_state> s_;
};

} // namespace compcntr
