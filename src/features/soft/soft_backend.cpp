// The software device "soft": always available, every counter a pool slot updated by atomics.
module;
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <string_view>
#include <system_error>
module compcntr;

#include "features/soft/soft.hpp"

namespace compcntr::detail {

namespace {
class soft_backend final : public backend {
 public:
  explicit soft_backend(soft_memory* mem) noexcept : mem_(mem) {}
  ~soft_backend() override { delete_soft_memory(mem_); }
  std::string_view name() const noexcept override { return "soft"; }
  counter_caps caps() const noexcept override {
    // Loopback QPs count every attach op (src/features/soft/soft_qp.cpp).
    return {.max_value = UINT64_MAX, .max_counters = 0, .supported_qp_attach_ops = all_attach_ops};
  }
  qp_impl* create_qp(device_core& dev, std::error_code& ec) noexcept override {
    return make_soft_qp(dev, *mem_, ec);
  }
  mr_impl* reg_mr(device_core& dev, void* addr, std::size_t length, std::uint32_t access_bits,
                  std::error_code& ec) noexcept override {
    return soft_reg_mr(dev, *mem_, addr, length, access_bits, ec);
  }

 private:
  soft_memory* mem_;  ///< the device's memory registrations (soft_memory.cpp)
};
}  // namespace

std::unique_ptr<backend> make_soft_backend() noexcept {
  soft_memory* mem = make_soft_memory();
  if (!mem) return nullptr;
  auto* be = new (std::nothrow) soft_backend(mem);
  if (!be) delete_soft_memory(mem);
  return std::unique_ptr<backend>(be);
}

std::error_code max_counters_from_env(std::uint32_t& out) noexcept {
  const char* env = std::getenv("COMPCNTR_MAX_COUNTERS");
  if (env == nullptr) {
    out = default_max_counters;
    return {};
  }
  // A decimal count and nothing else: no sign, no blanks, no base prefix (strtoull with base 0
  // read "010000" as octal and "0x10" as hex), no empty string. Leading zeros are decimal.
  std::uint64_t v = 0;
  bool ok = *env != '\0';
  for (const char* p = env; ok && *p; ++p) {
    ok = *p >= '0' && *p <= '9';
    if (ok) v = v * 10 + static_cast<std::uint64_t>(*p - '0');
    ok = ok && v <= slot_pool::max_capacity;  // also stops before v * 10 could overflow
  }
  if (!ok || v == 0)
    return fail(EINVAL, "open_device: COMPCNTR_MAX_COUNTERS='%s' is not a decimal count in 1..%u "
                "(digits only; unset it for the default %u)", env, slot_pool::max_capacity,
                default_max_counters);
  out = static_cast<std::uint32_t>(v);
  return {};
}

}  // namespace compcntr::detail
