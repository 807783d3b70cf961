// The verbs backend: real RDMA devices through libibverbs (rdma-core).
//
// Two modes, chosen when the device is opened:
//   * native: rdma-core 65+ headers (COMPCNTR_HAVE_NATIVE_COMP_CNTR) and a device that answers
//     ibv_query_comp_cntr_caps. Every counter is an ibv_comp_cntr. On EFA it is created with
//     external memory pointing at the pool slot's value/errors words, so the device DMA-writes
//     the mirror itself; elsewhere its values are read back into the slot after each software
//     update and by progress() (a "mirror" progress source). Wrapped ibv_qps are attached with
//     ibv_qp_attach_comp_cntr. Supported attach ops: what the device reports.
//   * emulated (rdma-core 44, or a device without counters): counters are software slots;
//     wrapped ibv_qps are counted by draining their CQs in progress() (src/integrations/verbs/verbs_qp.cpp).
//     Supported attach ops: SEND, RECV, RDMA_READ, RDMA_WRITE (incoming RDMA produces no CQ
//     entry on the target, so REMOTE_* cannot be emulated).
// The device never makes QPs or memory registrations itself (create_qp / reg_mr: ENOTSUP): the
// application brings its own ibv_qp (compcntr::device::wrap_verbs_qp).
module;
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>
#include "compcntr_config.h"
#if COMPCNTR_HAVE_VERBS
#include <infiniband/verbs.h>
#endif
#include "integrations/verbs/native_comp_cntr.hpp"
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

/// What a CQ-draining emulation can observe (see the file comment).
constexpr std::uint32_t emulated_attach_ops = static_cast<std::uint32_t>(attach_op::send) |
                                              static_cast<std::uint32_t>(attach_op::recv) |
                                              static_cast<std::uint32_t>(attach_op::rdma_read) |
                                              static_cast<std::uint32_t>(attach_op::rdma_write);

compcntr_native::counter* native_of(const slot& s) noexcept {
  return static_cast<compcntr_native::counter*>(s.backend_data);
}

// The slot's value and errors are the words the device writes (EFA external memory): they must
// be plain 8-byte words at 8-byte alignment.
static_assert(sizeof(std::atomic<std::uint64_t>) == sizeof(std::uint64_t));
static_assert(alignof(std::atomic<std::uint64_t>) == alignof(std::uint64_t));
std::uint64_t* word(std::atomic<std::uint64_t>& a) noexcept {
  return reinterpret_cast<std::uint64_t*>(&a);
}

/// Copies a device-resident counter's values into its slot (the mirror readers look at).
/// Memory ordering: seq_cst stores then notify()'s seq_cst load of `watch`, as a software set()
/// (compcntr:slot): a waiter registering at the same time is either seen or sees the values.
void refresh_mirror(slot& s) noexcept {
  std::uint64_t v = 0;
  if (compcntr_native::read(native_of(s), &v) == 0) s.value.store(v, std::memory_order_seq_cst);
  if (compcntr_native::read_err(native_of(s), &v) == 0)
    s.errors.store(v, std::memory_order_seq_cst);
  s.notify();
}

// Hardware counter operations (slot::hw). External-memory counters: the device writes the slot,
// so an update is the verb and a wake-up. Mirrored counters: the verb, then a read-back.
void after_update(slot& s, bool mirrored) noexcept {
  if (mirrored)
    refresh_mirror(s);
  else
    s.notify();
}
template <bool Mirrored>
struct native_ops {
  static void add(slot& s, std::uint64_t n) noexcept {
    compcntr_native::inc(native_of(s), n);
    after_update(s, Mirrored);
  }
  static void add_error(slot& s, std::uint64_t n) noexcept {
    compcntr_native::inc_err(native_of(s), n);
    after_update(s, Mirrored);
  }
  static void set(slot& s, std::uint64_t v) noexcept {
    compcntr_native::set(native_of(s), v);
    after_update(s, Mirrored);
  }
  static void set_error(slot& s, std::uint64_t v) noexcept {
    compcntr_native::set_err(native_of(s), v);
    after_update(s, Mirrored);
  }
  static void refresh(slot& s) noexcept {
    if constexpr (Mirrored) refresh_mirror(s);
  }
  static constexpr hw_counter_ops table{&add, &add_error, &set, &set_error, &refresh};
};

/// progress() for mirrored native counters: re-reads every one of them into its slot, so
/// completions the device counted become visible to readers and waiters.
class mirror_source final : public progress_source {
 public:
  std::vector<slot*> slots; ///< guarded by the device's progress registry lock
  std::size_t poll() noexcept override {
    for (slot* s : slots) refresh_mirror(*s);
    return 0; // refreshes are not completions consumed
  }
};

class verbs_backend final : public backend,
                            public native_attach_capability,
                            public command_capability {
 public:
  /// `devx`: ctx was opened with mlx5dv_open_device(MLX5DV_CONTEXT_FLAGS_DEVX).
  verbs_backend(ibv_context* ctx, std::string name, bool devx) noexcept
      : ctx_(ctx), name_(std::move(name)), devx_(devx) {
    compcntr_native::caps c{};
    native_ = compcntr_native::query_caps(ctx_, &c) == 0;
    if (native_)
      caps_ = {.max_value = c.max_value,
               .max_counters = c.max_counters,
               .supported_qp_attach_ops = c.supported_qp_attach_ops & all_attach_ops};
    else
      caps_ = {.max_value = UINT64_MAX,
               .max_counters = 0,
               .supported_qp_attach_ops = emulated_attach_ops};
  }
  ~verbs_backend() override { ibv_close_device(ctx_); }
  std::string_view name() const noexcept override { return name_; }
  counter_caps caps() const noexcept override { return caps_; }
  /// Native attach only with native counters; asynchronous commands of its own only on mlx5
  /// with DEVX (src/integrations/verbs/mlx5_devx.cpp): every other device gets the software
  /// command engine of compcntr:cmd_comp.
  native_attach_capability* native_attach() noexcept override { return native_ ? this : nullptr; }
  command_capability* commands() noexcept override {
#if COMPCNTR_HAVE_MLX5_DEVX
    if (devx_) return this;
#endif
    return nullptr;
  }
  void* native_context() const noexcept override { return ctx_; }

  std::error_code bind_counter(slot& s) noexcept override {
    if (!native_) return {}; // emulation: the slot is the counter
    bool external = false;
    int err = 0;
    compcntr_native::counter* c = compcntr_native::create(
        ctx_, static_cast<std::uint32_t>(s.type), word(s.value), word(s.errors), &external, &err);
    if (!c)
      return fail(err, "create_comp_cntr: device '%s' refused a native counter (%s)", name_.c_str(),
                  std::strerror(err));
    s.backend_data = c;
    if (external) {
      s.hw = &native_ops<false>::table;
      return {};
    }
    s.hw = &native_ops<true>::table;
    auto lk = s.dev->progress_sources().lock();
    try {
      mirrors_.slots.push_back(&s);
    } catch (...) {
      lk.unlock();
      unbind_counter(s);
      return fail(ENOMEM, "create_comp_cntr: out of memory");
    }
    if (mirrors_.slots.size() == 1) {
      if (auto e = s.dev->progress_sources().add_locked(mirrors_)) {
        mirrors_.slots.clear();
        lk.unlock();
        unbind_counter(s);
        return e;
      }
    }
    return {};
  }

  void unbind_counter(slot& s) noexcept override {
#if COMPCNTR_HAVE_MLX5_DEVX
    mlx5_unbind_flow_counter(s); // no-op unless the slot is DEVX-backed
#endif
    if (!s.backend_data) return;
    if (s.hw == &native_ops<true>::table) {
      auto lk = s.dev->progress_sources().lock();
      std::erase(mirrors_.slots, &s);
      if (mirrors_.slots.empty()) s.dev->progress_sources().remove_locked(mirrors_);
    }
    compcntr_native::destroy(native_of(s));
    s.backend_data = nullptr;
    s.hw = nullptr;
  }

  std::error_code attach(void* vqp, slot& s, std::uint32_t op_mask) noexcept override {
    if (!s.backend_data)
      return fail(EINVAL, "qp_attach_comp_cntr: counter %u is not a native counter of '%s'",
                  s.index, name_.c_str());
    const int rc = compcntr_native::attach(static_cast<ibv_qp*>(vqp), native_of(s), op_mask);
    if (rc != 0)
      return fail(rc, "qp_attach_comp_cntr: ibv_qp_attach_comp_cntr failed on '%s' (%s)",
                  name_.c_str(), std::strerror(rc));
    return {};
  }

  /// Only reached through commands(), i.e. on mlx5 with DEVX.
  cmd_comp_core* create_cmd_comp(device_core& dev, std::error_code& ec) noexcept override {
#if COMPCNTR_HAVE_MLX5_DEVX
    return make_mlx5_devx_cmd_comp(dev, ctx_, ec);
#else
    (void)dev;
    fail_into(ec, ENOTSUP, "create_cmd_comp: built without mlx5 DEVX");
    return nullptr;
#endif
  }

 private:
  ibv_context* ctx_;
  std::string name_;
  bool native_ = false;
  counter_caps caps_{};
  mirror_source mirrors_;
  [[maybe_unused]] bool devx_; // read only when COMPCNTR_HAVE_MLX5_DEVX
};

struct device_list {
  ibv_device** list = nullptr;
  int n = 0;
  device_list() noexcept { list = ibv_get_device_list(&n); }
  ~device_list() {
    if (list) ibv_free_device_list(list);
  }
};

} // namespace

std::unique_ptr<backend> open_verbs_backend(std::string_view name, std::error_code& ec) noexcept {
  device_list devs;
  if (devs.list == nullptr) {
    const int err = errno;
    fail_into(ec, ENODEV,
              "open_device: no RDMA device%s%.*s%s: libibverbs cannot list devices (%s)",
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
    fail_into(ec, ENODEV,
              "open_device: no RDMA device named '%.*s' (libibverbs lists %d device(s))",
              static_cast<int>(name.size()), name.data(), devs.n);
  return nullptr;
}

#else

std::unique_ptr<backend> open_verbs_backend(std::string_view name, std::error_code& ec) noexcept {
  fail_into(ec, ENODEV,
            "open_device: no RDMA device named '%.*s': compcntr was built without the "
            "verbs backend (libibverbs not found at configure time)",
            static_cast<int>(name.size()), name.data());
  return nullptr;
}

#endif

} // namespace compcntr::detail
