// Devices (compcntr:device, compcntr:backend): open, caps, counter creation, close, the
// services higher layers attach. Backend defaults: src/core/backend.cpp.
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
  std::uint32_t expected = 1;
  if (!refs_.compare_exchange_strong(expected, 0, std::memory_order_acq_rel,
                                     std::memory_order_acquire))
    return fail(EBUSY, "close_device: device '%.*s' still has %u live object(s)",
                static_cast<int>(be().name().size()), be().name().data(), expected - 1);
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

}  // namespace detail

device device::open(std::string_view name, std::error_code& ec) noexcept {
  ec.clear();
  std::unique_ptr<detail::backend> be = detail::open_backend(name, ec);
  if (!be) {
    if (!ec) detail::fail_into(ec, ENOMEM, "open_device: out of memory");
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
  ec.clear();
  return device(core);
}

counter_caps device::caps() const noexcept {
  counter_caps c = core_->be().caps();
  c.max_counters = core_->pool().capacity();
  return c;
}

counter device::create_counter(const counter_options& opts, std::error_code& ec) noexcept {
  if (opts.type != counter_type::wrs && opts.type != counter_type::bytes) {
    detail::fail_into(ec, EINVAL, "create_comp_cntr: unknown counter type %u (WRS = 0, BYTES = 1)",
                      static_cast<unsigned>(opts.type));
    return {};
  }
  if (auto e = core_->be().check_type(opts.type)) {
    ec = e;
    return {};
  }
  // The pool validates the node (EINVAL) and the capacity (ENOMEM), changing nothing on failure.
  detail::slot* s = core_->pool().allocate(opts.numa_node, ec);
  if (!s) return {};
  s->owner = core_;
  s->type = opts.type;
  // The device reference first: from here on the slot is a counter like any other, and a
  // failed bind gives it back the way a destroyed counter goes (last reference drops it). It
  // must not go straight back to the pool: a resolver holding a stale id of the slot's
  // previous counter may have taken a reference since the pool handed it out (its CAS sees
  // refs == 1), and that reference must be dropped on this slot, not on the slot's next owner.
  core_->retain();
  if (auto e = core_->be().bind_counter(*s)) {
    detail::unref_counter_slot(*s);  // unbind_counter tolerates a slot that was never bound
    ec = e;
    return {};
  }
  ec.clear();
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

}  // namespace compcntr
