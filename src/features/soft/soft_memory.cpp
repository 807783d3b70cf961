// Memory registration on the software device: keys, access rights, and the lock that makes
// deregistration wait for copies in progress.
//
// Keys: registration k (k = 1, 2, ...) gets lkey 2k and rkey 2k + 1, so keys are never 0 and an
// lkey is never accepted where an rkey is expected (or the reverse): the kind of mistake a
// real NIC reports as a protection error. Keys are reused only after 2^31 registrations, and
// never while the earlier holder is registered.
//
// Locking: one std::shared_mutex per device. QPs hold it shared while they resolve keys and copy
// (many QP pairs copy at once); reg/dereg hold it exclusively (rare, control path).
module;
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <system_error>
#include <unordered_map>
module compcntr;

#include "features/soft/soft.hpp"

namespace compcntr::detail {

class soft_memory {
 public:
  std::shared_mutex mu;
  std::unordered_map<std::uint32_t, mr_impl*> by_key;  ///< lkey and rkey -> region; guarded by mu
  std::uint32_t next = 1; ///< next registration number; guarded by mu
};

namespace {

/// Registration numbers stay below 2^31 so that 2k + 1 fits in 32 bits.
constexpr std::uint32_t max_registration = 0x7fffffffu;

class soft_mr final : public mr_impl {
 public:
  soft_mr(device_core& dev, soft_memory& mem) noexcept : dev_(dev), mem_(mem) {}

  void dereg() noexcept override {
    {
      std::unique_lock<std::shared_mutex> lk(mem_.mu); // waits for copies in progress
      mem_.by_key.erase(lkey);
      mem_.by_key.erase(rkey);
    }
    device_core& dev = dev_;
    delete this;
    dev.release();
  }

 private:
  device_core& dev_;
  soft_memory& mem_;
};

} // namespace

soft_memory* make_soft_memory() noexcept { return new (std::nothrow) soft_memory; }
void delete_soft_memory(soft_memory* m) noexcept { delete m; }

mr_impl* soft_reg_mr(device_core& dev, soft_memory& mem, void* addr, std::size_t length,
                     std::uint32_t access_bits, std::error_code& ec) noexcept {
  if (addr == nullptr) return fail_into(ec, EINVAL, "reg_mr: addr is NULL"), nullptr;
  if (length == 0) return fail_into(ec, EINVAL, "reg_mr: length is 0"), nullptr;
  if (reinterpret_cast<std::uintptr_t>(addr) + length < reinterpret_cast<std::uintptr_t>(addr))
    return fail_into(ec, EINVAL, "reg_mr: [%p, +%zu) wraps around the address space", addr, length),
           nullptr;
  if (access_bits & ~access::all)
    return fail_into(ec, EINVAL, "reg_mr: unknown access bit(s) 0x%x", access_bits & ~access::all),
           nullptr;
  if ((access_bits & access::remote_write) && !(access_bits & access::local_write))
    return fail_into(ec, EINVAL, "reg_mr: remote_write needs local_write too (verbs rule)"),
           nullptr;

  auto* m = new (std::nothrow) soft_mr(dev, mem);
  if (!m) return fail_into(ec, ENOMEM, "reg_mr: out of memory"), nullptr;
  m->addr = addr;
  m->length = length;
  m->access = access_bits;
  {
    std::unique_lock<std::shared_mutex> lk(mem.mu);
    std::uint32_t k;
    std::uint32_t tries = 0;
    do {
      k = mem.next;
      mem.next = k == max_registration ? 1 : k + 1;
      if (++tries > max_registration) {
        lk.unlock();
        delete m;
        return fail_into(ec, ENOMEM, "reg_mr: every key is in use"), nullptr;
      }
    } while (mem.by_key.count(2 * k) != 0 || mem.by_key.count(2 * k + 1) != 0);
    m->lkey = 2 * k;
    m->rkey = 2 * k + 1;
    try {
      mem.by_key.emplace(m->lkey, m);
      mem.by_key.emplace(m->rkey, m);
    } catch (...) {
      mem.by_key.erase(m->lkey);
      lk.unlock();
      delete m;
      return fail_into(ec, ENOMEM, "reg_mr: out of memory"), nullptr;
    }
  }
  dev.retain();
  ec.clear();
  return m;
}

void soft_memory_lock_shared(soft_memory& m) noexcept { m.mu.lock_shared(); }
void soft_memory_unlock_shared(soft_memory& m) noexcept { m.mu.unlock_shared(); }

void* soft_memory_resolve(soft_memory& m, std::uint32_t key, bool remote, std::uintptr_t addr,
                          std::size_t len, std::uint32_t need, const char** why) noexcept {
  const auto it = m.by_key.find(key);
  if (it == m.by_key.end()) {
    *why = remote ? "rkey is not registered" : "lkey is not registered";
    return nullptr;
  }
  const mr_impl& r = *it->second;
  if (remote && key != r.rkey) {
    *why = "an lkey was given where an rkey is needed";
    return nullptr;
  }
  if (!remote && key != r.lkey) {
    *why = "an rkey was given where an lkey is needed";
    return nullptr;
  }
  if (const std::uint32_t missing = need & ~r.access) {
    *why = (missing & access::remote_write)  ? "region lacks remote_write access"
           : (missing & access::remote_read) ? "region lacks remote_read access"
                                             : "region lacks local_write access";
    return nullptr;
  }
  const auto base = reinterpret_cast<std::uintptr_t>(r.addr);
  if (addr < base || len > r.length || addr - base > r.length - len) {
    *why = "range lies outside the registered region";
    return nullptr;
  }
  return reinterpret_cast<void*>(addr);
}

} // namespace compcntr::detail
