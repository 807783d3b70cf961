// The provider-counter mirror engine, shared by the public mirror (mirror.cpp) and the hook
// provider's counters (hook/hook_cntr.cpp). Header-only, so the hook module and
// libcompcntr-fabric share an algorithm, not an ABI.
//
// Purpose: a provider's fid_cntr (util counters, sockets counters, ...) is the only complete
// record of what a provider counts. The mirror reads it (fi_cntr_read / fi_cntr_readerr, which
// run the provider's progress) and adds what it gained since the previous read to a compcntr
// counter, completion and error values separately.
//
// Guarantees:
//   * never counted twice, never lost: every unit the provider counter gains is added to the
//     compcntr counter exactly once, whatever number of threads pull concurrently;
//   * wrap-safe: the gain is computed modulo 2^bits (bits = the provider counter's width: 64
//     for util counters, 32 for the sockets provider, whose counters are int32), and a value
//     read before another thread's newer one is recognised as stale (a gain of at least half
//     the range in one step is impossible);
//   * a concurrent resync (the hook's fi_cntr_set/add through the mirror) is never mixed with a
//     value read before it.
//
// The algorithm. `last` is the provider value already added. pull():
//   g = gen (acquire); v = provider read;
//   if v == last: done (nothing new; no lock -- the polling fast path is two loads);
//   lock; if gen != g: unlock, done (a resync ran since v was read: v may predate it; the next
//   pull counts what is new); d = (v - last) mod 2^bits; if d == 0 or d >= 2^(bits-1): stale,
//   done; last = v; add d to the compcntr counter (under the lock, so a resync that follows
//   sees it); unlock.
// Skipping is always safe: `last` is unchanged, so the next pull counts the same units.
// A resync (hook set/add) runs under the lock with gen odd, and leaves gen even and larger.
//
// Memory ordering: gen is loaded with acquire before the provider read and re-checked under the
// mutex (which orders it after the resync's final release increment). last is only written
// under the mutex, after the compcntr addition it stands for (release); the fast path loads it
// with acquire, so "nothing new" is answered only once the addition is visible. A stale load
// there only makes the pull take the lock and decide under it.
#ifndef COMPCNTR_FABRIC_MIRROR_CORE_HPP
#define COMPCNTR_FABRIC_MIRROR_CORE_HPP

#include <compcntr/compcntr.h>

#include <rdma/fi_domain.h>

#include <atomic>
#include <cstdint>
#include <mutex>

namespace compcntr_fabric {

class mirror_core {
 public:
  /// The provider counter `pc` mirrored into `cc`. `bits`: the width of the provider's values
  /// (64, or 32 for providers whose counters are 32-bit). The current provider values are the
  /// baseline: only later gains are added.
  void init(fid_cntr* pc, compcntr_comp_cntr* cc, unsigned bits) noexcept {
    pc_ = pc;
    cc_ = cc;
    mask_ = bits >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << bits) - 1;
    last_.store(fi_cntr_read(pc) & mask_, std::memory_order_relaxed);
    last_err_.store(fi_cntr_readerr(pc) & mask_, std::memory_order_relaxed);
  }
  /// As init, with the baselines given (no provider read).
  void init_at(fid_cntr* pc, compcntr_comp_cntr* cc, unsigned bits, std::uint64_t v,
               std::uint64_t e) noexcept {
    pc_ = pc;
    cc_ = cc;
    mask_ = bits >= 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << bits) - 1;
    last_.store(v & mask_, std::memory_order_relaxed);
    last_err_.store(e & mask_, std::memory_order_relaxed);
  }

  fid_cntr* provider() const noexcept { return pc_; }
  compcntr_comp_cntr* counter() const noexcept { return cc_; }

  /// Reads the provider's completion value (driving its progress) and adds the gain to cc.
  /// Returns true if something was added.
  bool pull_comp() noexcept { return pull(last_, false); }
  /// The same for the error value.
  bool pull_err() noexcept { return pull(last_err_, true); }

  /// Runs `f()` (which changes the provider counter and cc together, e.g. fi_cntr_set on both)
  /// exclusive of every pull's commit; `f` returns the new provider baselines through its
  /// arguments: f(std::uint64_t& last, std::uint64_t& last_err) with the current ones in them.
  template <class F>
  int resync(F&& f) noexcept {
    std::lock_guard lk(mu_);
    gen_.fetch_add(1, std::memory_order_relaxed);  // odd: a resync is running
    std::uint64_t l = last_.load(std::memory_order_relaxed),
                  le = last_err_.load(std::memory_order_relaxed);
    const int r = f(l, le);
    last_.store(l & mask_, std::memory_order_relaxed);
    last_err_.store(le & mask_, std::memory_order_relaxed);
    gen_.fetch_add(1, std::memory_order_release);  // even again, and different from before
    return r;
  }

  std::uint64_t mask() const noexcept { return mask_; }
  /// The provider completion value already added (masked to the provider's width).
  std::uint64_t last_value() const noexcept { return last_.load(std::memory_order_acquire); }

 private:
  // The fast path (inline: a polling read is a generation load, the provider read and one
  // compare) and the commit (out of line: it takes the mutex).
  inline bool pull(std::atomic<std::uint64_t>& last, bool err) noexcept {
    const std::uint64_t g = gen_.load(std::memory_order_acquire);
    if (g & 1) return false;  // a resync is running: it decides the values
    const std::uint64_t v = (err ? fi_cntr_readerr(pc_) : fi_cntr_read(pc_)) & mask_;
    if (__builtin_expect(v == last.load(std::memory_order_acquire), 1)) return false;
    return commit(last, err, g, v);
  }

  [[gnu::noinline]] bool commit(std::atomic<std::uint64_t>& last, bool err, std::uint64_t g,
                                std::uint64_t v) noexcept {
    std::lock_guard lk(mu_);
    if (gen_.load(std::memory_order_relaxed) != g) return false;
    const std::uint64_t d = (v - last.load(std::memory_order_relaxed)) & mask_;
    if (d == 0 || d > (mask_ >> 1)) return false;  // stale: another thread added a newer value
    // Add first, then publish: a fast-path reader that sees `last == v` (acquire) also sees
    // the addition, so its pull returns with cc including v.
    if (err)
      compcntr_inc_err_comp_cntr(cc_, d);
    else
      compcntr_inc_comp_cntr(cc_, d);
    last.store(v, std::memory_order_release);
    return true;
  }

  fid_cntr* pc_ = nullptr;
  compcntr_comp_cntr* cc_ = nullptr;
  std::uint64_t mask_ = ~std::uint64_t{0};
  std::atomic<std::uint64_t> gen_{0};
  std::atomic<std::uint64_t> last_{0}, last_err_{0};
  std::mutex mu_;
};

} // namespace compcntr_fabric

#endif
