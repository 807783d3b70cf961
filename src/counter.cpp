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

namespace {
// Unbinds the slot from its backend, returns it to the pool and drops the device reference the
// counter held. Runs exactly once per counter, in whichever thread drops the last hold.
void finish_counter_slot(slot& s) noexcept {
  device_core* dev = s.owner;
  dev->be().unbind_counter(s);
  free_slot_ext(s);  // the counter's fd and poll registrations block (compcntr:wait)
  dev->pool().release(s);
  dev->release();
}
}  // namespace

void unref_counter_slot(slot& s) noexcept {
  if (s.refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  free_counter_slot(s);
}

void free_counter_slot(slot& s) noexcept {
  // Last reference (owner, QPs) gone. Transient pins (in-flight async queries, refreshers) keep
  // the slot bound until the last of them is dropped: mark it dead; if no pin is held now, finish
  // here, else unpin_slot() finishes. Memory ordering: acq_rel RMWs on `pins` on both sides, so
  // exactly one side sees the other's update and whoever finishes sees every prior write.
  if (s.pins.fetch_or(pins_dead, std::memory_order_acq_rel) != 0) return;
  finish_counter_slot(s);
}

void unpin_slot(slot& s) noexcept {
  if (s.pins.fetch_sub(1, std::memory_order_acq_rel) == (pins_dead | 1u)) finish_counter_slot(s);
}

}  // namespace detail
}  // namespace compcntr
