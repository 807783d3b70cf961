// The tagged index stack: the one lock-free free list of compcntr (the slot pool's per-node free
// lists, src/core/pool.cpp, and the command engine's query nodes, src/features/cmd_comp/engine.hpp).
//
// Purpose: a Treiber stack of 32-bit indices into storage that is never freed while the stack
// lives (pool arenas, the node arena), linked through an atomic 32-bit "next" word of each entry.
// The head is one 64-bit word, tag << 32 | (index + 1), 0 = empty: every push and pop increments
// the tag, so a CAS whose head changed in any way since it was read fails (ABA). A 32-bit tag can
// only be fooled by a thread stalled between its load and its CAS while exactly a multiple of
// 2^32 pushes and pops hit the stack.
// Requirements: an index is pushed only by the thread that holds its entry (popped it, or took
// it fresh); link_of(i) is valid for every index ever pushed, even while another thread reuses i.
// Guarantees: push and pop are lock-free; pop returns each pushed index once per push.
// Memory ordering: push is a release CAS, pop an acquire CAS (and acquire load of the head), so
// the next holder of an index sees everything its previous holder wrote before pushing it. The
// entries' links are relaxed: the tag, not the link's ordering, protects a pop that read a link
// of an entry popped and re-pushed meanwhile.
//
//     std::atomic<std::uint64_t> head{0};
//     tagged_push(head, 7, link_of);                   // link_of(i) -> std::atomic<uint32_t>&
//     std::uint32_t top = tagged_pop(head, link_of);   // 8 (= index + 1); 0 when empty
#ifndef COMPCNTR_SRC_CORE_TAGGED_INDEX_STACK_HPP
#define COMPCNTR_SRC_CORE_TAGGED_INDEX_STACK_HPP

#include <atomic>
#include <cstdint>

namespace compcntr::detail {

/// The head after one more operation: the old head's tag + 1, and `top` (index + 1, 0 = empty).
constexpr std::uint64_t tagged_next(std::uint64_t head, std::uint32_t top) noexcept {
  return (((head >> 32) + 1) << 32) | top;
}

/// Pushes `index` (its entry held by the caller). Release: see the file comment.
template <class LinkOf>
inline void tagged_push(std::atomic<std::uint64_t>& head, std::uint32_t index,
                        LinkOf&& link_of) noexcept {
  std::atomic<std::uint32_t>& link = link_of(index);
  std::uint64_t h = head.load(std::memory_order_relaxed);
  do {
    link.store(static_cast<std::uint32_t>(h), std::memory_order_relaxed);
  } while (!head.compare_exchange_weak(h, tagged_next(h, index + 1), std::memory_order_release,
                                       std::memory_order_relaxed));
}

/// Pops the top index; returns index + 1, or 0 when the stack is empty. `popped(next)` runs once
/// on success with the new top (index + 1, 0 = empty: a caller may prefetch the next entry).
/// Acquire: see the file comment.
template <class LinkOf, class Popped>
inline std::uint32_t tagged_pop(std::atomic<std::uint64_t>& head, LinkOf&& link_of,
                                Popped&& popped) noexcept {
  std::uint64_t h = head.load(std::memory_order_acquire);
  while (static_cast<std::uint32_t>(h) != 0) {
    const std::uint32_t top = static_cast<std::uint32_t>(h);
    // The entry may be popped and reused concurrently: its link is atomic and the tag makes the
    // CAS fail if the head changed since it was read.
    const std::uint32_t next = link_of(top - 1).load(std::memory_order_relaxed);
    if (head.compare_exchange_weak(h, tagged_next(h, next), std::memory_order_acquire,
                                   std::memory_order_acquire)) {
      popped(next);
      return top;
    }
  }
  return 0;
}

template <class LinkOf>
inline std::uint32_t tagged_pop(std::atomic<std::uint64_t>& head, LinkOf&& link_of) noexcept {
  return tagged_pop(head, link_of, [](std::uint32_t) noexcept {});
}

} // namespace compcntr::detail

#endif // COMPCNTR_SRC_CORE_TAGGED_INDEX_STACK_HPP
