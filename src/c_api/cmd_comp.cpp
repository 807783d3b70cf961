// The C API of asynchronous command completion (include/compcntr/cmd_comp.h) over
// compcntr::cmd_completion.
module;
#include <compcntr/compcntr.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

module compcntr;

import :c_api;

using namespace compcntr::c_api;

namespace {

// The public struct first (so the two pointers convert), then the C++ owner. Heap-allocated, so
// a use after destroy is a heap-use-after-free that AddressSanitizer reports.
struct c_cmd_comp {
  compcntr_devx_cmd_comp pub;
  compcntr::cmd_completion cxx;
};
static_assert(std::is_standard_layout_v<c_cmd_comp>);

c_cmd_comp* impl(compcntr_devx_cmd_comp* c) noexcept { return reinterpret_cast<c_cmd_comp*>(c); }

static_assert(sizeof(compcntr_devx_async_cmd_hdr) == compcntr::detail::async_cmd_header_bytes);
static_assert(sizeof(compcntr_comp_cntr_values) == compcntr::detail::counter_query_out_bytes);
static_assert(COMPCNTR_COMP_CNTR_ASYNC_RESP_LEN == 24);

} // namespace

extern "C" {

struct compcntr_devx_cmd_comp* compcntr_devx_create_cmd_comp(struct compcntr_device* dev) {
  using compcntr::detail::fail;
  if (!dev) return fail_null<compcntr_devx_cmd_comp>(fail(EINVAL, "create_cmd_comp: dev is NULL"));
  auto* c = new (std::nothrow) c_cmd_comp{};
  if (!c) return fail_null<compcntr_devx_cmd_comp>(fail(ENOMEM, "create_cmd_comp: out of memory"));
  std::error_code ec;
  c->cxx = compcntr::cmd_completion::create(impl(dev)->dev, ec);
  if (ec) {
    delete c;
    return fail_null<compcntr_devx_cmd_comp>(ec);
  }
  c->pub.fd = c->cxx.fd();
  return &c->pub;
}

void compcntr_devx_destroy_cmd_comp(struct compcntr_devx_cmd_comp* cmd_comp) {
  if (!cmd_comp) {
    errno = null_arg("destroy_cmd_comp", "cmd_comp");  // void: errno is the only channel
    return;
  }
  delete impl(cmd_comp);  // ~cmd_completion discards responses and closes the fd
}

int compcntr_devx_get_async_cmd_comp(struct compcntr_devx_cmd_comp* cmd_comp,
                                     struct compcntr_devx_async_cmd_hdr* cmd_resp,
                                     size_t cmd_resp_len) {
  if (!cmd_comp) return null_arg("get_async_cmd_comp", "cmd_comp");
  if (!cmd_resp) return null_arg("get_async_cmd_comp", "cmd_resp");
  return impl(cmd_comp)->cxx.get_raw(cmd_resp, cmd_resp_len);
}

int compcntr_query_comp_cntr_async(struct compcntr_comp_cntr* cc, uint64_t wr_id,
                                   struct compcntr_devx_cmd_comp* cmd_comp) {
  if (!cc) return null_arg("query_comp_cntr_async", "cc");
  if (!cmd_comp) return null_arg("query_comp_cntr_async", "cmd_comp");
  return impl(cmd_comp)->cxx.query(compcntr::c_api::impl(cc)->cxx, wr_id).value();
}

}  // extern "C"
