// The verbs backend: real RDMA devices through libibverbs (rdma-core).
//
// This unit finds and opens devices. Counters of a verbs device are pool slots: native
// ibv_comp_cntr objects where rdma-core provides them (COMPCNTR_HAVE_NATIVE_COMP_CNTR), else
// software counters fed by draining the QPs' completion queues (see docs/architecture.md).
module;
#include "compcntr_config.h"
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <system_error>
#if COMPCNTR_HAVE_VERBS
#include <infiniband/verbs.h>
#endif
#if COMPCNTR_HAVE_MLX5_DEVX
#include <infiniband/mlx5dv.h>
#endif
module compcntr;

#if COMPCNTR_HAVE_MLX5_DEVX
#include "mlx5_devx.hpp"
#endif

namespace compcntr::detail {

#if COMPCNTR_HAVE_VERBS
namespace {

class verbs_backend final : public backend {
 public:
  /// `devx`: ctx was opened with mlx5dv_open_device(MLX5DV_CONTEXT_FLAGS_DEVX).
  verbs_backend(ibv_context* ctx, std::string name, bool devx) noexcept
      : ctx_(ctx), name_(std::move(name)), devx_(devx) {}
  ~verbs_backend() override { ibv_close_device(ctx_); }
  std::string_view name() const noexcept override { return name_; }
  counter_caps caps() const noexcept override {
    // Counters are emulated in software slots: the full 64-bit range. QP attachment for verbs
    // QPs is not implemented yet, so no attach op is advertised.
    return {.max_value = UINT64_MAX, .max_counters = 0, .supported_qp_attach_ops = 0};
  }
  ibv_context* context() const noexcept { return ctx_; }

  /// mlx5 devices with DEVX answer asynchronous commands through mlx5dv_devx_* (see
  /// src/verbs/mlx5_devx.cpp); every other device through the software command engine.
  cmd_comp_core* create_cmd_comp(device_core& dev, std::error_code& ec) noexcept override {
#if COMPCNTR_HAVE_MLX5_DEVX
    if (devx_) return make_mlx5_devx_cmd_comp(dev, ctx_, ec);
#endif
    return backend::create_cmd_comp(dev, ec);
  }
  void unbind_counter(slot& s) noexcept override {
#if COMPCNTR_HAVE_MLX5_DEVX
    mlx5_unbind_flow_counter(s);  // no-op unless the slot is DEVX-backed
#else
    (void)s;
#endif
  }

 private:
  ibv_context* ctx_;
  std::string name_;
  [[maybe_unused]] bool devx_;  // read only when COMPCNTR_HAVE_MLX5_DEVX
};

struct device_list {
  ibv_device** list = nullptr;
  int n = 0;
  device_list() noexcept { list = ibv_get_device_list(&n); }
  ~device_list() {
    if (list) ibv_free_device_list(list);
  }
};

}  // namespace

std::unique_ptr<backend> open_verbs_backend(std::string_view name, std::error_code& ec) noexcept {
  device_list devs;
  if (devs.list == nullptr) {
    const int err = errno;
    fail_into(ec, ENODEV, "open_device: no RDMA device%s%.*s%s: libibverbs cannot list devices (%s)",
              name.empty() ? "" : " named '", static_cast<int>(name.size()), name.data(),
              name.empty() ? "" : "'", std::strerror(err));
    return nullptr;
  }
  int open_errno = 0;
  for (int i = 0; i < devs.n; ++i) {
    const char* dev_name = ibv_get_device_name(devs.list[i]);
    if (!name.empty() && name != dev_name) continue;
    ibv_context* ctx = nullptr;
    bool devx = false;
#if COMPCNTR_HAVE_MLX5_DEVX
    // mlx5: open with DEVX when the kernel and permissions allow it, for asynchronous commands.
    if (mlx5dv_is_supported(devs.list[i])) {
      mlx5dv_context_attr attr{};
      attr.flags = MLX5DV_CONTEXT_FLAGS_DEVX;
      ctx = mlx5dv_open_device(devs.list[i], &attr);
      devx = ctx != nullptr;
    }
#endif
    if (!ctx) ctx = ibv_open_device(devs.list[i]);
    if (!ctx) {
      open_errno = errno;
      if (!name.empty()) break;
      continue;
    }
    auto* be = new (std::nothrow) verbs_backend(ctx, dev_name, devx);
    if (!be) {
      ibv_close_device(ctx);
      fail_into(ec, ENOMEM, "open_device: out of memory");
      return nullptr;
    }
    return std::unique_ptr<backend>(be);
  }
  if (open_errno != 0)
    fail_into(ec, ENODEV, "open_device: RDMA device '%.*s' exists but cannot be opened (%s)",
              static_cast<int>(name.size()), name.data(), std::strerror(open_errno));
  else if (name.empty())
    fail_into(ec, ENODEV, "open_device: no usable RDMA device (libibverbs lists %d)", devs.n);
  else
    fail_into(ec, ENODEV, "open_device: no RDMA device named '%.*s' (libibverbs lists %d device(s))",
              static_cast<int>(name.size()), name.data(), devs.n);
  return nullptr;
}

#else

std::unique_ptr<backend> open_verbs_backend(std::string_view name, std::error_code& ec) noexcept {
  fail_into(ec, ENODEV, "open_device: no RDMA device named '%.*s': compcntr was built without the "
            "verbs backend (libibverbs not found at configure time)",
            static_cast<int>(name.size()), name.data());
  return nullptr;
}

#endif

}  // namespace compcntr::detail
