// Devices (compcntr:device, compcntr:backend): opening from a backend (device::from_backend),
// shared devices, caps, counter creation, close, the services higher layers attach. Opening by
// name (which backend a name means) is src/devices/open.cpp; backend defaults
// src/core/backend.cpp.
module;
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <system_error>
module compcntr;

namespace compcntr {

namespace detail {

std::error_code device_core::close() noexcept {
  std::uint32_t holds = 0, counters = 0;
  if (!pool_.unhold_if_last(holds, counters))
    return fail(EBUSY, "close_device: device '%.*s' still has %u live object(s) (%u counter(s))",
                static_cast<int>(be().name().size()), be().name().data(), holds - 1 + counters,
                counters);
  delete this;
  return {};
}

device_service* device_core::add_service(device_service& s) noexcept {
  std::lock_guard lock(services_mu_);
  if (device_service* have = find_service(s.key())) return have;
  s.next_ = services_.load(std::memory_order_relaxed);
  services_.store(&s, std::memory_order_release);
  return &s;
}

device_core::~device_core() {
  // No object of the device lives (refs reached 0), so no service is in use: stop them all
  // before the backend goes (a command engine thread may still be winding down in its stop()).
  for (device_service* s = services_.load(std::memory_order_acquire); s != nullptr;) {
    device_service* next = s->next_;
    s->stop();
    s = next;
  }
}

} // namespace detail

device device::open_shared(std::string_view name, std::uint32_t flags, std::uint32_t mode,
                           std::error_code& ec) noexcept {
  ec.clear();
  std::unique_ptr<detail::backend> be = detail::open_shared_backend(name, flags, mode, ec);
  if (!be) {
    if (!ec) detail::fail_into(ec, ENOMEM, "open_shared_device: out of memory");
    return {};
  }
  return from_backend(std::move(be), ec);
}

device device::from_backend(std::unique_ptr<detail::backend> be, std::error_code& ec) noexcept {
  if (!be) {
    detail::fail_into(ec, EINVAL, "open_device: backend is NULL");
    return {};
  }
  std::uint32_t max_counters = 0;
  if (auto e = detail::max_counters_from_env(max_counters)) {
    ec = e;
    return {};
  }
  // A native device may hold fewer counters than the pool could (0: no device limit).
  if (const std::uint32_t hw = be->caps().max_counters; hw != 0 && hw < max_counters)
    max_counters = hw;
  auto* core = new (std::nothrow) detail::device_core(std::move(be), max_counters);
  if (!core) {
    detail::fail_into(ec, ENOMEM, "open_device: out of memory");
    return {};
  }
  // The pool's tables are allocated in its constructor; without them its capacity is 0 and
  // every create would be ENOMEM ("0 counters live") for good (issue 15, defect 2): the open
  // fails instead. max_counters >= 1 here, so capacity 0 means exactly that failure.
  if (core->pool().capacity() == 0) {
    std::error_code ignored = core->close();  // refs 1 -> 0: frees it
    (void)ignored;
    detail::fail_into(ec, ENOMEM, "open_device: out of memory for the counter pool's tables");
    return {};
  }
  ec.clear();
  return device(core);
}

counter_caps device::caps() const noexcept {
  counter_caps c = core_->be().caps();
  c.max_counters = core_->pool().capacity();
  return c;
}

counter device::create_counter(const counter_options& opts, std::error_code& ec) noexcept {
  // The common case in few instructions (bench P7): a known type the device counts, a plain
  // counter, a backend with nothing to bind. Everything else, errors included, goes the general
  // way below, which checks in order and changes nothing on failure.
  detail::device_core* const core = core_;
  if (static_cast<unsigned>(opts.type) <= static_cast<unsigned>(counter_type::bytes) &&
      core->type_ok(opts.type) && opts.stripes <= 1 && !core->binds_counters()) [[likely]] {
    detail::slot* s = core->pool().allocate(opts.numa_node, ec);
    if (!s) [[unlikely]]
      return {};
    detail::reset_field(s->dev, core);  // the pool is this device's: set once per slot
    detail::reset_field(s->type, opts.type);
    ec.assign(0, detail::system_category_cached());  // ec.clear() without the library call
    return counter(s);
  }
  return create_counter_general(opts, ec);
}

[[gnu::noinline]] counter device::create_counter_general(const counter_options& opts,
                                                         std::error_code& ec) noexcept {
  if (opts.type != counter_type::wrs && opts.type != counter_type::bytes) {
    detail::fail_into(ec, EINVAL, "create_comp_cntr: unknown counter type %u (WRS = 0, BYTES = 1)",
                      static_cast<unsigned>(opts.type));
    return {};
  }
  if (!core_->type_ok(opts.type)) [[unlikely]] {
    ec = core_->be().check_type(opts.type);
    if (!ec)
      ec = detail::fail(ENOTSUP, "create_comp_cntr: counter type %u not supported by the device",
                        static_cast<unsigned>(opts.type));
    return {};
  }
  const std::uint32_t stripes = detail::stripe_count(opts.stripes);
  if (stripes == 0) {
    detail::fail_into(ec, EINVAL, "create_comp_cntr: %u stripes requested, at most %u",
                      opts.stripes, detail::max_stripes);
    return {};
  }
  // The pool validates the node (EINVAL) and the capacity (ENOMEM), changing nothing on failure.
  detail::slot* s = core_->pool().allocate(opts.numa_node, ec);
  if (!s) return {};
  detail::reset_field(s->dev, core_);  // the pool is this device's: set once per slot
  detail::reset_field(s->type, opts.type);
  // The slot is a live counter now, holding the device through the pool's live count (no
  // reference of its own: device_core::retain). A failed bind gives it back the way a destroyed
  // counter goes (last reference drops it). It must not go straight back to the pool: a
  // resolver holding a stale id of the slot's previous counter may have taken a reference
  // since the pool handed it out (its CAS sees refs == 1), and that reference must be dropped
  // on this slot, not on the slot's next owner.
  if (core_->binds_counters()) [[unlikely]] {
    if (auto e = core_->be().bind_counter(*s)) {
      detail::unref_counter_slot(*s);  // unbind_counter tolerates a slot that was never bound
      ec = e;
      return {};
    }
  }
  if (stripes > 1) [[unlikely]] {
    if (auto e = detail::make_striped(*s, stripes)) {
      detail::unref_counter_slot(*s);  // unbinds; free_stripes has nothing to free
      ec = e;
      return {};
    }
  }
  ec.assign(0, detail::system_category_cached());  // ec.clear() without the library call
  return counter(s);
}

void device::close(std::error_code& ec) noexcept {
  if (auto e = core_->close()) {
    ec = e;
    return;
  }
  core_ = nullptr;
  ec.clear();
}

} // namespace compcntr
