// The command engine (one thread per device, started on first use) and the software cmd_comp it
// serves (compcntr:cmd_comp).
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
//   tagged lock-free free list: a node is freed before `outstanding` drops, so an admitted
//   query always finds one.
module;
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <linux/futex.h>
#include <mutex>
#include <new>
#include <pthread.h>
#include <span>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <system_error>
#include <thread>
#include <unistd.h>
module compcntr;

namespace compcntr::detail {

namespace {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected) noexcept {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected,
            nullptr, nullptr, 0);
}
void futex_wake_all(std::atomic<std::uint32_t>& word) noexcept {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX,
            nullptr, nullptr, 0);
}

/// Idle polls of the run queue before the engine sleeps in the kernel: about 50-100 us with
/// `pause`, long enough to catch the next batch of an issue/collect loop without a futex wake
/// (which costs the issuer a syscall and the engine a scheduler round trip).
constexpr unsigned engine_spin_polls = 2000;

}  // namespace

// ---- nodes ----------------------------------------------------------------------------------

/// One query from issue to get. Lives in its cmd_comp's node_arena.
struct query_node {
  query_node* next = nullptr;             ///< chain link; written only by the node's holder
  std::atomic<std::uint32_t> free_next{0};///< free-list link (index + 1, 0 = end)
  std::uint32_t index = 0;                ///< position in the arena
  std::uint64_t wr_id = 0;
  slot* s = nullptr;                      ///< pinned from issue until answered
  counter_values values;
};

/// max_outstanding_queries nodes in one anonymous mapping: pages become resident only when a
/// node on them is first used, so an idle cmd_comp costs a few KiB, a full one 3 MiB.
/// Requirements: at most capacity nodes live (guaranteed by cmd_comp admission).
/// Guarantees: alloc/free are lock-free (tagged Treiber stack of indices + bump index).
class node_arena {
 public:
  static constexpr std::uint32_t capacity = max_outstanding_queries;

  bool map() noexcept {
    void* p = ::mmap(nullptr, bytes(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    nodes_ = static_cast<query_node*>(p);
    return true;
  }
  ~node_arena() {
    if (nodes_) ::munmap(nodes_, bytes());  // query_node is trivially destructible
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

  /// Memory ordering: release CAS, so the next owner (acquire in pop_free) sees this one's writes.
  void free(query_node* n) noexcept {
    std::uint64_t head = head_.load(std::memory_order_relaxed);
    do {
      n->free_next.store(static_cast<std::uint32_t>(head), std::memory_order_relaxed);
    } while (!head_.compare_exchange_weak(head, next_tag(head) | (n->index + 1),
                                          std::memory_order_release, std::memory_order_relaxed));
  }

 private:
  static constexpr std::size_t bytes() noexcept { return sizeof(query_node) * capacity; }
  static std::uint64_t next_tag(std::uint64_t head) noexcept {
    return ((head >> 32) + 1) << 32;
  }
  query_node* pop_free() noexcept {
    std::uint64_t head = head_.load(std::memory_order_acquire);
    while (static_cast<std::uint32_t>(head) != 0) {
      query_node* n = &nodes_[static_cast<std::uint32_t>(head) - 1];
      // n may be popped and reused concurrently: free_next is atomic and the tag makes our CAS
      // fail if the head changed in any way since we read it (ABA).
      const std::uint32_t next = n->free_next.load(std::memory_order_relaxed);
      if (head_.compare_exchange_weak(head, next_tag(head) | next, std::memory_order_acquire,
                                      std::memory_order_acquire))
        return n;
    }
    return nullptr;
  }

  query_node* nodes_ = nullptr;
  alignas(false_sharing_range) std::atomic<std::uint64_t> head_{0};  ///< tag << 32 | (index + 1)
  alignas(false_sharing_range) std::atomic<std::uint32_t> fresh_{0}; ///< next never-used index
};

// ---- the engine -----------------------------------------------------------------------------

class engine_cmd_comp;

/// The thread that answers a device's software asynchronous commands. Reference-counted by its
/// device and by its own thread, so the device may die on the engine thread itself (when the
/// engine drops the last hold on a counter of an already closed device) without a self-join.
class command_engine {
 public:
  /// Starts the thread; nullptr + ec if it cannot.
  static command_engine* start(std::error_code& ec) noexcept {
    auto* e = new (std::nothrow) command_engine;
    if (!e) {
      fail_into(ec, ENOMEM, "create_cmd_comp: out of memory for the command engine");
      return nullptr;
    }
    try {
      e->thread_ = std::thread([e] {
        ::pthread_setname_np(::pthread_self(), "compcntr-engine");
        e->run();
        e->release();
      });
    } catch (const std::system_error& err) {
      delete e;
      fail_into(ec, err.code().value() ? err.code().value() : EAGAIN,
                "create_cmd_comp: cannot start the command engine thread (%s)", err.what());
      return nullptr;
    }
    return e;
  }

  /// Queues `cc` for service. Memory ordering: seq_cst push, then seq_cst load of `sleeping_`;
  /// the engine stores `sleeping_` (seq_cst) before re-checking the queue (seq_cst), so either
  /// the engine sees the push or this call sees the sleeper and wakes it.
  void submit(engine_cmd_comp* cc) noexcept;

  /// The device's side of shutdown: stops the thread after it has drained its run queue, then
  /// drops the device's reference. Joins, or detaches when called on the engine thread itself.
  void stop() noexcept {
    stop_.store(true, std::memory_order_seq_cst);
    wake();
    if (thread_.get_id() == std::this_thread::get_id())
      thread_.detach();
    else
      thread_.join();
    release();
  }

 private:
  command_engine() noexcept = default;
  void run() noexcept;
  void wake() noexcept {
    wake_seq_.fetch_add(1, std::memory_order_release);
    futex_wake_all(wake_seq_);
  }
  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  alignas(false_sharing_range) std::atomic<engine_cmd_comp*> runq_{nullptr};
  alignas(false_sharing_range) std::atomic<std::uint32_t> sleeping_{0};
  std::atomic<std::uint32_t> wake_seq_{0};  ///< futex word
  std::atomic<bool> stop_{false};
  std::atomic<std::uint32_t> refs_{2};      ///< the device + the thread
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
  void destroy() noexcept override;

  /// Engine side: answers whatever is pending. Called with an engine reference held.
  void serve() noexcept;
  /// Drops one reference (owner or engine); the last one frees the object.
  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  engine_cmd_comp* run_next = nullptr;  ///< run-queue link, owned by the engine's queue

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
  std::atomic<std::uint32_t> outstanding_{0};   ///< accepted, response not yet popped
  std::atomic<std::uint32_t> unanswered_{0};    ///< accepted, not yet answered or discarded
  // engine -> consumer
  alignas(false_sharing_range) std::atomic<query_node*> ready_{nullptr};
  std::atomic<std::uint32_t> ready_count_{0};
  // consumer
  alignas(false_sharing_range) std::mutex consumer_mu_;
  query_node* private_ = nullptr;               ///< oldest first; guarded by consumer_mu_
  // fd state
  mutable std::mutex signal_mu_;
  bool signalled_ = false;                      ///< eventfd counter > 0; guarded by signal_mu_
  bool closed_ = false;                         ///< fd closed by destroy; guarded by signal_mu_
  // lifetime
  std::atomic<bool> destroyed_{false};
  std::atomic<std::uint32_t> refs_{1};          ///< owner + 1 while queued on the engine
};

void command_engine::submit(engine_cmd_comp* cc) noexcept {
  engine_cmd_comp* head = runq_.load(std::memory_order_relaxed);
  do {
    cc->run_next = head;
  } while (!runq_.compare_exchange_weak(head, cc, std::memory_order_seq_cst,
                                        std::memory_order_relaxed));
  if (sleeping_.load(std::memory_order_seq_cst) != 0) wake();
}

void command_engine::run() noexcept {
  unsigned idle = 0;
  for (;;) {
    // Look before taking: spinning on a load keeps the line shared instead of bouncing it
    // between the engine and the issuing threads' CASes.
    engine_cmd_comp* list = runq_.load(std::memory_order_relaxed) != nullptr
                                ? runq_.exchange(nullptr, std::memory_order_seq_cst)
                                : nullptr;
    if (list != nullptr) {
      engine_cmd_comp* fifo = nullptr;  // reverse: serve in submission order
      while (list) {
        engine_cmd_comp* next = list->run_next;
        list->run_next = fifo;
        fifo = list;
        list = next;
      }
      while (fifo) {
        engine_cmd_comp* next = fifo->run_next;  // serve/release may free `fifo`
        fifo->serve();
        fifo->release();
        fifo = next;
      }
      idle = 0;
      continue;
    }
    // Only a live cmd_comp can submit, and a live cmd_comp keeps the device (hence the engine)
    // from stopping: once stop_ is set and the queue is empty, nothing can arrive any more.
    // Re-read the queue after seeing stop_: that load is ordered after every submission that
    // happened before the stop, so a last destroyed cmd_comp is still released.
    if (stop_.load(std::memory_order_acquire)) {
      if (runq_.load(std::memory_order_acquire) == nullptr) return;
      continue;
    }
    if (idle < engine_spin_polls) {
      ++idle;
      cpu_relax();
      continue;
    }
    const std::uint32_t seq = wake_seq_.load(std::memory_order_acquire);
    sleeping_.store(1, std::memory_order_seq_cst);
    if (runq_.load(std::memory_order_seq_cst) == nullptr && !stop_.load(std::memory_order_seq_cst))
      futex_wait(wake_seq_, seq);
    sleeping_.store(0, std::memory_order_relaxed);
    idle = 0;
  }
}

std::size_t engine_cmd_comp::issue(std::span<const slot_query> q, std::error_code& ec) noexcept {
  ec.clear();
  if (q.empty()) return 0;
  // Admission, exact under any concurrency: CAS so a refused issuer never inflates the count.
  // Memory ordering: acquire pairs with the consumer's release decrement, so the nodes it freed
  // are visible to alloc() below (not needed for correctness, which only spins otherwise).
  std::uint32_t cur = outstanding_.load(std::memory_order_relaxed);
  std::uint32_t take;
  do {
    take = static_cast<std::uint32_t>(
        std::min<std::size_t>(q.size(), max_outstanding_queries - cur));
    if (take == 0) break;
  } while (!outstanding_.compare_exchange_weak(cur, cur + take, std::memory_order_acquire,
                                               std::memory_order_relaxed));
  if (take == 0) {
    fail_into(ec, EAGAIN, "query_comp_cntr_async: %u responses (%zu bytes, the 1 MiB limit) are "
              "outstanding on this cmd_comp; collect some with get_async_cmd_comp first",
              max_outstanding_queries, max_unread_response_bytes);
    return 0;
  }
  query_node* newest = nullptr;
  query_node* oldest = nullptr;
  for (std::uint32_t i = 0; i < take; ++i) {
    query_node* n = arena_.alloc();
    n->wr_id = q[i].wr_id;
    n->s = q[i].s;
    pin_slot(*n->s);
    n->next = newest;
    newest = n;
    if (!oldest) oldest = n;
  }
  unanswered_.fetch_add(take, std::memory_order_relaxed);  // ordered before the push below
  query_node* head = pending_.load(std::memory_order_relaxed);
  do {
    oldest->next = head;
  } while (!pending_.compare_exchange_weak(head, newest, std::memory_order_seq_cst,
                                           std::memory_order_relaxed));
  // Schedule unless already scheduled. seq_cst pairs with serve(): it clears `scheduled_` before
  // taking `pending_`, so either it takes our chain or we see the flag cleared and reschedule.
  if (!scheduled_.exchange(true, std::memory_order_seq_cst)) {
    refs_.fetch_add(1, std::memory_order_relaxed);  // the engine's hold, dropped after serve()
    eng_->submit(this);
  }
  if (take < q.size())
    fail_into(ec, EAGAIN, "query_comp_cntr_async: only %u of %zu queries accepted: the 1 MiB of "
              "outstanding responses limit (%u queries) is reached", take, q.size(),
              max_outstanding_queries);
  return take;
}

void engine_cmd_comp::serve() noexcept {
  scheduled_.store(false, std::memory_order_seq_cst);
  if (query_node* chain = pending_.exchange(nullptr, std::memory_order_seq_cst)) answer(chain);
}

void engine_cmd_comp::answer(query_node* chain) noexcept {
  // The device is alive here: destroy() waits for unanswered_ == 0 before dropping the
  // cmd_comp's device reference, and unanswered_ drops only at the end of this function.
  backend& be = dev_->be();
  std::uint32_t count = 0;
  query_node* oldest = nullptr;
  slot* slots[command_engine_batch];
  query_node* nodes[command_engine_batch];
  counter_values values[command_engine_batch];
  for (query_node* n = chain; n != nullptr;) {
    std::size_t m = 0;
    for (; n != nullptr && m < command_engine_batch; n = n->next) {
      nodes[m] = n;
      slots[m++] = n->s;
      oldest = n;
    }
    be.query_values(std::span<slot* const>(slots, m), values);
    for (std::size_t i = 0; i < m; ++i) {
      nodes[i]->values = values[i];
      nodes[i]->s = nullptr;
      unpin_slot(*slots[i]);
    }
    count += static_cast<std::uint32_t>(m);
  }
  if (!destroyed_.load(std::memory_order_acquire)) {
    // Publish: the chain (newest first) goes on top of `ready` unchanged; release pairs with the
    // consumer's acquire exchange, so the values above are visible to it.
    query_node* head = ready_.load(std::memory_order_relaxed);
    do {
      oldest->next = head;
    } while (!ready_.compare_exchange_weak(head, chain, std::memory_order_release,
                                           std::memory_order_relaxed));
    publish(count);
  }
  unanswered_.fetch_sub(count, std::memory_order_release);  // destroy() may proceed after this
}

void engine_cmd_comp::publish(std::uint32_t k) noexcept {
  // No transition while the count is above 0 (the consumer only moves it to 0 under the lock).
  std::uint32_t cur = ready_count_.load(std::memory_order_relaxed);
  while (cur != 0)
    if (ready_count_.compare_exchange_weak(cur, cur + k, std::memory_order_seq_cst,
                                           std::memory_order_relaxed))
      return;
  // 0 -> k: fd first, so a poller woken by it finds the responses once it takes the lock.
  std::lock_guard lock(signal_mu_);
  if (!closed_ && !signalled_) {
    const std::uint64_t one = 1;
    // The eventfd's counter is 1 exactly while signalled_, so neither this write nor the read
    // in consumed() can block or fail (the contract forbids the application to read the fd).
    ssize_t r = ::write(efd_, &one, sizeof one);
    (void)r;
    signalled_ = true;
  }
  ready_count_.fetch_add(k, std::memory_order_seq_cst);
}

void engine_cmd_comp::consumed(std::uint32_t n) noexcept {
  std::uint32_t cur = ready_count_.load(std::memory_order_relaxed);
  while (cur > n)
    if (ready_count_.compare_exchange_weak(cur, cur - n, std::memory_order_seq_cst,
                                           std::memory_order_relaxed))
      return;
  // Possibly n -> 0: count first, then the fd unless the engine added meanwhile (lock-free
  // path above, possible while the count was still n).
  std::lock_guard lock(signal_mu_);
  if (ready_count_.fetch_sub(n, std::memory_order_seq_cst) == n && signalled_ && !closed_) {
    std::uint64_t v;
    ssize_t r = ::read(efd_, &v, sizeof v);
    (void)r;
    signalled_ = false;
  }
}

std::size_t engine_cmd_comp::try_get(std::span<query_response> out, std::error_code& ec) noexcept {
  ec.clear();
  if (out.empty()) return 0;
  std::lock_guard lock(consumer_mu_);
  // acquire pairs with the engine's count update: every counted response has been pushed.
  const std::size_t avail = settled_count();
  if (avail == 0) return 0;
  const std::size_t n = std::min(avail, out.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (private_ == nullptr) {
      query_node* stack = ready_.exchange(nullptr, std::memory_order_acquire);
      while (stack) {  // newest first -> oldest first
        query_node* next = stack->next;
        stack->next = private_;
        private_ = stack;
        stack = next;
      }
    }
    query_node* node = private_;
    private_ = node->next;
    out[i] = query_response{node->wr_id, node->values};
    arena_.free(node);
  }
  outstanding_.fetch_sub(static_cast<std::uint32_t>(n), std::memory_order_release);
  consumed(static_cast<std::uint32_t>(n));
  return n;
}

void engine_cmd_comp::destroy() noexcept {
  destroyed_.store(true, std::memory_order_seq_cst);
  // Discard what the engine has not taken yet: release the counters those queries held.
  if (query_node* chain = pending_.exchange(nullptr, std::memory_order_acq_rel)) {
    std::uint32_t k = 0;
    for (query_node* n = chain; n != nullptr; n = n->next, ++k) unpin_slot(*n->s);
    unanswered_.fetch_sub(k, std::memory_order_release);
  }
  // Wait for the chain the engine is answering, if any: it never blocks while holding one, and
  // its pins must be gone before the device reference is (the device may be closed next).
  while (unanswered_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
  {
    std::lock_guard lock(signal_mu_);
    closed_ = true;
    ::close(efd_);
  }
  device_core* dev = dev_;
  release();      // the owner's reference; the engine may still hold one (freed after serve())
  dev->release(); // last: may close the device and stop the engine
}

// ---- factories and the device's engine ------------------------------------------------------

cmd_comp_core* make_engine_cmd_comp(device_core& dev, std::error_code& ec) noexcept {
  command_engine* eng = dev.engine(ec);
  if (!eng) return nullptr;
  const int efd = ::eventfd(0, EFD_CLOEXEC);
  if (efd < 0) {
    const int err = errno;
    fail_into(ec, err, "create_cmd_comp: eventfd failed: %s", std::strerror(err));
    return nullptr;
  }
  auto* cc = new (std::nothrow) engine_cmd_comp(dev, *eng, efd);
  if (!cc || !cc->map()) {
    ::close(efd);
    if (cc) cc->release();
    fail_into(ec, ENOMEM, "create_cmd_comp: out of memory for %u response slots",
              max_outstanding_queries);
    return nullptr;
  }
  dev.retain();
  ec.clear();
  return cc;
}

command_engine* device_core::engine(std::error_code& ec) noexcept {
  if (command_engine* e = engine_.load(std::memory_order_acquire)) return e;
  command_engine* mine = command_engine::start(ec);
  if (!mine) return nullptr;
  command_engine* expected = nullptr;
  if (!engine_.compare_exchange_strong(expected, mine, std::memory_order_acq_rel,
                                       std::memory_order_acquire)) {
    mine->stop();  // another thread installed one first (rare): ours never served anything
    return expected;
  }
  return mine;
}

device_core::~device_core() {
  if (command_engine* e = engine_.load(std::memory_order_acquire)) e->stop();
}

void backend::query_values(std::span<slot* const> slots, counter_values* out) noexcept {
  for (std::size_t i = 0; i < slots.size(); ++i) {
    slot& s = *slots[i];
    if (s.hw != nullptr && s.hw->refresh != nullptr) s.hw->refresh(s);
    out[i] = counter_values{s.load_value(), s.load_errors()};
  }
}

cmd_comp_core* backend::create_cmd_comp(device_core& dev, std::error_code& ec) noexcept {
  return make_engine_cmd_comp(dev, ec);
}

}  // namespace compcntr::detail
