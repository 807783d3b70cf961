// Internal declarations shared by the software device's units (src/features/soft/*.cpp).
// Include after `module compcntr;` (it relies on <cstddef>, <cstdint> and <system_error> from the
// including unit's global module fragment). Declarations only: each entity is defined in exactly
// one unit, as a named module requires.
#ifndef COMPCNTR_SRC_SOFT_SOFT_HPP
#define COMPCNTR_SRC_SOFT_SOFT_HPP

namespace compcntr::detail {

/// The memory registrations of one software device (soft_memory.cpp).
class soft_memory;
soft_memory* make_soft_memory() noexcept;
void delete_soft_memory(soft_memory* m) noexcept;

/// compcntr::device::reg_mr on the software device (soft_memory.cpp).
mr_impl* soft_reg_mr(device_core& dev, soft_memory& mem, void* addr, std::size_t length,
                     std::uint32_t access, std::error_code& ec) noexcept;

/// Reader lock on the registrations: held while a QP resolves keys and copies bytes, so a
/// deregistration waits for copies in progress (soft_memory.cpp).
void soft_memory_lock_shared(soft_memory& m) noexcept;
void soft_memory_unlock_shared(soft_memory& m) noexcept;

/// With the reader lock held: the address `addr` if [addr, addr+len) lies inside the region
/// registered under `key` (an rkey if `remote`, else an lkey) and that region grants every
/// compcntr::access bit of `need`; otherwise nullptr and `*why` names the violation.
/// len must be > 0.
void* soft_memory_resolve(soft_memory& m, std::uint32_t key, bool remote, std::uintptr_t addr,
                          std::size_t len, std::uint32_t need, const char** why) noexcept;

/// A new software loopback QP in RESET (soft_qp.cpp).
qp_impl* make_soft_qp(device_core& dev, soft_memory& mem, std::error_code& ec) noexcept;

} // namespace compcntr::detail

#endif
