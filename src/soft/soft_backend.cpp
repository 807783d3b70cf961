// The software device "soft": always available, every counter a pool slot updated by atomics.
module;
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <string_view>
#include <system_error>
module compcntr;

namespace compcntr::detail {

namespace {
class soft_backend final : public backend {
 public:
  std::string_view name() const noexcept override { return "soft"; }
  counter_caps caps() const noexcept override {
    return {.max_value = UINT64_MAX, .max_counters = 0, .supported_qp_attach_ops = all_attach_ops};
  }
};
}  // namespace

std::unique_ptr<backend> make_soft_backend() noexcept {
  return std::unique_ptr<backend>(new (std::nothrow) soft_backend);
}

std::error_code max_counters_from_env(std::uint32_t& out) noexcept {
  const char* env = std::getenv("COMPCNTR_MAX_COUNTERS");
  if (env == nullptr || *env == '\0') {
    out = default_max_counters;
    return {};
  }
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(env, &end, 0);
  if (errno != 0 || *end != '\0' || env[0] == '-' || v == 0 || v > slot_pool::max_capacity)
    return fail(EINVAL, "open_device: COMPCNTR_MAX_COUNTERS='%s' is not a number in 1..%u", env,
                slot_pool::max_capacity);
  out = static_cast<std::uint32_t>(v);
  return {};
}

}  // namespace compcntr::detail
