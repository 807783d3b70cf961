// mlx5 DEVX pieces shared by the verbs backend (src/integrations/verbs/verbs_backend.cpp) and their
// implementation (src/integrations/verbs/mlx5_devx.cpp). Include in the module purview (after
// `module compcntr;`), with <infiniband/verbs.h> in the global module fragment, and only when
// COMPCNTR_HAVE_MLX5_DEVX.
#ifndef COMPCNTR_SRC_VERBS_MLX5_DEVX_HPP
#define COMPCNTR_SRC_VERBS_MLX5_DEVX_HPP

namespace compcntr::detail {

/// The cmd_comp of an mlx5 device opened with MLX5DV_CONTEXT_FLAGS_DEVX: one
/// mlx5dv_devx_create_cmd_comp for counters backed by a DEVX object (queried with
/// mlx5dv_devx_obj_query_async, answers read with mlx5dv_devx_get_async_cmd_comp), plus the
/// software engine's cmd_comp for counters whose values are in host memory, merged under one
/// epoll fd (readable exactly while either has a response). nullptr + ec on failure.
cmd_comp_core* make_mlx5_devx_cmd_comp(device_core& dev, ibv_context* ctx,
                                       std::error_code& ec) noexcept;

/// Backs counter slot `s` with a DEVX flow counter (ALLOC_FLOW_COUNTER): the device counts
/// packets (WRS) or bytes (BYTES) of the flows the counter is attached to; add/set adjust a
/// software offset. Sets s.hw and s.backend_data. Not used by default: counters of verbs
/// devices are CQ-emulated in host memory on rdma-core 44 (see docs/cmd_comp.md).
std::error_code mlx5_bind_flow_counter(ibv_context* ctx, slot& s) noexcept;
/// Releases what mlx5_bind_flow_counter created (no-op for other slots).
void mlx5_unbind_flow_counter(slot& s) noexcept;

} // namespace compcntr::detail

#endif
