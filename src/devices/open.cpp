// Opening a device by name (compcntr::device::open, compcntr_open_device): the one place that
// knows every backend. It sits above the layers (docs/architecture.md): the core opens a device
// from a backend it is given (device::from_backend, src/core/device.cpp) and names no backend of
// a higher layer; the software device (features/soft/), rdma-core devices (integrations/verbs/)
// and shared devices (core/shared/) are looked up here.
//
//   "soft"        the software device
//   "shm:NAME"    shared device NAME, created if absent, owner-only (docs/shared.md)
//   "" or "auto"  a native device if one opens, else the software device
//   anything else an rdma-core device of that name (ENODEV naming what was found if none)
module;
#include <cerrno>
#include <memory>
#include <string_view>
#include <system_error>
module compcntr;

namespace compcntr {

namespace detail {

// Defined by the layers that own them; declared only here (module linkage).
std::unique_ptr<backend> make_soft_backend() noexcept;  // src/features/soft/soft_backend.cpp
std::unique_ptr<backend> open_verbs_backend(std::string_view name,  // src/integrations/verbs/
                                            std::error_code& ec) noexcept;

namespace {

std::unique_ptr<backend> open_backend(std::string_view name, std::error_code& ec) noexcept {
  if (name == "soft") return make_soft_backend();
  if (name.starts_with("shm:")) return open_shared_backend(name.substr(4), shared_create, 0600, ec);
  if (name.empty() || name == "auto") {
    std::error_code native_ec;
    if (auto be = open_verbs_backend({}, native_ec)) return be;
    return make_soft_backend();
  }
  return open_verbs_backend(name, ec);
}

} // namespace

} // namespace detail

device device::open(std::string_view name, std::error_code& ec) noexcept {
  ec.clear();
  std::unique_ptr<detail::backend> be = detail::open_backend(name, ec);
  if (!be) {
    if (!ec) detail::fail_into(ec, ENOMEM, "open_device: out of memory");
    return {};
  }
  return from_backend(std::move(be), ec);
}

} // namespace compcntr
