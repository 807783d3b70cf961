// Striped counters (modules/core/slot.cppm: stripe, slot::stripes): the stripes' memory, and
// the slow updates of the hardware-ops table every striped counter's slot::hw points at.
//
// A striped counter's completion count is the sum of its stripes (the slot's own `value` stays
// 0); the same for errors. add() is one RMW on the stripe of the CPU the caller runs on (inline,
// slot::hw_add); set(v) stores stripe 0 = v - (the other stripes), one store, so a reader sees
// either the old or the new value plus increments (an increment racing with set() may be lost
// or kept, as verbs allows for set).
module;
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <new>
#include <system_error>
module compcntr;

namespace compcntr::detail {

namespace {

// The sum of stripes 1.. (all but the one set() writes).
template <std::atomic<std::uint64_t> stripe::* Word>
std::uint64_t others_sum(const slot& s) noexcept {
  std::uint64_t v = 0;
  const stripe* st = s.stripe_array();
  for (std::uint32_t i = 1; i <= s.stripe_mask(); ++i)
    v += (st[i].*Word).load(std::memory_order_seq_cst);
  return v;
}

void striped_add(slot& s, std::uint64_t n) noexcept { s.add(n); }
void striped_add_error(slot& s, std::uint64_t n) noexcept { s.add_error(n); }
// set(v): stripe 0 = v - (stripes 1..), one seq_cst store, then the usual seq_cst load of watch
// (notify): as a plain counter's set(). An increment of stripe 0 racing with it is lost, one of
// another stripe racing with it is kept (verbs: increments racing with a set may be lost).
void striped_set(slot& s, std::uint64_t v) noexcept {
  s.stripe_array()[0].value.store(v - others_sum<&stripe::value>(s), std::memory_order_seq_cst);
  s.notify();
}
void striped_set_error(slot& s, std::uint64_t v) noexcept {
  s.stripe_array()[0].errors.store(v - others_sum<&stripe::errors>(s), std::memory_order_seq_cst);
  s.notify();
}

std::uint32_t round_up_pow2(std::uint32_t v) noexcept {
  std::uint32_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

} // namespace

// add/add_error are never reached through the table by the library's own code (slot::add tests
// `stripes` first), but a caller holding the table may use it. No refresh: the stripes are the
// counter, read by every read.
const hw_counter_ops striped_counter_ops = {striped_add, striped_add_error, striped_set,
                                            striped_set_error, nullptr};

std::uint32_t stripe_count_slow(std::uint32_t requested) noexcept {
  if (requested == stripes_per_cpu) {
    const long cpus = ::sysconf(_SC_NPROCESSORS_CONF);
    const std::uint32_t n = cpus < 1                   ? 1u
                            : cpus > long{max_stripes} ? max_stripes
                                                       : static_cast<std::uint32_t>(cpus);
    return round_up_pow2(n);
  }
  if (requested > max_stripes) return 0;
  return round_up_pow2(requested);
}

std::error_code make_striped(slot& s, std::uint32_t n) noexcept {
  if (s.hw != nullptr)
    return fail(ENOTSUP, "create_comp_cntr: striped counters need a software counter; device "
                         "counters of this device are native (hardware-backed)");
  stripe* st = new (std::nothrow) stripe[n];
  if (st == nullptr)
    return fail(ENOMEM, "create_comp_cntr: out of memory for %u stripes (%zu bytes)", n,
                sizeof(stripe) * n);
  static_assert(alignof(stripe) > two_stripes_tag, "the tag bit of slot::stripes is free");
  s.stripes = reinterpret_cast<std::uintptr_t>(st) + (n == 2 ? two_stripes_tag : 0);
  s.stripe_mask_ = n - 1;
  s.cpu_offset = rseq_cpu_offset();
  s.hw = &striped_counter_ops;
  return {};
}

void free_stripes(slot& s) noexcept {
  // A shared counter's "stripes" are its cell in the segment: its backend unbinds them.
  if (!s.striped() || s.hw != &striped_counter_ops) return;
  delete[] s.stripe_array();
  s.stripes = 0;
  s.stripe_mask_ = 0;
  s.hw = nullptr;
}

} // namespace compcntr::detail
