// The fi_cntr adapter: a real struct fid_cntr served by a compcntr counter (docs/fabric.md).
//
// libfabric's inline wrappers (fi_cntr_read, fi_cntr_add, ..., fi_control, fi_close) call through
// the two ops tables below; each operation is one compcntr C call, plus driving the bridges the
// counter is bound to where libfabric's own counters drive their endpoints (read, readerr, wait).
//
// Error mapping: compcntr's positive errno values become -FI_E* values of the same number
// (FI_EINVAL == EINVAL, ...); a wait's EIO (error count changed) becomes -FI_EAVAIL and its
// ETIMEDOUT -FI_ETIMEDOUT, as fi_cntr_wait(3) and libfabric's util counters return them.
#include <compcntr/fabric.h>

#include <rdma/fi_errno.h>
#include <sched.h>

#include <cerrno>
#include <cstdint>
#include <new>
#include <unordered_map>

#include "cntr_classes.h"
#include "internal.hpp"

namespace compcntr_fabric {
namespace {

std::unordered_map<compcntr_comp_cntr*, adapter*>& registry() noexcept {
  static std::unordered_map<compcntr_comp_cntr*, adapter*> r;
  return r;
}

// ---- the wait (cntr_base.hpp has the ops table: read/readerr drive the bound bridges first, as
// libfabric's counters run their endpoints' progress in fi_cntr_read) ----------------------------

void drive_fn(void* ctx) noexcept { adapter::drive(*static_cast<adapter*>(ctx), false); }
void run_bridges_fn(void* ctx) noexcept { static_cast<adapter*>(ctx)->run_bridges(); }

} // namespace

int adapter::wait(adapter& a, std::uint64_t threshold, int timeout) noexcept {
  compcntr_wait_attr wa{};
  switch (a.wait_obj) {
    case FI_WAIT_NONE:
      // fi_cntr(3): waiting on an FI_WAIT_NONE counter is invalid; libfabric's util counters
      // answer -FI_ENOSYS (fi_no_cntr_wait), so do we.
      fail(ENOSYS, "fi_cntr_wait: the counter was opened with FI_WAIT_NONE");
      return -FI_ENOSYS;
    case FI_WAIT_YIELD:
      // Never sleeps; the bridges are driven before every check, then the CPU is yielded.
      wa = yield_attr<run_bridges_fn>(&a);
      break;
    default:
      // The drive function drives the bridges bound to the counter; it makes the waiter sleep in
      // progress_interval slices (1 ms). With no bridge bound yet it has nothing to do, but a
      // bridge bound during the wait must still be driven: then the slices are 50 ms (as
      // libfabric's util wait), so an idle waiter wakes 20 times a second and a late bind is
      // noticed within 50 ms.
      wa.progress = drive_fn;
      wa.progress_ctx = &a;
      if (a.sources_n.load(std::memory_order_relaxed) == 0) {
        wa.comp_mask |= COMPCNTR_WAIT_ATTR_PROGRESS_INTERVAL;
        wa.progress_interval_us = 50'000;
      }
      break;
  }
  return a.wait_cc(threshold, timeout, wa);
}

namespace {

// ---- fi_ops (the fid) ------------------------------------------------------------------------

// What compcntr_destroy_comp_cntr's EBUSY message names while an adapter owns its counter.
constexpr const char* adapter_owner =
    "a libfabric fid_cntr (compcntr_fi_cntr_open): fi_close it instead";

int fid_close(fid* f) {
  adapter* a = of<adapter>(f);
  {
    std::lock_guard lk(registry_lock());
    if (a->bindings != 0) {
      fail(EBUSY,
           "fi_close: the counter is bound to %u CQ bridge binding(s); close the bridge(s) first",
           a->bindings);
      return -FI_EBUSY;
    }
    // EBUSY if the application attached the compcntr counter to a QP; nothing changes then
    // (the counter is owned again).
    compcntr_comp_cntr_set_owner(a->cc, nullptr);
    if (const int err = compcntr_destroy_comp_cntr(a->cc)) {
      compcntr_comp_cntr_set_owner(a->cc, adapter_owner);
      fail(err, "fi_close: the compcntr counter cannot be destroyed: %s",
           compcntr_last_error_message());
      return -err;
    }
    registry().erase(a->cc);
  }
  delete a;
  return 0;
}

int fid_bind(fid*, fid*, uint64_t) {
  fail(ENOSYS,
       "fi_bind: an adapter counter binds to nothing (bind its compcntr counter to a bridge)");
  return -FI_ENOSYS;
}

int fid_control(fid* f, int command, void* arg) {
  adapter* a = of<adapter>(f);
  switch (command) {
    case FI_GETWAIT:
      if (arg == nullptr) return -fail(EINVAL, "fi_control(FI_GETWAIT): arg is NULL");
      if (int rc; a->control(command, arg, a->fd, &rc)) return rc;
      {
        // As libfabric's util CQ without a wait object: nothing to hand out. FI_WAIT_UNSPEC's
        // wait (a futex) is not a retrievable object, which fi_cntr(3) allows.
        fail(ENODATA, "fi_control(FI_GETWAIT): the counter has no retrievable wait object "
                      "(open it with FI_WAIT_FD)");
        return -FI_ENODATA;
      }
    case FI_GETWAITOBJ:
      if (arg == nullptr) return -fail(EINVAL, "fi_control(FI_GETWAITOBJ): arg is NULL");
      *static_cast<int*>(arg) = a->wait_obj; // fi_wait_obj is int-sized
      return 0;
    default:
      fail(ENOSYS, "fi_control: command %d is not supported on an adapter counter", command);
      return -FI_ENOSYS;
  }
}

int fid_ops_open(fid*, const char* name, uint64_t, void**, void*) {
  fail(ENOSYS, "fi_open_ops(%s): an adapter counter has no extension ops", name ? name : "(null)");
  return -FI_ENOSYS;
}

fi_ops fid_ops = {
    .size = sizeof(fi_ops),
    .close = fid_close,
    .bind = fid_bind,
    .control = fid_control,
    .ops_open = fid_ops_open,
    .tostr = nullptr,
    .ops_set = nullptr,
};

/// The adapter behind `c`, or nullptr for NULL and for any counter not opened here. Reads only
/// the struct fid_cntr header every fid_cntr has (fclass and the fid's ops pointer), never past it.
adapter* adapter_of(fid_cntr* c) noexcept {
  if (c == nullptr || c->fid.fclass != FI_CLASS_CNTR || c->fid.ops != &fid_ops) return nullptr;
  return of<adapter>(c);
}

// Counter classes of other components (the hook provider's counters). Written rarely (once per
// class, under class_mu), read lock-free: an entry is complete before n_classes publishes it.
constexpr int max_classes = 8; // the hook needs one; room for a few more components
struct cntr_class {
  std::atomic<const fi_ops*> ops{nullptr};
  std::atomic<compcntr_fi_cntr_class_get> get{nullptr};
};
cntr_class classes[max_classes];
std::atomic<int> n_classes{0};
std::mutex class_mu;

compcntr_comp_cntr* from_class(fid_cntr* c) noexcept {
  if (c == nullptr || c->fid.fclass != FI_CLASS_CNTR) return nullptr;
  const int n = n_classes.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i)
    if (classes[i].ops.load(std::memory_order_relaxed) == c->fid.ops)
      return classes[i].get.load(std::memory_order_relaxed)(c);
  return nullptr;
}

} // namespace

std::mutex& registry_lock() noexcept {
  static std::mutex m;
  return m;
}

adapter* find_adapter(compcntr_comp_cntr* cc) noexcept {
  auto& r = registry();
  auto it = r.find(cc);
  return it == r.end() ? nullptr : it->second;
}

void adapter::run_bridges() noexcept {
  std::shared_lock lk(mu);
  for (auto& s : sources) compcntr_fi_bridge_progress(s.first);
}

bool add_binding(adapter& a, compcntr_fi_bridge* br) noexcept {
  std::unique_lock lk(a.mu);
  for (auto& s : a.sources)
    if (s.first == br) {
      ++s.second;
      ++a.bindings;
      return true;
    }
  try {
    a.sources.emplace_back(br, 1);
  } catch (...) {
    return false;
  }
  ++a.bindings;
  a.sources_n.store(static_cast<std::uint32_t>(a.sources.size()), std::memory_order_relaxed);
  return true;
}

void remove_binding(adapter& a, compcntr_fi_bridge* br) noexcept {
  std::unique_lock lk(a.mu);
  for (auto it = a.sources.begin(); it != a.sources.end(); ++it)
    if (it->first == br) {
      --a.bindings;
      if (--it->second == 0) a.sources.erase(it);
      break;
    }
  a.sources_n.store(static_cast<std::uint32_t>(a.sources.size()), std::memory_order_relaxed);
}

} // namespace compcntr_fabric

using namespace compcntr_fabric;

extern "C" {

int compcntr_fi_cntr_open(struct compcntr_device* dev, struct fi_cntr_attr* attr,
                          struct fid_cntr** cntr, void* context) {
  if (cntr == nullptr) return -fail(EINVAL, "compcntr_fi_cntr_open: cntr is NULL");
  if (dev == nullptr) return -fail(EINVAL, "compcntr_fi_cntr_open: dev is NULL");
  fi_cntr_attr defaults{};
  defaults.events = FI_CNTR_EVENTS_COMP;
  defaults.wait_obj = FI_WAIT_NONE;
  const fi_cntr_attr& a = attr ? *attr : defaults;

  if (a.flags != 0) // fi_cntr(3): "reserved for future use, and must be set to 0"
    return -fail(EINVAL, "compcntr_fi_cntr_open: attr->flags must be 0 (got 0x%llx)",
                 static_cast<unsigned long long>(a.flags));
  compcntr_comp_cntr_init_attr ia{};
  const int events = raw_enum(a.events), wait_obj = raw_enum(a.wait_obj);
  if (events == FI_CNTR_EVENTS_COMP) {
    ia.type = COMPCNTR_COMP_CNTR_TYPE_WRS;
  } else if (events == static_cast<int>(COMPCNTR_FI_CNTR_EVENTS_BYTES)) {
    ia.type = COMPCNTR_COMP_CNTR_TYPE_BYTES;
  } else {
    return -fail(EINVAL,
                 "compcntr_fi_cntr_open: unknown attr->events %d (FI_CNTR_EVENTS_COMP or "
                 "COMPCNTR_FI_CNTR_EVENTS_BYTES)",
                 events);
  }
  switch (wait_obj) {
    case FI_WAIT_NONE:
    case FI_WAIT_UNSPEC:
    case FI_WAIT_YIELD:
    case FI_WAIT_FD: break;
    case FI_WAIT_SET:
      if (a.wait_set == nullptr) // as libfabric's util counters
        return -fail(EINVAL, "compcntr_fi_cntr_open: FI_WAIT_SET without attr->wait_set");
      return -fail(EOPNOTSUPP, "compcntr_fi_cntr_open: FI_WAIT_SET is not supported (a wait set is "
                               "a provider's object; use FI_WAIT_FD and epoll)");
    case FI_WAIT_MUTEX_COND:
    case FI_WAIT_POLLFD:
      return -fail(EOPNOTSUPP,
                   "compcntr_fi_cntr_open: wait object %d is not supported (FI_WAIT_NONE, "
                   "FI_WAIT_UNSPEC, FI_WAIT_YIELD or FI_WAIT_FD)",
                   wait_obj);
    default: return -fail(EINVAL, "compcntr_fi_cntr_open: unknown wait object %d", wait_obj);
  }

  compcntr_comp_cntr* cc = compcntr_create_comp_cntr(dev, &ia);
  if (cc == nullptr) {
    const int err = errno;
    fail(err, "compcntr_fi_cntr_open: %s", compcntr_last_error_message());
    return fi_error(err);
  }
  int fd = -1;
  if (wait_obj == FI_WAIT_FD) {
    if (const int err = compcntr_comp_cntr_get_fd(cc, &fd)) {
      fail(err, "compcntr_fi_cntr_open: no fd for FI_WAIT_FD: %s", compcntr_last_error_message());
      compcntr_destroy_comp_cntr(cc);
      return fi_error(err);
    }
  }
  auto* ad = new (std::nothrow) adapter;
  if (ad == nullptr) {
    compcntr_destroy_comp_cntr(cc);
    return -fail(ENOMEM, "compcntr_fi_cntr_open: out of memory");
  }
  ad->cc = cc;
  ad->wait_obj = wait_obj; // one of the four checked above
  ad->fd = fd;
  ad->init_fid(&fid_ops, &cntr_ops<adapter>::table, context);
  try {
    std::lock_guard lk(registry_lock());
    registry().emplace(cc, ad);
  } catch (...) {
    delete ad;
    compcntr_destroy_comp_cntr(cc);
    return -fail(ENOMEM, "compcntr_fi_cntr_open: out of memory");
  }
  // From here on compcntr_destroy_comp_cntr(cc) is EBUSY: only fi_close destroys it.
  compcntr_comp_cntr_set_owner(cc, adapter_owner);
  *cntr = &ad->cntr;
  return 0;
}

int compcntr_fi_register_cntr_class(const struct fi_ops* fid_ops, compcntr_fi_cntr_class_get get) {
  if (fid_ops == nullptr || get == nullptr)
    return fail(EINVAL, "compcntr_fi_register_cntr_class: NULL argument");
  std::lock_guard lk(class_mu);
  const int n = n_classes.load(std::memory_order_relaxed);
  for (int i = 0; i < n; ++i)
    if (classes[i].ops.load(std::memory_order_relaxed) == fid_ops) return 0;
  if (n == max_classes)
    return fail(ENOSPC, "compcntr_fi_register_cntr_class: %d classes already", n);
  classes[n].ops.store(fid_ops, std::memory_order_relaxed);
  classes[n].get.store(get, std::memory_order_relaxed);
  n_classes.store(n + 1, std::memory_order_release);
  return 0;
}

struct compcntr_comp_cntr* compcntr_fi_cntr_comp_cntr(struct fid_cntr* cntr) {
  adapter* a = adapter_of(cntr);
  if (a == nullptr) {
    if (compcntr_comp_cntr* cc = from_class(cntr)) return cc;
    fail(EINVAL, cntr ? "compcntr_fi_cntr_comp_cntr: not a counter opened by compcntr_fi_cntr_open "
                        "nor by the hook provider (FI_HOOK=compcntr)"
                      : "compcntr_fi_cntr_comp_cntr: cntr is NULL");
    errno = EINVAL;
    return nullptr;
  }
  return a->cc;
}

int compcntr_fi_trywait(struct fid** fids, int count) {
  if (fids == nullptr) return -fail(EINVAL, "compcntr_fi_trywait: fids is NULL");
  if (count <= 0) return -fail(EINVAL, "compcntr_fi_trywait: count must be > 0 (got %d)", count);
  // Check every fid first: a refused call arms nothing.
  for (int i = 0; i < count; ++i) {
    if (fids[i] == nullptr) return -fail(EINVAL, "compcntr_fi_trywait: fids[%d] is NULL", i);
    adapter* a = adapter_of(reinterpret_cast<fid_cntr*>(fids[i]));
    if (a == nullptr)
      return -fail(EINVAL,
                   "compcntr_fi_trywait: fids[%d] is not a counter opened by compcntr_fi_cntr_open",
                   i);
    if (a->wait_obj != FI_WAIT_FD)
      return -fail(EINVAL, "compcntr_fi_trywait: fids[%d] was not opened with FI_WAIT_FD", i);
  }
  int ret = 0;
  for (int i = 0; i < count; ++i) {
    adapter* a = of<adapter>(fids[i]);
    // The bridges first (their updates need no wake-up), then cntr_base::trywait: arm, then
    // read; an update after the arm makes the fd readable, one before it is in the values read.
    adapter::drive(*a, false);
    const int r = a->trywait([] {});
    if (r != 0 && r != -FI_EAGAIN)
      return -fail(-r, "compcntr_fi_trywait: %s", compcntr_last_error_message());
    if (r != 0) ret = r;
  }
  if (ret)
    fail(EAGAIN, "compcntr_fi_trywait: a counter changed since the last trywait: read it first");
  return ret;
}

} // extern "C"
