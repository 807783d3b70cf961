// compcntr:lifetime -- when a counter's slot lives, who may hold it, and who frees it.
//
// Purpose: every rule about a slot's references, pins and generation, in one place (this
// partition and src/core/lifetime.cpp). The other layers only call the functions below.
//
// The words of compcntr:slot involved: refs (the owner + 1 per holder that keeps the counter
// alive: QP attachments, counter_refs, a CQ bridge binding), pins (transient holds that keep a
// destroyed counter's slot bound: in-flight async queries, watching refreshers; low 31 bits a
// count, bit 31 pins_dead), generation (names one owner of the slot: counter_id).
//
// Transitions (each happens exactly once per counter unless marked "repeat"):
//   free     --allocate, reset_slot-->   live: refs = 1 (the owner), pins = 0, generation g
//   live     --take_counter_ref-->       live: refs + 1, only while refs > 0 (repeat)
//   live     --unref_counter_slot-->     live: refs - 1 (repeat) ... or, by the last one:
//   live     --destroy_counter_slot-->   refs 1 -> 0 in one CAS, EBUSY (nothing changes) if any
//                                        holder besides the owner exists
//   refs 0   --(free path)-->            no reference can be taken any more (take_counter_ref
//                                        sees 0); no pin held: finish (a load, no RMW: nobody
//                                        can pin now); else pins |= pins_dead, and finish if the
//                                        pins were dropped meanwhile
//   pinned   --pin_slot / unpin_slot-->  pins +/- 1 (repeat; pin only while holding a live
//                                        reference); the unpin that leaves pins == pins_dead
//                                        finishes
//   finish   stripes freed, backend unbind_counter, slot extension freed (its fd closed), g -> g+1,
//            slot back to the pool (free), the counter's device reference dropped
// Requirements: pin_slot only with a live reference in hand; every take/pin is undone once.
// Guarantees: finish runs exactly once per counter, in whichever thread drops the last hold;
// a counter_id taken from one owner never matches a later owner (64-bit generation); a refused
// destroy (EBUSY) changes nothing.
// Memory ordering: refs and pins RMWs are acq_rel (take: acq_rel CAS; drop, destroy, pins_dead,
// unpin: acq_rel), so the thread that finishes sees every holder's writes. reset_slot's refs = 1
// is a release store: a resolver whose acquire CAS reads it also sees the generation bump of the
// slot's previous finish, which is sequenced before the pool's release push (slot_pool::release)
// that the allocating pop acquired. The bump itself is a relaxed load + store (the finishing
// thread is the only writer; resolvers only read it).
//
// Example (what a holder does; the public types do this for you):
//     if (detail::take_counter_ref(s)) { /* count into s */ detail::unref_counter_slot(s); }
module;
#include <atomic>
#include <cstdint>
#include <system_error>
export module compcntr:lifetime;
import :slot;
import :types;

namespace compcntr::detail {

class slot_pool;

/// Bit of slot::pins: the counter's last reference is gone; the last unpin finishes the slot.
inline constexpr std::uint32_t pins_dead = 1u << 31;

/// Stores `v` into `field` unless it holds `v` already (reset_slot).
template <class T, class V>
[[gnu::always_inline]] inline void reset_field(T& field, V v) noexcept {
  if (field != v) [[unlikely]]
    field = v;
}
template <class T, class V>
[[gnu::always_inline]] inline void reset_field(std::atomic<T>& field, V v) noexcept {
  if (field.load(std::memory_order_relaxed) != v) [[unlikely]]
    field.store(v, std::memory_order_relaxed);
}

/// Resets a slot for a new owner (free -> live). Called by the pool before it hands a slot out.
/// No owner can reach the slot then, so relaxed stores suffice for the owner's data (handing
/// the counter to its user publishes them), except refs = 1 (release: see the file comment; a
/// resolver of a stale counter_id may CAS it concurrently, succeeding only on refs > 0).
/// The values are stored; the other fields only if a previous owner left them changed (the
/// free path leaves them reset but for pins_dead, a watch bit or a native backend's pointer):
/// every store sits in the store buffer until the next locked instruction drains it, so a
/// field already clean costs a load instead (bench P7, one at a time). `dev` and `type` are
/// the creating device's to set (a pool serves one device, so `dev` rarely changes).
inline void reset_slot(slot& s) noexcept {
  s.value.store(0, std::memory_order_relaxed);
  s.errors.store(0, std::memory_order_relaxed);
  reset_field(s.watch, 0u);
  reset_field(s.hw, nullptr);
  reset_field(s.pins, 0u);
  reset_field(s.backend_data, nullptr);
  reset_field(s.ext, nullptr);
  reset_field(s.stripes, std::uintptr_t{0});
  reset_field(s.stripe_mask_, 0u);
  s.refs.store(1, std::memory_order_release);
}

/// One more reference to a live counter (refs + 1); false if its last reference is already
/// gone (refs == 0: being destroyed, or free). Memory ordering: acq_rel CAS loop.
inline bool take_counter_ref(slot& s) noexcept {
  std::uint32_t r = s.refs.load(std::memory_order_acquire);
  do {
    if (r == 0) return false;
  } while (!s.refs.compare_exchange_weak(r, r + 1, std::memory_order_acq_rel,
                                         std::memory_order_acquire));
  return true;
}

/// Drops one reference; the last one starts the free path. Memory ordering: acq_rel decrement.
void unref_counter_slot(slot& s) noexcept;

/// The owner's checked destroy: refs 1 -> 0 in one CAS and the free path, or EBUSY (with a
/// message naming the holders) and nothing changes when anyone besides the owner holds the
/// counter. An attach or resolve racing with it either happened before (EBUSY) or finds refs 0.
std::error_code destroy_counter_slot(slot& s) noexcept;

/// Holds a slot bound past its counter's destruction (pins + 1). The caller must hold a live
/// reference at the time of the call. Memory ordering: relaxed (unpin_slot's acq_rel RMW orders
/// the holder's reads before the finish).
inline void pin_slot(slot& s) noexcept { s.pins.fetch_add(1, std::memory_order_relaxed); }
/// Drops a pin; the last one after the counter's last reference finishes the slot.
void unpin_slot(slot& s) noexcept;
/// Whether the counter's last reference is gone (only pins keep the slot bound). Memory
/// ordering: acquire load of pins.
inline bool counter_gone(const slot& s) noexcept {
  return (s.pins.load(std::memory_order_acquire) & pins_dead) != 0;
}

/// device::resolve: the slot `id` names with one more reference, or nullptr and ec (EINVAL: no
/// such slot; ESTALE: the id's counter was destroyed). Race semantics: compcntr:counter_ref.
slot* resolve_counter_slot(slot_pool& pool, counter_id id, std::error_code& ec) noexcept;

} // namespace compcntr::detail
