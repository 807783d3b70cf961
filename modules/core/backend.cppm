// compcntr:backend -- the device interface every backend implements, and the device core.
//
// A device = one backend (soft, verbs, ...) + one slot pool + a reference count. The C++
// compcntr::device handle holds one reference; every live object created from the device
// (counter, QP, cmd_comp, ...) holds one more, so a device never dies under its objects.
//
// Progress: completions that do not happen inside a compcntr call (an emulated verbs QP's CQ
// entries) are drained by progress sources registered with the device (progress_registry).
// device_core::progress() runs them; for a device with no source it is one relaxed load.
module;
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>
export module compcntr:backend;
import :slot;
import :pool;
import :types;
import :error;

export namespace compcntr::detail {

class device_core;
class qp_impl;         // compcntr:qp
class mr_impl;         // compcntr:mr
class cmd_comp_core;   // compcntr:cmd_comp
class command_engine;  // src/features/cmd_comp/engine.cpp

class backend {
 public:
  virtual ~backend() = default;
  /// Device name as given to open ("soft", "mlx5_0", ...).
  virtual std::string_view name() const noexcept = 0;
  /// max_value and supported_qp_attach_ops of this device; max_counters is the pool's.
  virtual counter_caps caps() const noexcept = 0;
  /// ENOTSUP (with a message) if the device cannot count `type`.
  virtual std::error_code check_type(counter_type type) const noexcept;
  /// Called once a slot is assigned to a new counter: native backends create the hardware
  /// counter here and set s.hw / s.backend_data. On failure the backend leaves the slot unbound
  /// (hw and backend_data as they were: nullptr); the caller then drops the counter's
  /// reference, which calls unbind_counter() on it when it is the last one.
  virtual std::error_code bind_counter(slot& s) noexcept;
  /// Called when the counter's last reference is gone, before its slot returns to the pool.
  /// Must accept a slot whose bind_counter() failed (nothing to undo then).
  virtual void unbind_counter(slot& s) noexcept;
  /// A new QP in RESET (it holds a reference to `dev`). Default: ENOTSUP (no compcntr-made QPs).
  virtual qp_impl* create_qp(device_core& dev, std::error_code& ec) noexcept;
  /// Registers [addr, addr+length) with `access` (compcntr::access bits). Default: ENOTSUP.
  virtual mr_impl* reg_mr(device_core& dev, void* addr, std::size_t length, std::uint32_t access,
                          std::error_code& ec) noexcept;
  /// The ibv_context (as void*) when this device's counters are native hardware counters that
  /// an ibv_qp can be attached to with ibv_qp_attach_comp_cntr; nullptr otherwise (counters are
  /// software slots and wrapped verbs QPs are counted by draining their CQs).
  virtual void* native_context() const noexcept { return nullptr; }
  /// Programs the hardware so native counter `s` counts `op_mask` of `ibv_qp` (a struct ibv_qp*).
  /// Only called when native_context() is not null. Default: ENOTSUP.
  virtual std::error_code native_attach(void* ibv_qp, slot& s, std::uint32_t op_mask) noexcept;

  /// The device side of an asynchronous counter query (compcntr:cmd_comp): fills out[i] with the
  /// values the device holds for *slots[i] now. Called on the device's command engine thread,
  /// one call per batch of up to command_engine_batch queries, every slot pinned (bound, never
  /// released under the call). Default: the mirror itself, after hw->refresh for native
  /// counters that have one. Backends whose values live elsewhere override it.
  virtual void query_values(std::span<slot* const> slots, counter_values* out) noexcept;

  /// Creates the object that serves asynchronous command completion for this device. Default:
  /// a software cmd_comp answered by the device's command engine thread. nullptr + ec on error.
  virtual cmd_comp_core* create_cmd_comp(device_core& dev, std::error_code& ec) noexcept;
};

/// Something that turns completions into counter updates when polled (e.g. an emulated verbs
/// QP's completion queue). Owned by whoever registered it; polled under the registry's lock.
class progress_source {
 public:
  virtual ~progress_source() = default;
  /// Consumes pending completions; returns how many were consumed.
  virtual std::size_t poll() noexcept = 0;
};

/// The progress sources of one device.
///
/// Guarantees: progress() polls every source, one thread at a time; a thread that finds another
/// one progressing returns 0 at once instead of queueing behind it (the other thread is doing
/// the work). add()/remove() wait for a running progress() to finish, so after remove() returns
/// the source is never polled again.
/// Memory ordering: `count_` is a relaxed hint for the fast "nothing registered" exit; the mutex
/// orders everything else (a source added before a progress() call starts is polled by it).
class progress_registry {
 public:
  inline std::size_t progress() noexcept {
    if (count_.load(std::memory_order_relaxed) == 0) return 0;
    std::unique_lock<std::mutex> lk(mu_, std::try_to_lock);
    if (!lk.owns_lock()) return 0;
    std::size_t n = 0;
    for (progress_source* s : sources_) n += s->poll();
    return n;
  }
  /// ENOMEM if the list cannot grow. Call with lock() held.
  inline std::error_code add_locked(progress_source& s) noexcept {
    try {
      sources_.push_back(&s);
    } catch (...) {
      return fail(ENOMEM, "progress: out of memory registering a completion source");
    }
    count_.store(sources_.size(), std::memory_order_relaxed);
    return {};
  }
  /// Call with lock() held.
  inline void remove_locked(progress_source& s) noexcept {
    std::erase(sources_, &s);
    count_.store(sources_.size(), std::memory_order_relaxed);
  }
  inline const std::vector<progress_source*>& sources_locked() const noexcept { return sources_; }
  /// Blocks while a progress() call runs.
  inline std::unique_lock<std::mutex> lock() noexcept { return std::unique_lock<std::mutex>(mu_); }
  inline bool empty() const noexcept { return count_.load(std::memory_order_relaxed) == 0; }
  /// Remembers that a source for `key` (e.g. a CQ) was removed while it may still hold work of
  /// producers that are gone: a source made later for the same key must not take everything
  /// in it to be its own. Best effort (nothing is remembered if memory runs out). Call with
  /// lock() held.
  inline void retire_locked(const void* key) noexcept {
    if (retired_locked(key)) return;
    try {
      retired_.push_back(key);
    } catch (...) {
    }
  }
  /// Whether retire_locked(key) was called. Call with lock() held.
  inline bool retired_locked(const void* key) const noexcept {
    for (const void* k : retired_)
      if (k == key) return true;
    return false;
  }

 private:
  std::mutex mu_;
  std::vector<progress_source*> sources_;
  std::vector<const void*> retired_;
  std::atomic<std::size_t> count_{0};
};

/// Queries the command engine answers per backend::query_values call (at most).
inline constexpr std::size_t command_engine_batch = 64;

class device_core {
 public:
  device_core(std::unique_ptr<backend> be, std::uint32_t max_counters) noexcept
      : backend_(std::move(be)), pool_(max_counters) {}

  inline backend& be() noexcept { return *backend_; }
  inline const backend& be() const noexcept { return *backend_; }
  inline slot_pool& pool() noexcept { return pool_; }
  inline const slot_pool& pool() const noexcept { return pool_; }

  /// Memory ordering: retain is relaxed (the caller already holds a reference); release is
  /// acq_rel so the last releaser sees every write made under every reference before deleting.
  inline void retain() noexcept { refs_.fetch_add(1, std::memory_order_relaxed); }
  inline void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
  /// Drops the caller's (sole) reference; EBUSY if objects of the device are still alive.
  std::error_code close() noexcept;
  inline std::uint32_t refs() const noexcept { return refs_.load(std::memory_order_acquire); }

  /// Drains this device's progress sources (emulated verbs CQs); returns the completions
  /// consumed. 0 at the cost of one relaxed load when the device has none (software device).
  inline std::size_t progress() noexcept { return progress_.progress(); }
  inline progress_registry& progress_sources() noexcept { return progress_; }

  /// The device's command engine (started on first use): the thread that answers software
  /// asynchronous commands, the way a device's firmware would. nullptr + ec if it cannot start.
  command_engine* engine(std::error_code& ec) noexcept;

 private:
  ~device_core();  // stops the command engine (src/features/cmd_comp/engine.cpp)
  std::unique_ptr<backend> backend_;
  slot_pool pool_;
  progress_registry progress_;
  std::atomic<std::uint32_t> refs_{1};
  std::atomic<command_engine*> engine_{nullptr};  ///< destroyed first (declared last)
};

/// Opens the backend for `name` (see compcntr::device::open). Defined in src/core/device.cpp.
std::unique_ptr<backend> open_backend(std::string_view name, std::error_code& ec) noexcept;
/// The software device (src/features/soft/).
std::unique_ptr<backend> make_soft_backend() noexcept;
/// Opens verbs device `name`, or with an empty name the first one that opens (src/integrations/verbs/).
/// nullptr and ENODEV (with a message naming what was found) when there is none.
std::unique_ptr<backend> open_verbs_backend(std::string_view name, std::error_code& ec) noexcept;
/// Pool capacity for a device being opened: COMPCNTR_MAX_COUNTERS if set (EINVAL if it is not a
/// number in 1..slot_pool::max_capacity), else default_max_counters.
std::error_code max_counters_from_env(std::uint32_t& out) noexcept;
inline constexpr std::uint32_t default_max_counters = 1u << 20;

}  // namespace compcntr::detail
