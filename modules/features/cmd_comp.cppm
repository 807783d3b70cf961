// compcntr:cmd_comp -- asynchronous command completion (DEVX-style).
//
// Purpose: issue device commands (here: counter queries) without blocking and collect the
// responses later from an object with a pollable file descriptor, the way mlx5 DEVX does with
// mlx5dv_devx_create_cmd_comp / mlx5dv_devx_obj_query_async / mlx5dv_devx_get_async_cmd_comp.
//
// Requirements: a cmd_completion is created from a device and only queries counters of that
// device. query() may be called from any number of threads at once; get() is meant for one
// consumer (several are safe: they are serialised). Destroying (reset/destructor) must not race
// with other calls on the same object.
// Guarantees:
//   * fd() is a real file descriptor: poll/epoll report it readable exactly while at least one
//     response is queued (on the software device: an eventfd set when the queue becomes
//     non-empty and cleared when it becomes empty, both under one lock with the queue count).
//   * every accepted query is answered exactly once, asynchronously: by the device's command
//     engine thread (software device, fake devices) or by the hardware (mlx5 DEVX), never in the
//     issuing call's stack. The answer is the counter's values at some moment after the issue.
//   * back-pressure: a query is refused with EAGAIN (nothing changes) if accepting it would put
//     more than 1 MiB of response data (16 bytes per counter query) in flight or unread, i.e.
//     at most 65,536 outstanding queries; nothing is ever dropped.
//   * destroying discards queued responses and closes the fd; queries still in flight are
//     discarded too, and every counter they held is released before destroy returns.
//   * a counter may be destroyed while queries of it are in flight: destroy succeeds at once
//     (never EBUSY because of a query); the slot stays bound until the last query has read it.
// Memory ordering: a response's values are read after the query was accepted; everything the
// engine wrote for a response happens-before get() returns it (release/acquire on the queues).
//
// Example:
//     std::error_code ec;
//     auto cmd = compcntr::cmd_completion::create(dev, ec);
//     cmd.query(counter, /*wr_id=*/42);
//     compcntr::query_response r = cmd.get(ec);      // blocks unless fd() is O_NONBLOCK
//     // r.wr_id == 42, r.values.completions == counter's value at answer time
module;
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <system_error>
#include <utility>
export module compcntr:cmd_comp;
import :slot;
import :lifetime;
import :types;
import :backend;
import :counter;
import :device;
import :error;

export namespace compcntr {

/// One query of a batch: which counter, and the caller's id echoed in the response.
/// `{&counter, wr_id}` and `{view, wr_id}` both work; an empty view (or a null pointer) is
/// refused by query() with EINVAL.
struct query_request {
  counter_view c;
  std::uint64_t wr_id = 0;

  query_request() noexcept = default;
  inline query_request(counter_view v, std::uint64_t id) noexcept : c(v), wr_id(id) {}
  inline query_request(const counter* p, std::uint64_t id) noexcept
      : c(p != nullptr ? p->view() : counter_view()), wr_id(id) {}
};

/// A collected response: the query's wr_id and the counter's values when it was answered.
struct query_response {
  std::uint64_t wr_id = 0;
  counter_values values;
};

} // namespace compcntr

namespace compcntr::detail {

/// Bytes of a response header: the caller's wr_id (struct compcntr_devx_async_cmd_hdr).
inline constexpr std::size_t async_cmd_header_bytes = sizeof(std::uint64_t);
/// Bytes of a counter query's out_data (struct compcntr_comp_cntr_values).
inline constexpr std::size_t counter_query_out_bytes = 2 * sizeof(std::uint64_t);
/// Response data allowed in flight or unread per cmd_comp: the mlx5 kernel driver's
/// MAX_ASYNC_BYTES_IN_USE (drivers/infiniband/hw/mlx5/devx.c), which counts out_data bytes.
inline constexpr std::size_t max_unread_response_bytes = std::size_t{1} << 20;
/// Hence at most this many counter queries outstanding per cmd_comp.
inline constexpr std::uint32_t max_outstanding_queries =
    static_cast<std::uint32_t>(max_unread_response_bytes / counter_query_out_bytes);

/// One query as the cmd_comp implementations see it.
struct slot_query {
  slot* s = nullptr;
  std::uint64_t wr_id = 0;
};

/// The object behind a cmd_comp: software (make_engine_cmd_comp) or a backend's (mlx5 DEVX).
/// Internal to the library and its backends.
class cmd_comp_core {
 public:
  inline explicit cmd_comp_core(device_core& dev) noexcept : dev_(&dev) {}
  cmd_comp_core(const cmd_comp_core&) = delete;
  cmd_comp_core& operator=(const cmd_comp_core&) = delete;

  /// The pollable descriptor handed to the application.
  virtual int fd() const noexcept = 0;
  /// Accepts a prefix of `q` (all slots belong to device()); returns its length. A shorter
  /// prefix sets ec (EAGAIN: back-pressure; other: the device refused).
  virtual std::size_t issue(std::span<const slot_query> q, std::error_code& ec) noexcept = 0;
  /// Pops up to out.size() responses without blocking; 0 when none is queued. A response the
  /// device answered with an error stops the batch: ec = EIO, out[return].wr_id names it.
  virtual std::size_t try_get(std::span<query_response> out, std::error_code& ec) noexcept = 0;
  /// True while at least one response is queued.
  virtual bool ready() const noexcept = 0;
  /// Lock-free hint for spinning: true if a response is probably queued (may be stale).
  virtual bool probably_ready() const noexcept { return ready(); }
  /// Responses queued now (best effort for hardware-served ones).
  virtual std::size_t queued() const noexcept = 0;
  /// True in a child process forked after this cmd_comp's server (the command engine thread)
  /// started: nothing will ever answer it here. issue/try_get then fail with EOWNERDEAD.
  virtual bool orphaned() const noexcept { return false; }
  /// Discards everything, closes the fd, releases the device; the memory is freed once the
  /// engine lets go of it. The object must not be used afterwards.
  virtual void destroy() noexcept = 0;

  inline device_core& device() const noexcept { return *dev_; }

 protected:
  ~cmd_comp_core() = default;  // destroy() owns deletion
  device_core* dev_;
};

/// Optional capability of a backend (backend::commands()): the device answers asynchronous
/// commands itself (mlx5 DEVX). Devices without it get the software cmd_comp below.
class command_capability {
 public:
  /// A cmd_comp served by the device; it retains `dev`. nullptr + ec on error.
  virtual cmd_comp_core* create_cmd_comp(device_core& dev, std::error_code& ec) noexcept = 0;

 protected:
  ~command_capability() = default;
};

/// The software cmd_comp served by the device's command engine (src/features/cmd_comp/engine.cpp).
/// Retains the device; nullptr + ec (ENOMEM, EMFILE, ...) on failure.
cmd_comp_core* make_engine_cmd_comp(device_core& dev, std::error_code& ec) noexcept;

} // namespace compcntr::detail

export namespace compcntr {

/// RAII owner of a cmd_comp (see the file comment for the contract).
class cmd_completion {
 public:
  cmd_completion() noexcept = default;
  inline cmd_completion(cmd_completion&& o) noexcept : core_(std::exchange(o.core_, nullptr)) {}
  inline cmd_completion& operator=(cmd_completion&& o) noexcept {
    if (this != &o) {
      reset();
      core_ = std::exchange(o.core_, nullptr);
    }
    return *this;
  }
  cmd_completion(const cmd_completion&) = delete;
  cmd_completion& operator=(const cmd_completion&) = delete;
  ~cmd_completion() { reset(); }

  /// Creates a cmd_comp on `dev` (holds a device reference until destroyed). On failure returns
  /// an empty object and sets ec: EINVAL (empty device), ENOMEM, EMFILE/ENFILE (no fd left).
  static cmd_completion create(const device& dev, std::error_code& ec) noexcept;

  inline explicit operator bool() const noexcept { return core_ != nullptr; }
  /// The pollable fd (readable exactly while a response is queued). Owned by this object; the
  /// application may set O_NONBLOCK on it with fcntl, which get() honours.
  inline int fd() const noexcept { return core_->fd(); }

  /// Issues an asynchronous query of `c`, answered on this object with `wr_id`. EAGAIN when
  /// 1 MiB of responses is outstanding (nothing changes); EINVAL when `c` is empty or belongs
  /// to another device.
  std::error_code query(counter_view c, std::uint64_t wr_id) noexcept;
  /// Issues a batch (one queue operation, one engine wake-up). Returns how many of the first
  /// requests were accepted; fewer than reqs.size() sets ec (EAGAIN, EINVAL).
  std::size_t query(std::span<const query_request> reqs, std::error_code& ec) noexcept;

  /// Pops one response. With none queued: blocks until one arrives, or EAGAIN when the fd has
  /// O_NONBLOCK (checked at call time). EIO: the device failed this query (wr_id is filled).
  query_response get(std::error_code& ec) noexcept;
  /// Pops up to out.size() responses; blocks (as above) only while none is queued.
  std::size_t get(std::span<query_response> out, std::error_code& ec) noexcept;
  /// Pops up to out.size() responses; never blocks, whatever the fd's flags (0: none queued).
  std::size_t try_get(std::span<query_response> out, std::error_code& ec) noexcept;
  /// The C layout (struct compcntr_devx_async_cmd_hdr + struct compcntr_comp_cntr_values):
  /// EINVAL if len < 8, ENOSPC (response stays queued) if len < 24; blocking as get().
  /// Returns 0 or an errno value.
  int get_raw(void* buf, std::size_t len) noexcept;

  /// Responses queued now (for tests and statistics; racy by nature).
  inline std::size_t queued() const noexcept { return core_->queued(); }

  /// Destroys now: queued and in-flight responses are discarded, the fd is closed.
  inline void reset() noexcept {
    if (detail::cmd_comp_core* c = std::exchange(core_, nullptr)) c->destroy();
  }

  inline detail::cmd_comp_core* core() const noexcept { return core_; }

 private:
  inline explicit cmd_completion(detail::cmd_comp_core* c) noexcept : core_(c) {}
  detail::cmd_comp_core* core_ = nullptr;
};

} // namespace compcntr
