// Slot pool (compcntr:pool): a tagged Treiber stack of slot indices over lazily created arenas.
module;
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <system_error>
module compcntr;

namespace compcntr::detail {

namespace {
constexpr std::uint64_t pack(std::uint32_t tag, std::uint32_t link) noexcept {
  return (std::uint64_t{tag} << 32) | link;
}
constexpr std::uint32_t link_of(std::uint64_t head) noexcept { return static_cast<std::uint32_t>(head); }
constexpr std::uint32_t tag_of(std::uint64_t head) noexcept { return static_cast<std::uint32_t>(head >> 32); }
}  // namespace

slot_pool::slot_pool(std::uint32_t capacity) noexcept
    : capacity_(capacity > max_capacity ? max_capacity : capacity),
      arena_count_((capacity_ + arena_slots - 1) / arena_slots),
      arenas_(new (std::nothrow) std::atomic<slot*>[arena_count_ ? arena_count_ : 1]) {
  if (!arenas_) capacity_ = arena_count_ = 0;  // every allocate() then fails with ENOMEM
  for (std::uint32_t a = 0; a < arena_count_; ++a) arenas_[a].store(nullptr, std::memory_order_relaxed);
}

slot_pool::~slot_pool() {
  for (std::uint32_t a = 0; a < arena_count_; ++a) {
    slot* arena = arenas_[a].load(std::memory_order_relaxed);
    if (!arena) continue;
    for (std::uint32_t i = 0; i < arena_slots; ++i) arena[i].~slot();
    std::free(arena);
  }
}

slot* slot_pool::find(std::uint32_t index) const noexcept {
  const std::uint32_t a = index / arena_slots;
  if (a >= arena_count_) return nullptr;
  slot* arena = arenas_[a].load(std::memory_order_acquire);
  return arena ? &arena[index % arena_slots] : nullptr;
}

slot* slot_pool::pop_free() noexcept {
  std::uint64_t head = free_head_->load(std::memory_order_acquire);
  while (link_of(head) != 0) {
    slot* s = find(link_of(head) - 1);
    // Safe even if `s` was popped by another thread meanwhile: arenas are never freed, and the
    // tag makes the CAS fail if the head changed in any way since we read it (ABA).
    const std::uint32_t next = s->next_free.load(std::memory_order_relaxed);
    if (free_head_->compare_exchange_weak(head, pack(tag_of(head) + 1, next),
                                          std::memory_order_acquire, std::memory_order_acquire))
      return s;
  }
  return nullptr;
}

void slot_pool::push_free(slot& s) noexcept {
  std::uint64_t head = free_head_->load(std::memory_order_relaxed);
  do {
    s.next_free.store(link_of(head), std::memory_order_relaxed);
  } while (!free_head_->compare_exchange_weak(head, pack(tag_of(head) + 1, s.index + 1),
                                              std::memory_order_release, std::memory_order_relaxed));
}

slot* slot_pool::fresh_slot() noexcept {
  const std::uint32_t index = fresh_->fetch_add(1, std::memory_order_relaxed);
  // live_ was reserved first, so at most capacity_ distinct slots are ever created (see
  // allocate()); index < capacity_ always holds here.
  const std::uint32_t a = index / arena_slots;
  slot* arena = arenas_[a].load(std::memory_order_acquire);
  if (!arena) {
    std::lock_guard lock(grow_);
    arena = arenas_[a].load(std::memory_order_acquire);
    if (!arena) {
      void* mem = std::aligned_alloc(alignof(slot), sizeof(slot) * arena_slots);
      if (!mem) return nullptr;
      arena = static_cast<slot*>(mem);
      for (std::uint32_t i = 0; i < arena_slots; ++i) {
        slot* s = new (&arena[i]) slot;
        s->index = a * arena_slots + i;
      }
      arenas_[a].store(arena, std::memory_order_release);
    }
  }
  return &arena[index % arena_slots];
}

slot* slot_pool::allocate(int /*numa_node*/, std::error_code& ec) noexcept {
  // Reserve first: with live_ <= capacity_ the free list is only empty when every created slot
  // is live or being returned, so fresh indices never exceed capacity_.
  if (live_->fetch_add(1, std::memory_order_relaxed) >= capacity_) {
    live_->fetch_sub(1, std::memory_order_relaxed);
    fail_into(ec, ENOMEM, "counter pool is full: %u counters live (max_counters; set "
              "COMPCNTR_MAX_COUNTERS before opening the device to change it)", capacity_);
    return nullptr;
  }
  slot* s = pop_free();
  if (!s) s = fresh_slot();
  if (!s) {
    live_->fetch_sub(1, std::memory_order_relaxed);
    fail_into(ec, ENOMEM, "out of memory for a new arena of %u counter slots", arena_slots);
    return nullptr;
  }
  reset_slot(*s);
  return s;
}

void slot_pool::release(slot& s) noexcept {
  s.generation.fetch_add(1, std::memory_order_relaxed);
  push_free(s);
  live_->fetch_sub(1, std::memory_order_release);
}

}  // namespace compcntr::detail
