// One fid_cntr served by a compcntr counter: what the fi_cntr adapter (adapter.cpp) and the hook
// provider's counters (hook/hook_cntr.cpp) both are. Header-only, like mirror_core.hpp: the hook
// module and libcompcntr-fabric share the code, not an ABI (nothing here is exported).
//
// Purpose: one home for fi_cntr(3) semantics on a compcntr counter -- the struct fid_cntr
// header, the attributes kept (wait object, the fd FI_GETWAIT hands out), the fi_ops_cntr table
// (read, readerr, add, set, adderr, seterr, wait), the wait-object mapping (FI_WAIT_YIELD and
// the blocking objects), fi_trywait's arm-then-read check, FI_GETWAIT / FI_GETWAITOBJ and the
// errno -> -FI_E* map. A fix to any of them lands once, for both counters.
//
// What a counter class supplies (a struct D deriving from cntr_base, CRTP): only how it drives
// progress and how it updates, as static members of D:
//   static void drive(D&, bool err)              progress before a read of the completion
//                                                (err false) or error value (adapter: run the
//                                                bridges bound to the counter; hook: pull the
//                                                provider's counter into cc through the mirror)
//   static int  update(D&, update_op, uint64_t)  fi_cntr_add/set/adderr/seterr: 0 or -FI_E*
//                                                (adapter: cc alone; hook: the provider's
//                                                counter first, then cc, under the mirror's
//                                                resync)
//   static int  wait(D&, uint64_t thr, int ms)   fi_cntr_wait (both end in cntr_base::wait_cc
//                                                with the attributes of their wait object)
//   static void after(D&)                        after every ops call but wait (hook:
//                                                ofi_compcntr's deferred work; adapter: nothing)
//   static void on_readerr(D&, uint64_t)         optional: the error value fi_cntr_readerr
//                                                returns (hook: sockets' "errors since the last
//                                                readerr")
//
// Guarantees: the fid_cntr is the first member of a standard-layout base, so fid_cntr*,
// cntr_base* and (by static_cast) D* convert; compcntr_fi_cntr_comp_cntr reads `cc` through the
// base for every registered class (cntr_classes.h), never past struct fid_cntr of a foreign one.
//
// Memory ordering: reads are compcntr's acquire loads of cc; updates its RMWs (semantics.md);
// trywait arms cc's eventfd first (a seq_cst RMW + fence) and reads after, so an update after
// the arm makes the fd readable and one before it is in the values read. The trywait snapshot
// (seen_value / seen_errors) is relaxed: one thread per counter uses trywait (fi_poll(3)), the
// atomics only keep concurrent misuse defined.
//
// Example (the adapter):
//   struct adapter : cntr_base {
//     static void drive(adapter& a, bool) { a.run_bridges(); }
//     static int update(adapter& a, update_op op, uint64_t v) { return a.update_cc(op, v); }
//     static int wait(adapter& a, uint64_t t, int ms) { return a.wait_cc(t, ms, attrs(a)); }
//     static void after(adapter&) {}
//   };
//   a->init_fid(&my_fid_ops, &cntr_ops<adapter>::table, context);
#ifndef COMPCNTR_FABRIC_CNTR_BASE_HPP
#define COMPCNTR_FABRIC_CNTR_BASE_HPP

#include <compcntr/compcntr.h>
#include <compcntr/wait.h>

#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>
#include <sched.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <type_traits>

namespace compcntr_fabric {

/// The integer stored in a libfabric enum field. C callers may store any int there (a C enum
/// holds any value of its type); loading a value outside a C++ enum's range is undefined, so
/// enum fields of the application's structures are read as their integer.
template <class E>
inline int raw_enum(const E& e) noexcept {
  static_assert(sizeof(E) == sizeof(int), "libfabric enums are int-sized");
  int v;
  __builtin_memcpy(&v, &e, sizeof v);
  return v;
}

/// A compcntr errno (positive) as libfabric's -FI_E* (the same numbers: FI_EINVAL == EINVAL,
/// ...), except ENOTSUP (-FI_EOPNOTSUPP) and 0, which a failed call never leaves (-FI_EOTHER).
constexpr int fi_error(int err) noexcept {
  return err == ENOTSUP ? -FI_EOPNOTSUPP : err == 0 ? -FI_EOTHER : -err;
}

/// fi_cntr_wait's answer for compcntr_wait_comp_cntr_ex's, as fi_cntr(3) and libfabric's util
/// counters give it: 0; ETIMEDOUT -> -FI_ETIMEDOUT; EIO (the error value changed during the
/// wait) -> -FI_EAVAIL; anything else -errno.
constexpr int wait_result(int r) noexcept {
  switch (r) {
    case 0: return 0;
    case ETIMEDOUT: return -FI_ETIMEDOUT;
    case EIO: return -FI_EAVAIL;
    default: return -r;
  }
}

/// The four updates of fi_ops_cntr.
enum class update_op { add, set, adderr, seterr };

struct cntr_base {
  fid_cntr cntr{};                   ///< first member: fid_cntr* and cntr_base* convert
  compcntr_comp_cntr* cc = nullptr;  ///< the compcntr counter that serves it
  int wait_obj = FI_WAIT_NONE;       ///< as the application asked (an int: C may store any)
  int fd = -1;                       ///< FI_WAIT_FD: cc's pollable fd (owned by cc)
  /// fi_trywait's snapshot: the values the last trywait returned on (see trywait).
  std::atomic<std::uint64_t> seen_value{0}, seen_errors{0};

  /// Fills the fid header: class FI_CLASS_CNTR, the application's context, the two tables.
  void init_fid(fi_ops* fid_ops, fi_ops_cntr* ops, void* context) noexcept {
    cntr.fid.fclass = FI_CLASS_CNTR;
    cntr.fid.context = context;
    cntr.fid.ops = fid_ops;
    cntr.ops = ops;
  }

  std::uint64_t value() const noexcept {
    std::uint64_t v = 0;
    compcntr_read_comp_cntr(cc, &v);
    return v;
  }
  std::uint64_t errors() const noexcept {
    std::uint64_t v = 0;
    compcntr_read_err_comp_cntr(cc, &v);
    return v;
  }

  /// An update of cc alone: 0 or -FI_E*.
  int update_cc(update_op op, std::uint64_t v) noexcept {
    switch (op) {
      case update_op::add: return -compcntr_inc_comp_cntr(cc, v);
      case update_op::set: return -compcntr_set_comp_cntr(cc, v);
      case update_op::adderr: return -compcntr_inc_err_comp_cntr(cc, v);
      case update_op::seterr: return -compcntr_set_err_comp_cntr(cc, v);
    }
    return -FI_EINVAL;
  }

  /// compcntr's wait on cc with `wa`, answered as fi_cntr_wait.
  int wait_cc(std::uint64_t threshold, int timeout, const compcntr_wait_attr& wa) noexcept {
    return wait_result(compcntr_wait_comp_cntr_ex(cc, threshold, timeout, &wa));
  }

  /// FI_WAIT_YIELD ("wait without a wait object but instead yield on every wait"): never sleep
  /// in the kernel; `progress(ctx)` runs before every check, then the CPU is yielded.
  template <void (*Progress)(void*)>
  static compcntr_wait_attr yield_attr(void* ctx) noexcept {
    compcntr_wait_attr wa{};
    wa.comp_mask = COMPCNTR_WAIT_ATTR_SPIN;
    wa.spin_ns = COMPCNTR_WAIT_SPIN_FOREVER;
    wa.progress = [](void* c) noexcept {
      Progress(c);
      sched_yield();
    };
    wa.progress_ctx = ctx;
    return wa;
  }

  /// fi_trywait's check of this counter (FI_WAIT_FD counters only; the caller checks): arms cc's
  /// fd, then `pull()` (the class's progress), then reads both values and compares them with
  /// those of the previous trywait. 0: nothing changed, the caller may sleep on the fd;
  /// -FI_EAGAIN: a value changed (or `news`: the class knows of an update the values may not
  /// show yet) -- read it first; another -FI_E*: the arm failed (compcntr's errno, its message
  /// in compcntr_last_error_message()).
  template <class Pull>
  int trywait(Pull&& pull, bool news = false) noexcept {
    if (const int err = compcntr_comp_cntr_arm_fd(cc)) return fi_error(err);
    pull();
    const std::uint64_t v = value(), e = errors();
    const bool changed = seen_value.exchange(v, std::memory_order_relaxed) != v;
    const bool err_changed = seen_errors.exchange(e, std::memory_order_relaxed) != e;
    return changed || err_changed || news ? -FI_EAGAIN : 0;
  }

  /// FI_GETWAIT of an FI_WAIT_FD counter: hands out `give` (the adapter: cc's eventfd; the hook:
  /// its epoll set of cc's fd and the provider's wait set). Returns true with *rc set when it
  /// answered; false for every other command and for a counter without an fd to give, which the
  /// class answers (the adapter: -FI_ENODATA, FI_GETWAITOBJ; the hook: the provider).
  bool control(int command, void* arg, int give, int* rc) const noexcept {
    if (command != FI_GETWAIT || wait_obj != FI_WAIT_FD || give < 0) return false;
    if (arg == nullptr) {
      *rc = -FI_EINVAL;
    } else {
      *static_cast<int*>(arg) = give;
      *rc = 0;
    }
    return true;
  }
};
static_assert(std::is_standard_layout_v<cntr_base>, "fid_cntr* and cntr_base* must convert");
static_assert(offsetof(cntr_base, cntr) == 0, "fid_cntr must be the base's first member");

inline cntr_base* base_of(fid_cntr* c) noexcept { return reinterpret_cast<cntr_base*>(c); }
inline cntr_base* base_of(fid* f) noexcept { return reinterpret_cast<cntr_base*>(f); }
/// The counter of class D behind `c` (the caller knows it is one: its ops table says so).
template <class D>
inline D* of(fid_cntr* c) noexcept {
  return static_cast<D*>(base_of(c));
}
template <class D>
inline D* of(fid* f) noexcept {
  return static_cast<D*>(base_of(f));
}

/// The compcntr counter of a counter of any class built on cntr_base (the class registry's get).
inline compcntr_comp_cntr* base_cc(fid_cntr* c) { return base_of(c)->cc; }

/// The fi_ops_cntr table of class D (see the file comment for what D supplies). read/readerr
/// drive, then read cc; add/set/adderr/seterr are D's update; wait is D's; every call ends in
/// D::after.
template <class D>
struct cntr_ops {
  static uint64_t read(fid_cntr* c) {
    D& d = *of<D>(c);
    D::drive(d, false);
    D::after(d);
    return d.value();
  }
  static uint64_t readerr(fid_cntr* c) {
    D& d = *of<D>(c);
    D::drive(d, true);
    D::after(d);
    const std::uint64_t e = d.errors();
    if constexpr (requires { D::on_readerr(d, e); }) D::on_readerr(d, e);
    return e;
  }
  template <update_op Op>
  static int update(fid_cntr* c, uint64_t v) {
    D& d = *of<D>(c);
    const int r = D::update(d, Op, v);
    D::after(d);
    return r;
  }
  static int wait(fid_cntr* c, uint64_t threshold, int timeout) {
    return D::wait(*of<D>(c), threshold, timeout);
  }
  static inline fi_ops_cntr table = {
      .size = sizeof(fi_ops_cntr),
      .read = read,
      .readerr = readerr,
      .add = update<update_op::add>,
      .set = update<update_op::set>,
      .wait = wait,
      .adderr = update<update_op::adderr>,
      .seterr = update<update_op::seterr>,
  };
};

} // namespace compcntr_fabric

#endif
