// The C API of wrapped verbs QPs (include/compcntr/verbs.h).
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

module compcntr;

import :c_api;

using namespace compcntr::c_api;
using compcntr::detail::fail;

extern "C" {

struct compcntr_qp* compcntr_wrap_ibv_qp(struct compcntr_device* dev, struct ibv_qp* vqp,
                                         const struct compcntr_verbs_qp_attr* attr) {
  if (!dev) return fail_null<compcntr_qp>(fail(EINVAL, "wrap_verbs_qp: dev is NULL"));
  if (!vqp) return fail_null<compcntr_qp>(fail(EINVAL, "wrap_verbs_qp: ibv_qp is NULL"));
  if (!attr) return fail_null<compcntr_qp>(fail(EINVAL, "wrap_verbs_qp: attr is NULL"));
  compcntr::verbs_qp_options opts;
  opts.comp_mask = attr->comp_mask;
  opts.send_cq = attr->send_cq;
  opts.recv_cq = attr->recv_cq;
  opts.wr_info = attr->wr_info;
  opts.wr_info_ctx = attr->wr_info_ctx;
  auto* q = new (std::nothrow) qp_obj{};
  if (!q) return fail_null<compcntr_qp>(fail(ENOMEM, "wrap_verbs_qp: out of memory"));
  std::error_code ec;
  q->cxx = impl(dev)->dev.wrap_verbs_qp(vqp, opts, ec);
  if (ec) {
    delete q;
    return fail_null<compcntr_qp>(ec);
  }
  return pub(q);
}

}  // extern "C"
