// compcntr:backend -- the device seam: what a backend must do (count), what it may offer
// (QPs/MRs, native attach, async commands), and the device core.
//
// Purpose: a device = one backend (soft, verbs, a test's fake) + one slot pool + a reference
// count + the services higher layers attach to it. The C++ compcntr::device object holds one
// reference; every live object created from the device (counter, QP, cmd_comp, ...) holds one
// more, so a device never dies under its objects.
//
// The seam: `backend` is a counter backend only (name, caps, counter type check, bind/unbind of
// a counter to device resources, value queries). Everything else is an optional capability the
// backend offers through an accessor that returns nullptr when it has none, declared by the
// layer that uses it:
//   * qps()          -> qp_capability (compcntr:qp): compcntr-made QPs and memory registrations
//                       (the software device);
//   * native_attach()-> native_attach_capability (compcntr:qp): native hardware counters an
//                       application's ibv_qp can be attached to (rdma-core 65+);
//   * commands()     -> command_capability (compcntr:cmd_comp): the device answers asynchronous
//                       commands itself (mlx5 DEVX); without it compcntr:cmd_comp serves them
//                       with its software command engine, a device_service it attaches itself.
// The defaults of the counter backend and of devices (COMPCNTR_MAX_COUNTERS) are in
// src/core/backend.cpp; which backend a device name opens, in src/devices/open.cpp.
//
// Progress: completions that do not happen inside a compcntr call (an emulated verbs QP's CQ
// entries) are drained by progress sources registered with the device (progress_registry).
// device_core::progress() runs them; for a device with no source it is one relaxed load.
//
// Requirements: a backend's virtuals are called concurrently from any thread (bind/unbind once
// per counter; query_values on the command engine thread). Guarantees: the device core deletes
// the backend after every service has stopped and every object of the device is gone.
// Memory ordering: device_core::retain/release as stated there; services are published with a
// release store and found with acquire loads.
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
import :shared;
import :types;
import :error;

namespace compcntr::detail {

class device_core;
class cmd_comp_core;             // compcntr:cmd_comp
class qp_capability;             // compcntr:qp
class native_attach_capability;  // compcntr:qp
class command_capability;        // compcntr:cmd_comp

} // namespace compcntr::detail

export namespace compcntr::plugin {

/// A counter backend (see the file comment): the one class of the plug-in interface an
/// out-of-tree backend implements (device::from_backend). Its optional capabilities return
/// module-internal types: out of the module a backend offers counters only. Defaults:
/// src/core/backend.cpp.
class backend {
 public:
  virtual ~backend() = default;
  /// Device name as given to open ("soft", "mlx5_0", ...).
  virtual std::string_view name() const noexcept = 0;
  /// max_value and supported_qp_attach_ops of this device; max_counters is the pool's.
  virtual counter_caps caps() const noexcept = 0;
  /// ENOTSUP (with a message) if the device cannot count `type`. Default: WRS and BYTES.
  virtual std::error_code check_type(counter_type type) const noexcept;
  /// Called once a slot is assigned to a new counter: native backends create the hardware
  /// counter here and set s.hw / s.backend_data. On failure the backend leaves the slot unbound
  /// (hw and backend_data as they were: nullptr); the caller then drops the counter's
  /// reference, which calls unbind_counter() on it when it is the last one. Default: nothing.
  virtual std::error_code bind_counter(slot& s) noexcept;
  /// Called when the counter's last reference is gone, before its slot returns to the pool.
  /// Must accept a slot whose bind_counter() failed (nothing to undo then). Default: nothing.
  virtual void unbind_counter(slot& s) noexcept;
  /// Whether bind_counter() and unbind_counter() do anything here. Asked once, when the device
  /// opens: false lets every counter creation and destruction skip both virtual calls (P7; the
  /// software device). Default: true.
  virtual bool binds_counters() const noexcept;
  /// The device side of an asynchronous counter query (compcntr:cmd_comp): fills out[i] with the
  /// values the device holds for *slots[i] now. Called on the device's command engine thread,
  /// one call per batch of up to command_engine_batch queries, every slot pinned (bound, never
  /// released under the call). Default: the mirror itself, after hw->refresh for native
  /// counters that have one. Backends whose values live elsewhere override it.
  virtual void query_values(std::span<slot* const> slots, counter_values* out) noexcept;

  /// Optional capabilities (see the file comment): nullptr when the backend has none.
  virtual detail::qp_capability* qps() noexcept { return nullptr; }
  virtual detail::native_attach_capability* native_attach() noexcept { return nullptr; }
  virtual detail::command_capability* commands() noexcept { return nullptr; }
  /// The segment of a shared device (compcntr:shared), nullptr for a private device.
  virtual detail::shared_segment* shared() noexcept { return nullptr; }
};

} // namespace compcntr::plugin

namespace compcntr::detail {

using plugin::backend;

/// Something a higher layer attaches to a device and the device stops when it dies (the
/// software command engine of compcntr:cmd_comp). Found by its key (the address of a static
/// object of the layer that owns it). Requirements: stop() ends the service and frees it (now
/// or later); it is called once, before the backend is deleted, by whichever thread drops the
/// device's last reference, never while an object of the device lives.
class device_service {
 public:
  explicit device_service(const void* key) noexcept : key_(key) {}
  device_service(const device_service&) = delete;
  device_service& operator=(const device_service&) = delete;
  virtual void stop() noexcept = 0;
  inline const void* key() const noexcept { return key_; }

 protected:
  ~device_service() = default;  // stop() owns deletion

 private:
  friend class device_core;
  const void* key_;
  device_service* next_ = nullptr;  ///< the device's list, written before publication
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
      : backend_(std::move(be)), pool_(max_counters) {
    pool_.hold();  // the handle's reference
    // backend::check_type answers the same for the device's life: ask once (create_counter
    // asks again only for a refused type, to report the backend's reason).
    for (counter_type t : {counter_type::wrs, counter_type::bytes})
      if (!backend_->check_type(t)) types_ok_ |= 1u << static_cast<unsigned>(t);
    binds_counters_ = backend_->binds_counters();
    shared_ = backend_->shared();
  }
  /// backend::shared(), as the backend answered at open: nullptr for a private device.
  inline shared_segment* shared() const noexcept { return shared_; }
  /// backend::binds_counters(), as the backend answered at open.
  inline bool binds_counters() const noexcept { return binds_counters_; }
  /// Whether the backend counts `t` (a valid counter_type), as backend::check_type said.
  inline bool type_ok(counter_type t) const noexcept {
    return (types_ok_ >> static_cast<unsigned>(t)) & 1u;
  }

  inline backend& be() noexcept { return *backend_; }
  inline const backend& be() const noexcept { return *backend_; }
  inline slot_pool& pool() noexcept { return pool_; }
  inline const slot_pool& pool() const noexcept { return pool_; }

  /// References to the device: the handle and every live object of it. Live counters count
  /// through the pool's live slots (slot_pool::hold: one word for both, so creating and
  /// destroying a counter costs no RMW of its own for the device's lifetime); other objects
  /// (QPs, MRs, cmd_comps, ...) retain() and release().
  /// Memory ordering: retain is relaxed (the caller already holds a reference); release is
  /// acq_rel so the last releaser sees every write made under every reference before deleting.
  inline void retain() noexcept { pool_.hold(); }
  inline void release() noexcept {
    if (pool_.unhold()) delete this;
  }
  /// Returns a freed counter's slot to the pool (compcntr:lifetime); deletes the device if that
  /// was its last object and the handle is gone. Memory ordering: slot_pool::release.
  inline void release_counter_slot(slot& s) noexcept {
    if (pool_.release(s)) delete this;
  }
  /// Drops the caller's (sole) reference; EBUSY if objects of the device are still alive.
  std::error_code close() noexcept;
  /// References held on the device besides its live counters (the handle included).
  inline std::uint32_t refs() const noexcept { return pool_.holds(); }

  /// Drains this device's progress sources (emulated verbs CQs); returns the completions
  /// consumed. 0 at the cost of one relaxed load when the device has none (software device).
  inline std::size_t progress() noexcept { return progress_.progress(); }
  inline progress_registry& progress_sources() noexcept { return progress_; }

  /// The service attached under `key`, or nullptr. Lock-free. Memory ordering: acquire loads
  /// (pair with add_service's release store: the service is seen fully constructed).
  inline device_service* find_service(const void* key) const noexcept {
    for (device_service* s = services_.load(std::memory_order_acquire); s != nullptr; s = s->next_)
      if (s->key_ == key) return s;
    return nullptr;
  }
  /// Attaches `s` unless a service with its key is attached already; returns the one attached
  /// (then `s` was not taken: the caller stops it). Serialised by a mutex (once per service).
  device_service* add_service(device_service& s) noexcept;

 private:
  ~device_core();  // stops the services (src/core/device.cpp)
  std::unique_ptr<backend> backend_;
  slot_pool pool_;
  progress_registry progress_;
  std::uint32_t types_ok_ = 0;  ///< bit t: check_type(t) succeeded
  bool binds_counters_ = true;  ///< backend::binds_counters()
  shared_segment* shared_ = nullptr;  ///< backend::shared()
  std::mutex services_mu_;                        ///< add_service only
  std::atomic<device_service*> services_{nullptr};  ///< newest first
};

/// Pool capacity for a device being opened: COMPCNTR_MAX_COUNTERS if set (EINVAL if it is not a
/// number in 1..slot_pool::max_capacity), else default_max_counters (src/core/backend.cpp).
std::error_code max_counters_from_env(std::uint32_t& out) noexcept;
inline constexpr std::uint32_t default_max_counters = 1u << 20;

/// The backend of a shared device (src/core/shared/cells.cpp): opens or creates segment NAME
/// (`name` without the "shm:" prefix) as flags (shared_create, shared_excl) and mode say.
/// nullptr and ec on failure (EINVAL, ENOENT, EEXIST, EACCES, EBADMSG, EUSERS, ENOMEM, ...).
std::unique_ptr<backend> open_shared_backend(std::string_view name, std::uint32_t flags,
                                             std::uint32_t mode, std::error_code& ec) noexcept;
/// device::resolve on a shared device: a local slot bound to cell `id` with one reference
/// (the resolver's), or nullptr and ec: ENOENT (no such counter: never created, destroyed, or
/// its creator died), ESTALE (the id's generation is gone), EBADMSG (corrupt record), ENOMEM.
slot* resolve_shared_slot(device_core& dev, counter_id id, std::error_code& ec) noexcept;
/// Reclaims what dead processes held in the segment of shared device `dev`; `reclaimed` = the
/// dead processes found. EINVAL for a private device.
std::error_code sweep_shared(device_core& dev, std::uint32_t& reclaimed) noexcept;

} // namespace compcntr::detail
