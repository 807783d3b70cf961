// Native completion counters (rdma-core 65+); see native_comp_cntr.hpp.
//
// COMPCNTR_NATIVE_COMPILE_CHECK: the build's compile-only check of the native branch against
// tests/integrations/verbs/native_check/rdma_core65_decls.h (force-included), on machines whose rdma-core is older.
#ifdef COMPCNTR_NATIVE_COMPILE_CHECK
#define COMPCNTR_HAVE_VERBS 1
#define COMPCNTR_HAVE_NATIVE_COMP_CNTR 1
#define COMPCNTR_HAVE_EFA_COMP_CNTR 1
#else
#include "compcntr_config.h"
#endif

#include "integrations/verbs/native_comp_cntr.hpp"

#include <cerrno>
#include <cstdint>
#include <type_traits>

#if COMPCNTR_HAVE_NATIVE_COMP_CNTR
#include <infiniband/verbs.h>
#if COMPCNTR_HAVE_EFA_COMP_CNTR
#include <infiniband/efadv.h>
#endif
#endif

namespace compcntr_native {

#if COMPCNTR_HAVE_NATIVE_COMP_CNTR

namespace {

ibv_comp_cntr* cc(counter* c) noexcept { return reinterpret_cast<ibv_comp_cntr*>(c); }

// The attach attribute struct, taken from ibv_qp_attach_comp_cntr's own prototype: rdma-core's
// man page calls it ibv_comp_cntr_attach_attr, its implementation ibv_qp_attach_comp_cntr_attr.
// Only its op_mask member is used (value-initialised: comp_mask 0).
template <class F>
struct third_parameter;
template <class R, class A, class B, class C>
struct third_parameter<R (*)(A, B, C)> {
  using type = std::remove_pointer_t<C>;
};
using attach_attr = third_parameter<decltype(&ibv_qp_attach_comp_cntr)>::type;

int errno_or(int fallback) noexcept { return errno != 0 ? errno : fallback; }

} // namespace

bool available() noexcept { return true; }

int query_caps(ibv_context* ctx, caps* out) noexcept {
  ibv_comp_cntr_caps c{};
  const int rc = ibv_query_comp_cntr_caps(ctx, &c);
  if (rc != 0) return rc == EOPNOTSUPP ? ENOTSUP : rc;
  out->max_value = c.max_value;
  out->max_counters = c.max_counters;
  out->supported_qp_attach_ops = c.supported_qp_attach_ops;
  return 0;
}

counter* create(ibv_context* ctx, std::uint32_t type, std::uint64_t* comp, std::uint64_t* errs,
                bool* external, int* err) noexcept {
  ibv_comp_cntr_init_attr attr{};
  attr.type = type == 1 ? IBV_COMP_CNTR_TYPE_BYTES : IBV_COMP_CNTR_TYPE_WRS;
#if COMPCNTR_HAVE_EFA_COMP_CNTR
  // EFA: the device DMA-writes both values into the caller's words (the pool slot's value and
  // errors), so reading a counter never leaves user space.
  efadv_comp_cntr_init_attr efa{};
  efa.flags =
      EFADV_COMP_CNTR_INIT_WITH_COMP_EXTERNAL_MEM | EFADV_COMP_CNTR_INIT_WITH_ERR_EXTERNAL_MEM;
  efa.comp_cntr_ext_mem.type = EFADV_MEMORY_LOCATION_VA;
  efa.comp_cntr_ext_mem.ptr = reinterpret_cast<std::uint8_t*>(comp);
  efa.err_cntr_ext_mem.type = EFADV_MEMORY_LOCATION_VA;
  efa.err_cntr_ext_mem.ptr = reinterpret_cast<std::uint8_t*>(errs);
  errno = 0;
  if (ibv_comp_cntr* c = efadv_create_comp_cntr(ctx, &attr, &efa, sizeof efa)) {
    *external = true;
    return reinterpret_cast<counter*>(c);
  }
  // Not an EFA device (or no external memory there): the generic verb below.
#else
  (void)comp;
  (void)errs;
#endif
  errno = 0;
  ibv_comp_cntr* c = ibv_create_comp_cntr(ctx, &attr);
  if (c == nullptr) {
    *err = errno_or(ENOMEM);
    if (*err == EOPNOTSUPP) *err = ENOTSUP;
    return nullptr;
  }
  *external = false;
  return reinterpret_cast<counter*>(c);
}

int destroy(counter* c) noexcept { return ibv_destroy_comp_cntr(cc(c)); }
int inc(counter* c, std::uint64_t n) noexcept { return ibv_inc_comp_cntr(cc(c), n); }
int inc_err(counter* c, std::uint64_t n) noexcept { return ibv_inc_err_comp_cntr(cc(c), n); }
int set(counter* c, std::uint64_t v) noexcept { return ibv_set_comp_cntr(cc(c), v); }
int set_err(counter* c, std::uint64_t v) noexcept { return ibv_set_err_comp_cntr(cc(c), v); }
int read(counter* c, std::uint64_t* v) noexcept { return ibv_read_comp_cntr(cc(c), v); }
int read_err(counter* c, std::uint64_t* v) noexcept { return ibv_read_err_comp_cntr(cc(c), v); }

int attach(ibv_qp* qp, counter* c, std::uint32_t op_mask) noexcept {
  attach_attr a{};
  a.op_mask = op_mask;
  return ibv_qp_attach_comp_cntr(qp, cc(c), &a);
}

#else // no native completion counters in this build: the verbs backend emulates

bool available() noexcept { return false; }
int query_caps(ibv_context*, caps*) noexcept { return ENOTSUP; }
counter* create(ibv_context*, std::uint32_t, std::uint64_t*, std::uint64_t*, bool* external,
                int* err) noexcept {
  *external = false;
  *err = ENOTSUP;
  return nullptr;
}
int destroy(counter*) noexcept { return ENOTSUP; }
int inc(counter*, std::uint64_t) noexcept { return ENOTSUP; }
int inc_err(counter*, std::uint64_t) noexcept { return ENOTSUP; }
int set(counter*, std::uint64_t) noexcept { return ENOTSUP; }
int set_err(counter*, std::uint64_t) noexcept { return ENOTSUP; }
int read(counter*, std::uint64_t*) noexcept { return ENOTSUP; }
int read_err(counter*, std::uint64_t*) noexcept { return ENOTSUP; }
int attach(ibv_qp*, counter*, std::uint32_t) noexcept { return ENOTSUP; }

#endif

} // namespace compcntr_native
