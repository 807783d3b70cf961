// The C API of devices and counters (include/compcntr/compcntr.h): NULL checks and errno
// mapping in the module (a unit of module compcntr). Other call families live beside this file, one per file.
module;
#include <compcntr/compcntr.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

module compcntr;

import :c_api;

using namespace compcntr::c_api;

namespace compcntr::c_api {

// The slot layout the inline fast paths of <compcntr/compcntr.h> rely on (their ABI).
using compcntr::detail::slot;
static_assert(offsetof(slot, value) == offsetof(compcntr_comp_cntr_slot_, value) &&
                  offsetof(slot, errors) == offsetof(compcntr_comp_cntr_slot_, errors) &&
                  offsetof(slot, stripes) == offsetof(compcntr_comp_cntr_slot_, stripes) &&
                  offsetof(slot, watch) == offsetof(compcntr_comp_cntr_slot_, watch) &&
                  offsetof(slot, hw) == offsetof(compcntr_comp_cntr_slot_, hw),
              "struct compcntr_comp_cntr_slot_ (compcntr.h) must match compcntr::detail::slot");
static_assert(sizeof(std::atomic<std::uint64_t>) == 8 && sizeof(std::atomic<std::uint32_t>) == 4);
static_assert(sizeof(c_counter) <= sizeof(slot::c_api) && alignof(c_counter) <= 8,
              "a C counter fits in its slot's spare bytes");

c_counter* make_c_counter(compcntr_device* dev, compcntr::counter&& cxx) noexcept {
  const std::uint32_t handle = cxx.index();
  void* where;
  if constexpr (c_counters_on_heap) {
    where = ::operator new(sizeof(c_counter), std::nothrow);
    if (!where) return nullptr; // `cxx` destroys the counter
  } else {
    where = cxx.native_slot()->c_api;
  }
  return new (where) c_counter{dev, handle, 0, std::move(cxx)};
}

namespace {
// Owner names (static strings, compared by address) get a small code so the owner fits the
// public struct's 32-bit reserved_ word. Append-only, lock-free: a name claims the first empty
// entry with a CAS. 15 names: the library itself has one owner kind (the fi_cntr adapter).
constexpr std::size_t max_owner_names = 15;
std::atomic<const char*> owner_names[max_owner_names + 1]; // entry 0 unused: "no owner"

std::uint32_t owner_code(const char* name) noexcept {
  for (std::uint32_t i = 1; i <= max_owner_names; ++i) {
    const char* cur = owner_names[i].load(std::memory_order_acquire);
    if (cur == nullptr &&
        owner_names[i].compare_exchange_strong(cur, name, std::memory_order_acq_rel))
      return i;
    if (cur == name) return i;
  }
  return 0;
}

const char* owner_name(std::uint32_t code) noexcept {
  const char* n =
      code <= max_owner_names ? owner_names[code].load(std::memory_order_acquire) : nullptr;
  return n != nullptr ? n : "another object";
}
} // namespace

// Neither path runs ~c_counter: its compcntr::counter must not touch a slot that is gone (in
// the slot mode the object itself lives in that slot). The storage is simply released.
int destroy_c_counter(c_counter* c) noexcept {
  if (const std::error_code e = compcntr::detail::destroy_counter_slot(*c->cxx.native_slot()))
    return e.value(); // EBUSY: the counter stays usable
  if constexpr (c_counters_on_heap) ::operator delete(c);
  return 0;
}

void drop_c_counter(c_counter* c) noexcept {
  compcntr::detail::unref_counter_slot(*c->cxx.native_slot());
  if constexpr (c_counters_on_heap) ::operator delete(c);
}

} // namespace compcntr::c_api

extern "C" {

const char* compcntr_version(void) { return compcntr::version().data(); }

const char* compcntr_last_error_message(void) { return compcntr::last_error_message().data(); }

} // extern "C"

namespace {
// The device object around an opened compcntr::device (open_device, open_shared_device).
compcntr_device* wrap_device(compcntr::device&& dev) noexcept {
  device_obj* d = nullptr;
  try {
    d = new device_obj{std::move(dev), {}};
    d->name = d->dev.name();
  } catch (...) { // std::bad_alloc (the name is copied): nothing is left open
    if (d) {
      std::error_code ignored;
      d->dev.close(ignored);
      delete d;
    }
    return fail_null<compcntr_device>(compcntr::detail::fail(ENOMEM, "open_device: out of memory"));
  }
  return pub(d);
}

// The owner name of the C objects compcntr_comp_cntr_resolve makes (destroy: EBUSY naming it).
constexpr const char* resolved_ref_owner =
    "a reference from compcntr_comp_cntr_resolve (drop it with compcntr_comp_cntr_release)";
} // namespace

extern "C" {

struct compcntr_device* compcntr_open_device(const char* name) {
  // compcntr.h: NULL or "auto", "soft", else a verbs device name. No device is named "" (the
  // C++ device::open reads an empty name as "auto"; the C API keeps to its header).
  if (name && *name == '\0')
    return fail_null<compcntr_device>(compcntr::detail::fail(
        ENODEV, "open_device: the device name is empty, and no device has that name (NULL or "
                "\"auto\": a native device if one works, else the software device; \"soft\": the "
                "software device)"));
  std::error_code ec;
  compcntr::device dev = compcntr::device::open(name ? name : "auto", ec);
  if (ec) return fail_null<compcntr_device>(ec);
  return wrap_device(std::move(dev));
}

struct compcntr_device* compcntr_open_shared_device(const char* name, uint32_t flags, mode_t mode) {
  if (!name)
    return fail_null<compcntr_device>(
        compcntr::detail::fail(EINVAL, "open_shared_device: name is NULL"));
  std::error_code ec;
  compcntr::device dev =
      compcntr::device::open_shared(name, flags, static_cast<std::uint32_t>(mode), ec);
  if (ec) return fail_null<compcntr_device>(ec);
  return wrap_device(std::move(dev));
}

int compcntr_sweep_shared_device(struct compcntr_device* dev, uint32_t* reclaimed) {
  if (!dev) return null_arg("sweep_shared_device", "dev");
  std::error_code ec;
  const std::uint32_t n = impl(dev)->dev.sweep(ec);
  if (ec) return ec.value();
  if (reclaimed) *reclaimed = n;
  return 0;
}

int compcntr_comp_cntr_id(struct compcntr_comp_cntr* cc, struct compcntr_counter_id* id) {
  if (!cc) return null_arg("comp_cntr_id", "cc");
  if (!id) return null_arg("comp_cntr_id", "id");
  const compcntr::counter_id i = impl(cc)->cxx.id();
  id->generation = i.generation;
  id->index = i.index;
  return 0;
}

struct compcntr_comp_cntr* compcntr_comp_cntr_resolve(struct compcntr_device* dev,
                                                      const struct compcntr_counter_id* id) {
  using compcntr::detail::fail;
  if (!dev) return fail_null<compcntr_comp_cntr>(fail(EINVAL, "comp_cntr_resolve: dev is NULL"));
  if (!id) return fail_null<compcntr_comp_cntr>(fail(EINVAL, "comp_cntr_resolve: id is NULL"));
  std::error_code ec;
  compcntr::counter_ref r =
      impl(dev)->dev.resolve(compcntr::counter_id{id->generation, id->index}, ec);
  if (ec) {
    // A private device's "no such slot" (EINVAL in C++) is "never created" here (shared.h).
    if (ec.value() == EINVAL)
      ec =
          fail(ENOENT,
               "comp_cntr_resolve: counter id {index %u, generation %llu} names no "
               "counter of device '%s' (never created)",
               id->index, static_cast<unsigned long long>(id->generation), impl(dev)->name.c_str());
    return fail_null<compcntr_comp_cntr>(ec);
  }
  const std::uint32_t code = owner_code(resolved_ref_owner);
  void* where = ::operator new(sizeof(c_counter), std::nothrow);
  if (!where || code == 0) {
    ::operator delete(where);
    return fail_null<compcntr_comp_cntr>(fail(ENOMEM, "comp_cntr_resolve: out of memory"));
  }
  compcntr::detail::slot* s = r.release();
  // On the heap (the slot's own C object, if any, is its owner's): the reference is the
  // object's, dropped by compcntr_comp_cntr_release.
  return pub(new (where)
                 c_counter{dev, s->index, code, compcntr::detail::counter_access::adopt(s)});
}

int compcntr_comp_cntr_release(struct compcntr_comp_cntr* ref) {
  if (!ref) return null_arg("comp_cntr_release", "ref");
  c_counter* c = impl(ref);
  if (c->owner.load(std::memory_order_acquire) != owner_code(resolved_ref_owner))
    return compcntr::detail::fail(EINVAL,
                                  "comp_cntr_release: counter %u is not a reference from "
                                  "compcntr_comp_cntr_resolve (destroy it with "
                                  "compcntr_destroy_comp_cntr)",
                                  ref->handle)
        .value();
  compcntr::detail::unref_counter_slot(*c->cxx.native_slot());
  ::operator delete(c); // ~c_counter must not run: its reference is dropped above
  return 0;
}

int compcntr_close_device(struct compcntr_device* dev) {
  if (!dev) return null_arg("close_device", "dev");
  std::error_code ec;
  impl(dev)->dev.close(ec);
  if (ec) return ec.value();
  delete impl(dev);
  return 0;
}

const char* compcntr_device_name(const struct compcntr_device* dev) {
  if (!dev) {
    compcntr::detail::fail(EINVAL, "device_name: dev is NULL");
    return nullptr;
  }
  return impl(dev)->name.c_str();
}

int compcntr_query_comp_cntr_caps(struct compcntr_device* dev,
                                  struct compcntr_comp_cntr_caps* caps) {
  if (!dev) return null_arg("query_comp_cntr_caps", "dev");
  if (!caps) return null_arg("query_comp_cntr_caps", "caps");
  const compcntr::counter_caps c = impl(dev)->dev.caps();
  caps->max_value = c.max_value;
  caps->max_counters = c.max_counters;
  caps->supported_qp_attach_ops = c.supported_qp_attach_ops;
  return 0;
}

struct compcntr_comp_cntr* compcntr_create_comp_cntr(struct compcntr_device* dev,
                                                     struct compcntr_comp_cntr_init_attr* attr) {
  using compcntr::detail::fail;
  if (!dev) return fail_null<compcntr_comp_cntr>(fail(EINVAL, "create_comp_cntr: dev is NULL"));
  if (!attr) return fail_null<compcntr_comp_cntr>(fail(EINVAL, "create_comp_cntr: attr is NULL"));
  constexpr std::uint32_t known_mask =
      COMPCNTR_COMP_CNTR_INIT_ATTR_NUMA_NODE | COMPCNTR_COMP_CNTR_INIT_ATTR_STRIPES;
  if (attr->comp_mask & ~known_mask)
    return fail_null<compcntr_comp_cntr>(fail(
        EINVAL, "create_comp_cntr: unknown comp_mask bit(s) 0x%x", attr->comp_mask & ~known_mask));
  if (attr->flags != 0)
    return fail_null<compcntr_comp_cntr>(
        fail(EINVAL, "create_comp_cntr: flags must be 0 (got 0x%x)", attr->flags));
  // Read the type's raw bits: an out-of-range value in a C enum must not be loaded as one.
  std::uint32_t raw_type;
  static_assert(sizeof attr->type == sizeof raw_type);
  std::memcpy(&raw_type, &attr->type, sizeof raw_type);
  compcntr::counter_options opts;
  opts.type = static_cast<compcntr::counter_type>(raw_type);
  if (attr->comp_mask & COMPCNTR_COMP_CNTR_INIT_ATTR_NUMA_NODE) {
    if (attr->numa_node < 0)
      return fail_null<compcntr_comp_cntr>(
          fail(EINVAL, "create_comp_cntr: NUMA node %d does not exist", attr->numa_node));
    opts.numa_node = attr->numa_node;
  }
  if (attr->comp_mask & COMPCNTR_COMP_CNTR_INIT_ATTR_STRIPES) opts.stripes = attr->stripes;
  std::error_code ec;
  compcntr::counter cxx = impl(dev)->dev.create_counter(opts, ec);
  if (ec) return fail_null<compcntr_comp_cntr>(ec);
  c_counter* c = make_c_counter(dev, std::move(cxx));
  if (!c) return fail_null<compcntr_comp_cntr>(fail(ENOMEM, "create_comp_cntr: out of memory"));
  return pub(c);
}

int compcntr_destroy_comp_cntr(struct compcntr_comp_cntr* cc) {
  if (!cc) return null_arg("destroy_comp_cntr", "cc");
  // Acquire: pairs with set_owner's release (an owner set before this call is seen).
  if (const std::uint32_t owner = impl(cc)->owner.load(std::memory_order_acquire))
    return compcntr::detail::fail(EBUSY,
                                  "destroy_comp_cntr: counter %u is owned by %s; it stays "
                                  "usable",
                                  cc->handle, owner_name(owner))
        .value();
  return destroy_c_counter(impl(cc));
}

void compcntr_priv_notify_slow(struct compcntr_comp_cntr* cc) {
  if (cc) impl(cc)->cxx.native_slot()->notify_slow();
}

int compcntr_comp_cntr_set_owner(struct compcntr_comp_cntr* cc, const char* owner) {
  if (!cc) return null_arg("comp_cntr_set_owner", "cc");
  if (owner == nullptr) {
    if (impl(cc)->owner.load(std::memory_order_acquire) == owner_code(resolved_ref_owner))
      return compcntr::detail::fail(EINVAL,
                                    "comp_cntr_set_owner: counter %u is a reference from "
                                    "compcntr_comp_cntr_resolve; release it instead",
                                    cc->handle)
          .value();
    impl(cc)->owner.store(0, std::memory_order_release);
    return 0;
  }
  const std::uint32_t code = owner_code(owner);
  if (code == 0)
    return compcntr::detail::fail(ENOMEM,
                                  "comp_cntr_set_owner: more than %zu distinct owner "
                                  "names in this process",
                                  max_owner_names)
        .value();
  std::uint32_t none = 0;
  if (!impl(cc)->owner.compare_exchange_strong(none, code, std::memory_order_acq_rel))
    return compcntr::detail::fail(EBUSY, "comp_cntr_set_owner: counter %u is already owned by %s",
                                  cc->handle, owner_name(none))
        .value();
  return 0;
}

int compcntr_set_comp_cntr(struct compcntr_comp_cntr* cc, uint64_t value) {
  if (!cc) return null_arg("set_comp_cntr", "cc");
  impl(cc)->cxx.set(value);
  return 0;
}

int compcntr_set_err_comp_cntr(struct compcntr_comp_cntr* cc, uint64_t value) {
  if (!cc) return null_arg("set_err_comp_cntr", "cc");
  impl(cc)->cxx.set_error(value);
  return 0;
}

int compcntr_inc_comp_cntr(struct compcntr_comp_cntr* cc, uint64_t amount) {
  if (!cc) return null_arg("inc_comp_cntr", "cc");
  impl(cc)->cxx.add(amount);
  return 0;
}

int compcntr_inc_err_comp_cntr(struct compcntr_comp_cntr* cc, uint64_t amount) {
  if (!cc) return null_arg("inc_err_comp_cntr", "cc");
  impl(cc)->cxx.add_error(amount);
  return 0;
}

int compcntr_read_comp_cntr(struct compcntr_comp_cntr* cc, uint64_t* value) {
  if (!cc) return null_arg("read_comp_cntr", "cc");
  if (!value) return null_arg("read_comp_cntr", "value");
  *value = impl(cc)->cxx.value();
  return 0;
}

int compcntr_read_err_comp_cntr(struct compcntr_comp_cntr* cc, uint64_t* value) {
  if (!cc) return null_arg("read_err_comp_cntr", "cc");
  if (!value) return null_arg("read_err_comp_cntr", "value");
  *value = impl(cc)->cxx.errors();
  return 0;
}

int compcntr_comp_cntr_numa_node(struct compcntr_comp_cntr* cc) {
  if (!cc) return -null_arg("comp_cntr_numa_node", "cc");
  return impl(cc)->cxx.numa_node();
}

int compcntr_comp_cntr_get_type(struct compcntr_comp_cntr* cc, enum compcntr_comp_cntr_type* type) {
  if (!cc) return null_arg("comp_cntr_get_type", "cc");
  if (!type) return null_arg("comp_cntr_get_type", "type");
  *type = static_cast<compcntr_comp_cntr_type>(impl(cc)->cxx.type());
  return 0;
}

} // extern "C"
