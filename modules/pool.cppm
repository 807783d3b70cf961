// compcntr:pool -- where slots live.
//
// Purpose: hand out and take back 128-byte counter slots, many per arena, without a lock on the
// create/destroy path. Knows nothing about devices or waiting.
//
// Requirements: a slot is released exactly once, by the owner that allocated it.
// Guarantees:
//   * allocate() and release() are lock-free once the arena holding the slot exists (a Treiber
//     stack of slot indices whose head carries a 32-bit tag against ABA, plus a bump index for
//     never-used slots). Growing by one arena takes a mutex, once per arena_slots counters.
//   * a slot handed out reads value 0, errors 0, refs 1, and a generation different from any
//     handle taken before its last release.
//   * capacity is exact: at most capacity() slots are live at once; one more is ENOMEM and
//     changes nothing.
//   * arena memory is never returned before the pool dies, so a stale index is always safe to
//     dereference (its generation tells it is stale).
// Memory ordering: release() publishes the slot's last state with a release CAS on the free
// list head; allocate() acquires it with its CAS, then resets the slot before handing it out.
module;
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <system_error>
export module compcntr:pool;
import :cache_padded;
import :slot;

export namespace compcntr::detail {

class slot_pool {
 public:
  /// Slots per arena: 4096 x 128 B = 512 KiB, large enough to amortise the arena allocation and
  /// small enough that an idle device does not pin megabytes.
  static constexpr std::uint32_t arena_slots = 4096;
  /// Hard upper bound on capacity (index space; the free-list head packs an index into 32 bits).
  static constexpr std::uint32_t max_capacity = 0xfffff000u;

  explicit slot_pool(std::uint32_t capacity) noexcept;
  ~slot_pool();
  slot_pool(const slot_pool&) = delete;
  slot_pool& operator=(const slot_pool&) = delete;

  /// A reset slot (refs == 1), or nullptr with ec = ENOMEM (capacity reached, or no memory for
  /// a new arena). `numa_node` < 0 means the node of the calling thread.
  slot* allocate(int numa_node, std::error_code& ec) noexcept;
  /// Returns `s` to the pool; its generation is bumped first.
  void release(slot& s) noexcept;
  /// The slot at `index` (live or not), or nullptr if no arena holds it.
  slot* find(std::uint32_t index) const noexcept;

  std::uint32_t capacity() const noexcept { return capacity_; }
  std::uint32_t live() const noexcept { return live_->load(std::memory_order_relaxed); }
  /// NUMA nodes slots can be placed on.
  int numa_nodes() const noexcept { return 1; }

 private:
  slot* fresh_slot() noexcept;
  slot* pop_free() noexcept;
  void push_free(slot& s) noexcept;

  std::uint32_t capacity_;
  std::uint32_t arena_count_;
  std::unique_ptr<std::atomic<slot*>[]> arenas_;
  cache_padded<std::atomic<std::uint64_t>> free_head_;  ///< tag << 32 | (index + 1); 0 = empty
  cache_padded<std::atomic<std::uint32_t>> fresh_;      ///< next never-used index
  cache_padded<std::atomic<std::uint32_t>> live_;       ///< slots handed out
  std::mutex grow_;                                     ///< arena creation only
};

}  // namespace compcntr::detail
