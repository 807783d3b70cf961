// The C API of devices and counters (include/compcntr/compcntr.h): NULL checks and errno
// mapping over `import compcntr;`. Other call families live beside this file, one per file.
#include <compcntr/compcntr.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <new>
#include <string>
#include <system_error>
#include <utility>

import compcntr;

#include "internal.hpp"

using namespace compcntr::c_api;

extern "C" {

const char* compcntr_version(void) { return compcntr::version().data(); }

const char* compcntr_last_error_message(void) { return compcntr::last_error_message().data(); }

struct compcntr_device* compcntr_open_device(const char* name) {
  std::error_code ec;
  compcntr::device dev = compcntr::device::open(name ? name : "auto", ec);
  if (ec) return fail_null<compcntr_device>(ec);
  compcntr_device* d = nullptr;
  try {
    d = new compcntr_device{std::move(dev), {}};
    d->name = d->dev.name();
  } catch (...) {  // std::bad_alloc (the name is copied): nothing is left open
    if (d) {
      std::error_code ignored;
      d->dev.close(ignored);
      delete d;
    }
    return fail_null<compcntr_device>(compcntr::detail::fail(ENOMEM, "open_device: out of memory"));
  }
  return d;
}

int compcntr_close_device(struct compcntr_device* dev) {
  if (!dev) return null_arg("close_device", "dev");
  std::error_code ec;
  dev->dev.close(ec);
  if (ec) return ec.value();
  delete dev;
  return 0;
}

const char* compcntr_device_name(const struct compcntr_device* dev) {
  if (!dev) {
    compcntr::detail::fail(EINVAL, "device_name: dev is NULL");
    return nullptr;
  }
  return dev->name.c_str();
}

int compcntr_query_comp_cntr_caps(struct compcntr_device* dev, struct compcntr_comp_cntr_caps* caps) {
  if (!dev) return null_arg("query_comp_cntr_caps", "dev");
  if (!caps) return null_arg("query_comp_cntr_caps", "caps");
  const compcntr::counter_caps c = dev->dev.caps();
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
  if (attr->comp_mask & ~std::uint32_t{COMPCNTR_COMP_CNTR_INIT_ATTR_NUMA_NODE})
    return fail_null<compcntr_comp_cntr>(
        fail(EINVAL, "create_comp_cntr: unknown comp_mask bit(s) 0x%x",
             attr->comp_mask & ~std::uint32_t{COMPCNTR_COMP_CNTR_INIT_ATTR_NUMA_NODE}));
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
  auto* c = new (std::nothrow) c_counter{};
  if (!c) return fail_null<compcntr_comp_cntr>(fail(ENOMEM, "create_comp_cntr: out of memory"));
  std::error_code ec;
  c->cxx = dev->dev.create_counter(opts, ec);
  if (ec) {
    delete c;
    return fail_null<compcntr_comp_cntr>(ec);
  }
  c->pub.context = dev;
  c->pub.handle = c->cxx.index();
  return &c->pub;
}

int compcntr_destroy_comp_cntr(struct compcntr_comp_cntr* cc) {
  if (!cc) return null_arg("destroy_comp_cntr", "cc");
  std::error_code ec;
  impl(cc)->cxx.destroy(ec);
  if (ec) return ec.value();
  delete impl(cc);
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

}  // extern "C"
