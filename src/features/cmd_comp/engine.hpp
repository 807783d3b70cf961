// Internals of the software command completion: the command engine, the software cmd_comp and
// its node arena. Included only by src/features/cmd_comp/engine.cpp, in the module purview (after
// `module compcntr;`); that unit's global module fragment provides <atomic>, <cstdint>,
// <mutex>, <span>, <system_error>, <thread> and <sys/mman.h>. Do not include it from a second
// unit: clang emits the vtable and out-of-line members of module-attached classes in every unit
// that defines them.
//
// Data path of one query, with the queue that carries it at each step:
//
//   issuing threads --(pending: Treiber stack, one CAS per batch)--> engine thread
//   engine thread   --(ready: Treiber stack, one CAS per answered chain)--> consumer
//   consumer        --(private FIFO list, no atomics)--> get()
//
// * Producers push a pre-linked chain (newest first) onto `pending` and schedule the cmd_comp on
//   the engine's run queue unless it is already scheduled (`scheduled` flag), so a burst of
//   queries costs one run-queue push and at most one futex wake of the engine.
// * The engine takes the whole `pending` stack at once (exchange, so no ABA), asks the backend
//   for the values in batches of command_engine_batch slots, and pushes the chain unchanged onto
//   `ready`: consumer order is restored by reversing once per grab, which yields per-producer
//   FIFO order.
// * `ready_count` is the number of responses the consumer may pop. Changes that keep it above 0
//   are lock-free CASes; a change across 0 happens only under `signal_mu`, together with the
//   eventfd: 0 -> k sets the fd first, then the count (only the engine adds, so the count is
//   still 0 under the lock); k -> 0 drops the count, then clears the fd unless the engine added
//   in between. Hence fd readable <=> ready_count > 0 whenever no transition holds the lock, and
//   every reader that finds 0 confirms it under the lock (queued(), ready(), try_get()), so no
//   caller ever sees the fd readable and the queue empty, or the opposite, except through a
//   concurrent consumer.
// * Back-pressure: `outstanding` counts accepted queries until their response is popped; a CAS
//   loop admits a query only if it stays <= max_outstanding_queries (1 MiB of out_data). Nodes
//   come from a fixed arena of exactly that many, allocated lazily page by page (mmap), with a
//   lock-free free list (a tagged index stack, src/core/tagged_index_stack.hpp): a node is freed before `outstanding` drops, so an admitted
//   query always finds one.
#ifndef COMPCNTR_SRC_CMD_COMP_ENGINE_HPP
#define COMPCNTR_SRC_CMD_COMP_ENGINE_HPP

namespace compcntr::detail {

// ---- nodes ----------------------------------------------------------------------------------

/// One query from issue to get. Lives in its cmd_comp's node_arena.
struct query_node {
  query_node* next = nullptr; ///< chain link; written only by the node's holder
  std::atomic<std::uint32_t> free_next{0}; ///< free-list link (index + 1, 0 = end)
  std::uint32_t index = 0; ///< position in the arena
  std::uint64_t wr_id = 0;
  slot* s = nullptr; ///< pinned from issue until answered
  counter_values values;
};

static_assert(sizeof(query_node) == 48, "3 MiB of address space per cmd_comp");

/// max_outstanding_queries nodes in one anonymous mapping: pages become resident only when a
/// node on them is first used, so an idle cmd_comp costs a few KiB, a full one 3 MiB.
/// Requirements: at most capacity nodes live (guaranteed by cmd_comp admission).
/// Guarantees: alloc/free are lock-free (tagged index stack + bump index).
class node_arena {
 public:
  static constexpr std::uint32_t capacity = max_outstanding_queries;

  bool map() noexcept {
    void* p = ::mmap(nullptr, bytes(), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return false;
    nodes_ = static_cast<query_node*>(p);
    return true;
  }
  ~node_arena() {
    if (nodes_) ::munmap(nodes_, bytes()); // query_node is trivially destructible
  }

  /// A free node. Spins only while another thread is returning the node admission promised.
  query_node* alloc() noexcept {
    for (;;) {
      if (query_node* n = pop_free()) return n;
      std::uint32_t f = fresh_.load(std::memory_order_relaxed);
      while (f < capacity) {
        if (fresh_.compare_exchange_weak(f, f + 1, std::memory_order_relaxed)) {
          query_node* n = new (&nodes_[f]) query_node;
          n->index = f;
          return n;
        }
      }
      cpu_relax();
    }
  }

  /// Memory ordering: release (tagged_push), so the next owner (acquire in pop_free) sees this
  /// one's writes.
  void free(query_node* n) noexcept { tagged_push(head_, n->index, link()); }

 private:
  static constexpr std::size_t bytes() noexcept { return sizeof(query_node) * capacity; }
  /// The free list's link of node i (the arena is mapped for the cmd_comp's whole life).
  struct free_link {
    query_node* nodes;
    std::atomic<std::uint32_t>& operator()(std::uint32_t i) const noexcept {
      return nodes[i].free_next;
    }
  };
  free_link link() const noexcept { return {nodes_}; }
  query_node* pop_free() noexcept {
    const std::uint32_t top = tagged_pop(head_, link());
    return top != 0 ? &nodes_[top - 1] : nullptr;
  }

  query_node* nodes_ = nullptr;
  alignas(false_sharing_range) std::atomic<std::uint64_t> head_{0}; ///< tag << 32 | (index + 1)
  alignas(false_sharing_range) std::atomic<std::uint32_t> fresh_{0}; ///< next never-used index
};

// ---- the engine -----------------------------------------------------------------------------

class engine_cmd_comp;

/// The thread that answers a device's software asynchronous commands: a service of its device
/// (device_engine() attaches it on first use; the device stops it). Reference-counted by its
/// device and by its own thread. The device is never released on the engine thread (a cmd_comp
/// keeps its device reference until its in-flight queries are answered, and the engine's last
/// act on a chain is to say so), but stop() still detaches instead of self-joining if it were.
class command_engine final : public device_service {
 public:
  /// Starts the thread; nullptr + ec if it cannot. `key`: its key among the device's services.
  static command_engine* start(const void* key, std::error_code& ec) noexcept;

  /// Queues `cc` for service. Memory ordering: seq_cst push, then seq_cst load of `sleeping_`;
  /// the engine stores `sleeping_` (seq_cst) before re-checking the queue (seq_cst), so either
  /// the engine sees the push or this call sees the sleeper and wakes it.
  void submit(engine_cmd_comp* cc) noexcept;

  /// The device's side of shutdown: stops the thread after it has drained its run queue, then
  /// drops the device's reference. Joins, or detaches when called on the engine thread itself.
  void stop() noexcept override;
  /// True in a process forked from the one that started this engine: its thread does not exist
  /// here (fork copies only the calling thread). One relaxed load.
  bool foreign() const noexcept;
  /// The process that started the engine (for messages).
  pid_t owner_pid() const noexcept { return pid_; }

 private:
  explicit command_engine(const void* key) noexcept : device_service(key) {}
  ~command_engine() = default;
  void run() noexcept;
  void wake() noexcept;
  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  alignas(false_sharing_range) std::atomic<engine_cmd_comp*> runq_{nullptr};
  alignas(false_sharing_range) std::atomic<std::uint32_t> sleeping_{0};
  std::atomic<std::uint32_t> wake_seq_{0}; ///< futex word
  std::atomic<bool> stop_{false};
  std::atomic<std::uint32_t> refs_{2}; ///< the device + the thread
  std::uint32_t fork_gen_ = 0; ///< fork generation at start (engine.cpp)
  pid_t pid_ = 0;
  std::thread thread_;
};

// ---- the software cmd_comp ------------------------------------------------------------------

class engine_cmd_comp final : public cmd_comp_core {
 public:
  engine_cmd_comp(device_core& dev, command_engine& eng, int efd) noexcept
      : cmd_comp_core(dev), eng_(&eng), efd_(efd) {}

  bool map() noexcept { return arena_.map(); }
  int fd() const noexcept override { return efd_; }
  std::size_t issue(std::span<const slot_query> q, std::error_code& ec) noexcept override;
  std::size_t try_get(std::span<query_response> out, std::error_code& ec) noexcept override;
  bool ready() const noexcept override { return settled_count() != 0; }
  bool probably_ready() const noexcept override {
    return ready_count_.load(std::memory_order_relaxed) != 0;
  }
  std::size_t queued() const noexcept override { return settled_count(); }
  bool orphaned() const noexcept override { return eng_->foreign(); }
  void destroy() noexcept override;

  /// Engine side: answers whatever is pending. Called with an engine reference held.
  void serve() noexcept;
  /// Drops one reference (owner or engine); the last one frees the object.
  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  engine_cmd_comp* run_next = nullptr; ///< run-queue link, owned by the engine's queue

 private:
  ~engine_cmd_comp() = default;
  void answer(query_node* chain) noexcept;
  void publish(std::uint32_t k) noexcept;
  void consumed(std::uint32_t n) noexcept;
  /// ready_count, or 0 confirmed under signal_mu (not in the middle of a 0 -> k transition).
  std::size_t settled_count() const noexcept {
    const std::uint32_t n = ready_count_.load(std::memory_order_acquire);
    if (n != 0) return n;
    std::lock_guard lock(signal_mu_);
    return ready_count_.load(std::memory_order_acquire);
  }

  command_engine* eng_;
  int efd_;
  node_arena arena_;
  // producers -> engine
  alignas(false_sharing_range) std::atomic<query_node*> pending_{nullptr};
  std::atomic<bool> scheduled_{false};
  std::atomic<std::uint32_t> outstanding_{0}; ///< accepted, response not yet popped
  std::atomic<std::uint32_t> unanswered_{0}; ///< accepted, not yet answered or discarded
  // engine -> consumer
  alignas(false_sharing_range) std::atomic<query_node*> ready_{nullptr};
  std::atomic<std::uint32_t> ready_count_{0};
  // consumer
  alignas(false_sharing_range) std::mutex consumer_mu_;
  query_node* private_ = nullptr; ///< oldest first; guarded by consumer_mu_
  // fd state
  mutable std::mutex signal_mu_;
  bool signalled_ = false; ///< eventfd counter > 0; guarded by signal_mu_
  bool closed_ = false; ///< fd closed by destroy; guarded by signal_mu_
  // lifetime
  std::atomic<bool> destroyed_{false};
  std::atomic<std::uint32_t> refs_{1}; ///< owner + 1 while queued on the engine
};

/// The command engine of `dev`, started and attached on first use; nullptr + ec if it cannot
/// start.
command_engine* device_engine(device_core& dev, std::error_code& ec) noexcept;

} // namespace compcntr::detail

#endif
