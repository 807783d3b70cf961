// Counter destruction (compcntr:counter).
module;
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <system_error>
#include <utility>
module compcntr;

namespace compcntr {

void counter::destroy(std::error_code& ec) noexcept {
  // Only the owner's reference may remain: refs 1 -> 0 in one CAS, so an attach racing with
  // this destroy either happened before (EBUSY) or fails because the counter is gone.
  std::uint32_t expected = 1;
  if (!s_->refs.compare_exchange_strong(expected, 0, std::memory_order_acq_rel,
                                        std::memory_order_acquire)) {
    detail::fail_into(ec, EBUSY, "destroy_comp_cntr: counter %u is still attached to %u QP(s)",
                      s_->index, expected - 1);
    return;
  }
  // refs stays 0 from here on: an attach that looks now sees 0 and is refused. (Storing 1 back
  // and dropping it with unref_counter_slot would reopen a window in which an attach succeeds on
  // a counter being destroyed.)
  detail::slot* s = std::exchange(s_, nullptr);
  detail::free_counter_slot(*s);
  ec.clear();
}

void counter::reset() noexcept {
  if (detail::slot* s = std::exchange(s_, nullptr)) detail::unref_counter_slot(*s);
}

namespace detail {

void unref_counter_slot(slot& s) noexcept {
  if (s.refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  free_counter_slot(s);
}

void free_counter_slot(slot& s) noexcept {
  device_core* dev = s.owner;
  dev->be().unbind_counter(s);
  free_slot_ext(s);  // the counter's fd and poll registrations block (compcntr:wait)
  dev->pool().release(s);
  dev->release();
}

}  // namespace detail
}  // namespace compcntr
