// The software device "soft": always available, every counter a pool slot updated by atomics;
// it offers loopback QPs and memory registrations (qp_capability).
module;
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string_view>
#include <system_error>
module compcntr;

#include "features/soft/soft.hpp"

namespace compcntr::detail {

namespace {
class soft_backend final : public backend, public qp_capability {
 public:
  explicit soft_backend(soft_memory* mem) noexcept : mem_(mem) {}
  ~soft_backend() override { delete_soft_memory(mem_); }
  std::string_view name() const noexcept override { return "soft"; }
  counter_caps caps() const noexcept override {
    // Loopback QPs count every attach op (src/features/soft/soft_qp.cpp).
    return {.max_value = UINT64_MAX, .max_counters = 0, .supported_qp_attach_ops = all_attach_ops};
  }
  // Its counters are the slots themselves: nothing to bind.
  bool binds_counters() const noexcept override { return false; }
  qp_capability* qps() noexcept override { return this; }
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
} // namespace

std::unique_ptr<backend> make_soft_backend() noexcept {
  soft_memory* mem = make_soft_memory();
  if (!mem) return nullptr;
  auto* be = new (std::nothrow) soft_backend(mem);
  if (!be) delete_soft_memory(mem);
  return std::unique_ptr<backend>(be);
}

} // namespace compcntr::detail
