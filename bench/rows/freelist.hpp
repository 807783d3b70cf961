// P7's reference: the least a lock-free pool of 128-byte blocks can do per create+destroy pair.
//
// A Treiber stack of block indices over one array of 128-byte blocks: head = 32-bit tag << 32 |
// (index + 1) (0 = empty; the tag defeats ABA), each free block's first word holds the next
// index + 1. pop() is one acquire load of the head, one relaxed load of the block's link and one
// CAS; push() is one store of the link and one release CAS. Nothing else: no capacity count, no
// reset of the block, no generation, no NUMA choice -- what compcntr's pool does on top of this
// is what the ratio to it measures. Used by bench row P7 and by opcount (callgrind).
#pragma once

#include <sys/mman.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>

namespace bench::rows {

struct alignas(128) block128 {
  std::atomic<std::uint32_t> next{0};  ///< index + 1 of the next free block, 0 = end
  unsigned char rest[124];
};
static_assert(sizeof(block128) == 128);

class free_list {
 public:
  /// Blocks [0, n) of `mem` (n 128-byte blocks, suitably aligned), all free, in index order.
  free_list(block128* mem, std::uint32_t n) noexcept : blocks_(mem) {
    for (std::uint32_t i = n; i-- > 0;) push(blocks_[i]);
  }
  /// An empty list over `mem` (blocks enter it through push()).
  explicit free_list(block128* mem) noexcept : blocks_(mem) {}

  __attribute__((always_inline)) inline block128* pop() noexcept {
    std::uint64_t h = head_.load(std::memory_order_acquire);
    while (static_cast<std::uint32_t>(h) != 0) {
      block128* b = &blocks_[static_cast<std::uint32_t>(h) - 1];
      const std::uint32_t next = b->next.load(std::memory_order_relaxed);
      if (head_.compare_exchange_weak(h, ((h >> 32) + 1) << 32 | next, std::memory_order_acquire,
                                      std::memory_order_acquire))
        return b;
    }
    return nullptr;
  }
  __attribute__((always_inline)) inline void push(block128& b) noexcept {
    const std::uint32_t self = static_cast<std::uint32_t>(&b - blocks_) + 1;
    std::uint64_t h = head_.load(std::memory_order_relaxed);
    do {
      b.next.store(static_cast<std::uint32_t>(h), std::memory_order_relaxed);
    } while (!head_.compare_exchange_weak(h, ((h >> 32) + 1) << 32 | self,
                                          std::memory_order_release, std::memory_order_relaxed));
  }

 private:
  block128* blocks_;
  alignas(128) std::atomic<std::uint64_t> head_{0};
};

/// n blocks of fresh anonymous memory (not yet touched: first use faults its pages in, as a
/// pool's new arenas do), or nullptr. Free with unmap_blocks.
inline block128* map_blocks(std::size_t n) noexcept {
  void* p = ::mmap(nullptr, n * sizeof(block128), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<block128*>(p);
}
inline void unmap_blocks(block128* p, std::size_t n) noexcept {
  if (p) ::munmap(p, n * sizeof(block128));
}

} // namespace bench::rows
