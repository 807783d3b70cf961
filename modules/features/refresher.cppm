// compcntr:refresher -- keeps the mirrors of device-held counters current with batched
// asynchronous queries.
//
// Purpose: on backends whose device does not write counter values into host memory (mlx5 DEVX
// counters, or a device reachable only through commands), a counter's slot (its mirror: the
// one place readers, waiters and pollers look) must be refreshed from the device. Refreshing
// one counter at a time with a blocking command costs a round trip each; the refresher instead
// keeps one batch of asynchronous queries in flight on its own cmd_comp and, whenever it is
// driven, stores the answers into the mirrors and starts the next batch.
//
// Requirements: counters are watched explicitly (watch/unwatch) and must be device-held
// (slot.hw != nullptr) counters of the refresher's device. refresh() is driven by the caller:
// from a wait's drive function (refresh_drive is one:
// `.drive = &mirror_refresher::refresh_drive`), or from an epoll loop on fd(), which polls
// readable when answers are waiting.
// Guarantees:
//   * refresh() never blocks: if another thread is inside refresh(), watch() or unwatch(), it
//     returns 0 at once. It stores every answer that has arrived, then, once the whole round is
//     answered (and min_interval has passed since it started), issues the next round.
//   * one round at a time, so a mirror never moves back to an older device value; each round
//     is issued as one batch (one queue push, one engine wake-up on the software engine).
//   * a watched counter may be destroyed at any time (destroy is never EBUSY because of the
//     refresher): its slot stays bound until the next round start or unwatch/reset drops it.
//   * an epoll loop that calls refresh() whenever fd() is readable refreshes continuously at
//     device speed; use min_interval (or call refresh() from a timer) to pace it.
// Memory ordering: a mirror update is two seq_cst stores (value, errors) followed by
// slot::notify(), the same protocol as a software update, so waiters on the counter wake.
//
// Example:
//     auto r = compcntr::mirror_refresher::create(dev, ec);
//     r.watch(counter);
//     while (counter.value() < goal) r.refresh();    // or as a wait's drive (refresh_drive)
module;
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <system_error>
#include <utility>
export module compcntr:refresher;
import :slot;
import :types;
import :counter;
import :device;
import :cmd_comp;
import :error;

namespace compcntr::detail {

/// Device -> mirror: replaces both values with what the device reported and wakes watchers.
/// Bypasses slot::hw on purpose: this is not an application set.
inline void store_mirror(slot& s, const counter_values& v) noexcept {
  s.value.store(v.completions, std::memory_order_seq_cst);
  s.errors.store(v.errors, std::memory_order_seq_cst);
  s.notify();
}

} // namespace compcntr::detail

export namespace compcntr {

class mirror_refresher {
 public:
  mirror_refresher() noexcept = default;
  inline mirror_refresher(mirror_refresher&& o) noexcept : st_(std::exchange(o.st_, nullptr)) {}
  inline mirror_refresher& operator=(mirror_refresher&& o) noexcept {
    if (this != &o) {
      reset();
      st_ = std::exchange(o.st_, nullptr);
    }
    return *this;
  }
  mirror_refresher(const mirror_refresher&) = delete;
  mirror_refresher& operator=(const mirror_refresher&) = delete;
  ~mirror_refresher() { reset(); }

  /// A refresher with its own cmd_comp on `dev`. A round starts at most every `min_interval`.
  /// On failure returns an empty object and sets ec (as cmd_completion::create).
  static mirror_refresher create(const device& dev, std::error_code& ec,
                                 std::chrono::nanoseconds min_interval = {}) noexcept;

  inline explicit operator bool() const noexcept { return st_ != nullptr; }

  /// Starts refreshing `c`'s mirror from the next round on. EINVAL: empty counter, counter of
  /// another device, or a software counter (its slot is the value: nothing to refresh);
  /// EEXIST: already watched; ENOMEM.
  std::error_code watch(counter_view c) noexcept;
  /// Stops refreshing `c`; an answer already in flight for it is ignored. ENOENT if not watched.
  std::error_code unwatch(counter_view c) noexcept;

  /// Stores every answer that has arrived into its mirror; starts the next round when this one
  /// is complete. Returns the number of mirrors written. Never blocks.
  std::size_t refresh() noexcept;
  /// refresh() as a wait's drive function (compcntr::wait_options::drive): `refresher` is a
  /// mirror_refresher*.
  inline static void refresh_drive(void* refresher) noexcept {
    static_cast<mirror_refresher*>(refresher)->refresh();
  }
  /// The former names of refresh() and refresh_drive (until 0.2; progress_hook returns the
  /// count).
  [[deprecated("use refresh()")]] inline std::size_t progress() noexcept { return refresh(); }
  [[deprecated("use refresh_drive")]] inline static void refresh_hook(void* refresher) noexcept {
    refresh_drive(refresher);
  }
  [[deprecated("use refresh_drive")]] inline static int progress_hook(void* refresher) noexcept {
    return static_cast<int>(static_cast<mirror_refresher*>(refresher)->refresh());
  }

  /// The cmd_comp fd: readable while answers wait for refresh().
  int fd() const noexcept;
  /// Counters watched now.
  std::size_t watched() const noexcept;
  /// Rounds fully answered so far.
  std::uint64_t rounds() const noexcept;

  /// Stops: in-flight queries are discarded, every watched counter is let go.
  void reset() noexcept;

 private:
  class state;
  inline explicit mirror_refresher(state* s) noexcept : st_(s) {}
  state* st_ = nullptr;
};

} // namespace compcntr
