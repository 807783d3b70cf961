// The command engine: one thread per device, started on first use and attached to the device as
// a device_service, that answers the device's software asynchronous commands the way firmware
// would; and the software cmd_comp it serves (issue, answer, publish with exact fd readiness,
// get, destroy) (compcntr:cmd_comp). Design and class definitions: src/features/cmd_comp/engine.hpp, included by
// this unit only (module-attached classes must be defined in one unit of the module).
module;
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <span>
#include <system_error>
#include <thread>
#include "core/tagged_index_stack.hpp"
#include "core/wait/futex.hpp"
module compcntr;

#include "engine.hpp"

namespace compcntr::detail {

namespace {

/// Idle polls of the run queue before the engine sleeps in the kernel: first with `pause`
/// (~10-20 us), then with sched_yield (~50-100 us when the core is free, shorter turns when it
/// is shared), long enough to catch the next batch of an issue/collect loop without a futex
/// wake (which costs the issuer a syscall and the engine a scheduler round trip).
constexpr unsigned engine_spin_polls = 256;
constexpr unsigned engine_yield_polls = 64;

/// Incremented in the child by a pthread_atfork handler (registered with the first engine):
/// an engine whose recorded generation differs was started by an ancestor process and has no
/// thread here. Issue 15, defect 3: a child's cmd_comp on an inherited device used to accept
/// queries nobody would answer, and a blocking get hung.
std::atomic<std::uint32_t> fork_generation{0};

void count_fork_in_child() noexcept { fork_generation.fetch_add(1, std::memory_order_relaxed); }

} // namespace

bool command_engine::foreign() const noexcept {
  return fork_gen_ != fork_generation.load(std::memory_order_relaxed);
}

/// The EOWNERDEAD every engine-backed call of a forked child gets (docs/devices.md, FORK).
std::error_code orphaned_error(const char* call, const command_engine& e) noexcept {
  return fail(EOWNERDEAD,
              "%s: the device's command engine runs in process %d, which opened it; "
              "after fork() this process (%d) has no such thread, so nothing would answer: open "
              "a new device here",
              call, static_cast<int>(e.owner_pid()), static_cast<int>(::getpid()));
}

command_engine* command_engine::start(const void* key, std::error_code& ec) noexcept {
  static const int atfork = ::pthread_atfork(nullptr, nullptr, count_fork_in_child);
  (void)atfork; // registration failure (ENOMEM) only loses the fork check
  auto* e = new (std::nothrow) command_engine(key);
  if (!e) {
    fail_into(ec, ENOMEM, "create_cmd_comp: out of memory for the command engine");
    return nullptr;
  }
  e->fork_gen_ = fork_generation.load(std::memory_order_relaxed);
  e->pid_ = ::getpid();
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
  } catch (...) { // std::bad_alloc: std::thread allocates its state before pthread_create
    delete e;
    fail_into(ec, ENOMEM, "create_cmd_comp: out of memory starting the command engine thread");
    return nullptr;
  }
  return e;
}

void command_engine::stop() noexcept {
  if (foreign()) {
    // A forked child closing an inherited device: the thread is the parent's, there is none to
    // stop or join here. The device's reference goes; the thread's never does, so this copy of
    // the engine (and its std::thread handle) is left alone for the process's lifetime.
    refs_.fetch_sub(1, std::memory_order_acq_rel);
    return;
  }
  stop_.store(true, std::memory_order_seq_cst);
  wake();
  if (thread_.get_id() == std::this_thread::get_id())
    thread_.detach();
  else
    thread_.join();
  release();
}

void command_engine::wake() noexcept {
  wake_seq_.fetch_add(1, std::memory_order_release);
  futex::wake(wake_seq_);
}

void command_engine::submit(engine_cmd_comp* cc) noexcept {
  engine_cmd_comp* head = runq_.load(std::memory_order_relaxed);
  do {
    cc->run_next = head;
  } while (
      !runq_.compare_exchange_weak(head, cc, std::memory_order_seq_cst, std::memory_order_relaxed));
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
      engine_cmd_comp* fifo = nullptr; // reverse: serve in submission order
      while (list) {
        engine_cmd_comp* next = list->run_next;
        list->run_next = fifo;
        fifo = list;
        list = next;
      }
      while (fifo) {
        engine_cmd_comp* next = fifo->run_next; // serve/release may free `fifo`
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
    if (idle < engine_spin_polls + engine_yield_polls) {
      // Pause first (a consumer on another core answers within microseconds), then yield, so an
      // engine sharing a core with the issuing thread hands it the CPU instead of spinning.
      if (idle++ < engine_spin_polls)
        cpu_relax();
      else
        std::this_thread::yield();
      continue;
    }
    const std::uint32_t seq = wake_seq_.load(std::memory_order_acquire);
    sleeping_.store(1, std::memory_order_seq_cst);
    if (runq_.load(std::memory_order_seq_cst) == nullptr && !stop_.load(std::memory_order_seq_cst))
      futex::wait(wake_seq_, seq, std::chrono::nanoseconds(-1));
    sleeping_.store(0, std::memory_order_relaxed);
    idle = 0;
  }
}

// ---- the software cmd_comp ------------------------------------------------------------------
std::size_t engine_cmd_comp::issue(std::span<const slot_query> q, std::error_code& ec) noexcept {
  ec.clear();
  if (q.empty()) return 0;
  if (eng_->foreign()) [[unlikely]] {
    ec = orphaned_error("query_comp_cntr_async", *eng_);
    return 0;
  }
  // Admission, exact under any concurrency: CAS so a refused issuer never inflates the count.
  // Memory ordering: acquire pairs with the consumer's release decrement, so the nodes it freed
  // are visible to alloc() below (not needed for correctness, which only spins otherwise).
  std::uint32_t cur = outstanding_.load(std::memory_order_relaxed);
  std::uint32_t take;
  do {
    take =
        static_cast<std::uint32_t>(std::min<std::size_t>(q.size(), max_outstanding_queries - cur));
    if (take == 0) break;
  } while (!outstanding_.compare_exchange_weak(cur, cur + take, std::memory_order_acquire,
                                               std::memory_order_relaxed));
  if (take == 0) {
    fail_into(ec, EAGAIN,
              "query_comp_cntr_async: %u responses (%zu bytes, the 1 MiB limit) are "
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
  unanswered_.fetch_add(take, std::memory_order_relaxed); // ordered before the push below
  query_node* head = pending_.load(std::memory_order_relaxed);
  do {
    oldest->next = head;
  } while (!pending_.compare_exchange_weak(head, newest, std::memory_order_seq_cst,
                                           std::memory_order_relaxed));
  // Schedule unless already scheduled. seq_cst pairs with serve(): it clears `scheduled_` before
  // taking `pending_`, so either it takes our chain or we see the flag cleared and reschedule.
  if (!scheduled_.exchange(true, std::memory_order_seq_cst)) {
    refs_.fetch_add(1, std::memory_order_relaxed); // the engine's hold, dropped after serve()
    eng_->submit(this);
  }
  if (take < q.size())
    fail_into(ec, EAGAIN,
              "query_comp_cntr_async: only %u of %zu queries accepted: the 1 MiB of "
              "outstanding responses limit (%u queries) is reached",
              take, q.size(), max_outstanding_queries);
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
  unanswered_.fetch_sub(count, std::memory_order_release); // destroy() may proceed after this
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
  if (eng_->foreign()) [[unlikely]] {
    // Even responses queued before the fork stay: popping them would clear the eventfd this
    // process shares with the parent, whose copy of them is still queued.
    ec = orphaned_error("get_async_cmd_comp", *eng_);
    return 0;
  }
  if (out.empty()) return 0;
  std::lock_guard lock(consumer_mu_);
  // acquire pairs with the engine's count update: every counted response has been pushed.
  const std::size_t avail = settled_count();
  if (avail == 0) return 0;
  const std::size_t n = std::min(avail, out.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (private_ == nullptr) {
      query_node* stack = ready_.exchange(nullptr, std::memory_order_acquire);
      while (stack) { // newest first -> oldest first
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
  if (eng_->foreign()) [[unlikely]] {
    // Forked child: no engine here will answer (or let go of) anything. Close this process's
    // copy of the fd and drop the device; the object itself is left (the engine's reference,
    // if it was queued at the fork, is never dropped here). No lock: the parent's engine may
    // have held signal_mu_ at the fork, and no other thread of this process uses it.
    closed_ = true;
    ::close(efd_);
    device_core* dev = dev_;
    release();
    dev->release();
    return;
  }
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
  release(); // the owner's reference; the engine may still hold one (freed after serve())
  dev->release(); // last: may close the device and stop the engine
}

// ---- factories and the device's engine ------------------------------------------------------

cmd_comp_core* make_engine_cmd_comp(device_core& dev, std::error_code& ec) noexcept {
  command_engine* eng = device_engine(dev, ec);
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

namespace {
/// The key of the command engine among a device's services.
constexpr char engine_service_key = 0;
} // namespace

command_engine* device_engine(device_core& dev, std::error_code& ec) noexcept {
  if (device_service* s = dev.find_service(&engine_service_key)) {
    auto* e = static_cast<command_engine*>(s);
    if (e->foreign()) [[unlikely]] {
      ec = orphaned_error("create_cmd_comp", *e);
      return nullptr;
    }
    return e;
  }
  command_engine* mine = command_engine::start(&engine_service_key, ec);
  if (!mine) return nullptr;
  device_service* winner = dev.add_service(*mine);
  if (winner != mine) {
    mine->stop(); // another thread attached one first (rare): ours never served anything
    return static_cast<command_engine*>(winner);
  }
  return mine;
}

} // namespace compcntr::detail
