// Native completion counters of rdma-core 65+ (ibv_create_comp_cntr, ibv_qp_attach_comp_cntr,
// EFA's efadv_create_comp_cntr with external memory), behind a narrow interface.
//
// Why a separate, non-module unit: this is the only code that calls the rdma-core 65 API. On a
// machine whose headers lack it (Debian 12: rdma-core 44) the real branch cannot be built, so the
// build compiles it a second time against declarations written from the rdma-core 65 man pages
// (tests/integrations/verbs/native_check/rdma_core65_decls.h): a compile-only check that keeps the branch honest.
// Without native support every function answers ENOTSUP and the verbs backend emulates.
//
// Include in a global module fragment (it declares global-module entities).
#ifndef COMPCNTR_SRC_VERBS_NATIVE_COMP_CNTR_HPP
#define COMPCNTR_SRC_VERBS_NATIVE_COMP_CNTR_HPP

#include <cstdint>

struct ibv_context;
struct ibv_qp;

namespace compcntr_native {

/// ibv_comp_cntr_caps.
struct caps {
  std::uint64_t max_value;
  std::uint32_t max_counters;
  std::uint32_t supported_qp_attach_ops;
};

/// An ibv_comp_cntr.
struct counter;

/// True when this build calls the native API (COMPCNTR_HAVE_NATIVE_COMP_CNTR).
bool available() noexcept;
/// ibv_query_comp_cntr_caps: 0, or an errno (ENOTSUP: no native counters on this device or
/// in this build).
int query_caps(ibv_context* ctx, caps* out) noexcept;
/// A counter of `type` (0 WRS, 1 BYTES). With EFA the device writes the two values into the
/// 8-byte words `comp` and `errs` (external memory) and *external is true; otherwise the values
/// live in the device and must be read back (read/read_err), *external false.
/// nullptr and *err = errno on failure.
counter* create(ibv_context* ctx, std::uint32_t type, std::uint64_t* comp, std::uint64_t* errs,
                bool* external, int* err) noexcept;
int destroy(counter* c) noexcept;
int inc(counter* c, std::uint64_t n) noexcept;
int inc_err(counter* c, std::uint64_t n) noexcept;
int set(counter* c, std::uint64_t v) noexcept;
int set_err(counter* c, std::uint64_t v) noexcept;
int read(counter* c, std::uint64_t* v) noexcept;
int read_err(counter* c, std::uint64_t* v) noexcept;
/// ibv_qp_attach_comp_cntr for `op_mask` (compcntr's attach_op bits: the same values as
/// rdma-core's IBV_QP_ATTACH_COMP_CNTR_OP_*).
int attach(ibv_qp* qp, counter* c, std::uint32_t op_mask) noexcept;

} // namespace compcntr_native

#endif
