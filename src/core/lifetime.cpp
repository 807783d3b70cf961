// Slot lifetime (compcntr:lifetime): the free path, pins, the checked destroy and id
// resolution. The transitions and their memory ordering are stated in modules/core/lifetime.cppm.
module;
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <system_error>
#include <utility>
module compcntr;

namespace compcntr::detail {

namespace {
// finish: unbinds the slot from its backend, frees its extension block, bumps the generation,
// returns the slot to the pool, which drops the device reference the counter held (the pool's
// live count is part of the device's reference count: device_core::retain). Runs exactly
// once per counter, in whichever thread drops the last hold.
void finish_counter_slot(slot& s) noexcept {
  device_core* dev = s.dev;
  if (s.striped()) free_stripes(s);  // hw back to nullptr, as the backend bound it
  if (dev->binds_counters()) dev->be().unbind_counter(s);
  free_slot_ext(s);  // the counter's fd and poll registrations block (compcntr:wait)
  // The finishing thread is the slot's only writer now (refs is 0): a plain load + store, not a
  // locked RMW. Concurrent resolvers only read it; the pool's release push publishes it.
  s.generation.store(s.generation.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  dev->release_counter_slot(s);  // the slot's live count was the device's reference too
}

// The free path, after the last reference (owner, QPs, refs) is gone. Transient pins
// (in-flight async queries, refreshers) keep the slot bound until the last of them is dropped:
// mark it dead; if no pin is held now, finish here, else unpin_slot() finishes. Memory
// ordering: acq_rel RMWs on `pins` on both sides, so exactly one side sees the other's update
// and whoever finishes sees every prior write.
void free_counter_slot(slot& s) noexcept {
  // Armed triggers are cancelled now, not at finish (pins may delay that): nothing of the
  // counter's runs after its destroy returns (compcntr:trigger). Only a counter with an
  // extension block can have any: one load of a line the finish reads anyway.
  if (s.ext.load(std::memory_order_acquire) != nullptr) [[unlikely]]
    end_slot_triggers(s);
  // No pin held (the common case): nobody can take one any more -- pin_slot needs a live
  // reference and the last one is gone -- so the slot is finished without a locked RMW. The
  // acquire load pairs with the last unpin's acq_rel decrement (its reads happen before the
  // finish) and sees every pin a reference holder took (its pin is sequenced before its
  // reference drop, which the last drop's acq_rel RMW read). Otherwise the pins_dead protocol.
  if (s.pins.load(std::memory_order_acquire) != 0 &&
      s.pins.fetch_or(pins_dead, std::memory_order_acq_rel) != 0)
    return;
  finish_counter_slot(s);
}
} // namespace

void unref_counter_slot(slot& s) noexcept {
  if (s.refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  free_counter_slot(s);
}

std::error_code destroy_counter_slot(slot& s) noexcept {
  // Only the owner's reference may remain: refs 1 -> 0 in one CAS, so an attach or a resolve()
  // racing with this destroy either happened before (EBUSY) or fails because the counter is gone.
  std::uint32_t expected = 1;
  if (!s.refs.compare_exchange_strong(expected, 0, std::memory_order_acq_rel,
                                      std::memory_order_acquire))
    return fail(
        EBUSY,
        "destroy_comp_cntr: counter %u is still attached to a QP or held by a "
        "counter_ref, a credit tracker or a completion tracker (%u reference(s) besides its "
        "owner's)",
        s.index, expected - 1);
  // refs stays 0 from here on: an attach or a resolve() that looks now sees 0 and is refused.
  // (Storing 1 back and dropping it with unref_counter_slot would reopen a window in which an
  // attach or a resolve() succeeds on a counter being destroyed.)
  free_counter_slot(s);
  return {};
}

void unpin_slot(slot& s) noexcept {
  if (s.pins.fetch_sub(1, std::memory_order_acq_rel) == (pins_dead | 1u)) finish_counter_slot(s);
}

slot* resolve_counter_slot(slot_pool& pool, counter_id h, std::error_code& ec) noexcept {
  slot* s = pool.find(h.index);
  if (!s) {
    fail_into(ec, EINVAL,
              "resolve: counter id {index %u, generation %llu} names no counter "
              "slot of this device",
              h.index, static_cast<unsigned long long>(h.generation));
    return nullptr;
  }
  auto stale = [&] {
    const std::uint64_t now = s->generation.load(std::memory_order_relaxed);
    fail_into(ec, ESTALE,
              "resolve: counter id {index %u, generation %llu} is stale: its "
              "counter was destroyed (slot %u is at generation %llu)",
              h.index, static_cast<unsigned long long>(h.generation), h.index,
              static_cast<unsigned long long>(now));
    return static_cast<slot*>(nullptr);
  };
  // 1. The common stale case (destroyed earlier) is rejected without touching refs.
  std::uint64_t gen = s->generation.load(std::memory_order_acquire);
  if (gen != h.generation) return stale();
  // 2. Take a reference, but never revive a counter whose last reference is gone (refs == 0:
  //    being destroyed, or free in the pool).
  if (!take_counter_ref(*s)) return stale();
  // 3. The reference is on the id's counter unless the slot was recycled between 1 and 2:
  //    our CAS read refs written by (or after) the new owner's reset_slot (release), so the
  //    generation bump of the recycling release is visible here.
  gen = s->generation.load(std::memory_order_acquire);
  if (gen != h.generation) {
    unref_counter_slot(*s); // the new owner's counter: drop what we took, touch nothing else
    return stale();
  }
  ec.clear();
  return s;
}

} // namespace compcntr::detail
