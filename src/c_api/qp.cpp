// The C API of QPs, memory registration, posting and progress (include/compcntr/qp.h): NULL
// checks and errno mapping in the module (a unit of module compcntr).
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
using compcntr::detail::fail;

namespace {

// A C memory region: the public verbs-shaped struct first (so the two pointers convert), then
// the C++ owner of the registration.
struct c_mr {
  compcntr_mr pub;
  compcntr::memory_region cxx;
};
static_assert(std::is_standard_layout_v<c_mr>);
c_mr* impl(compcntr_mr* mr) noexcept { return reinterpret_cast<c_mr*>(mr); }

static_assert(compcntr::access::local_write == COMPCNTR_ACCESS_LOCAL_WRITE);
static_assert(compcntr::access::remote_write == COMPCNTR_ACCESS_REMOTE_WRITE);
static_assert(compcntr::access::remote_read == COMPCNTR_ACCESS_REMOTE_READ);
static_assert(static_cast<uint32_t>(compcntr::attach_op::send) ==
              COMPCNTR_QP_ATTACH_COMP_CNTR_OP_SEND);
static_assert(static_cast<uint32_t>(compcntr::attach_op::recv) ==
              COMPCNTR_QP_ATTACH_COMP_CNTR_OP_RECV);
static_assert(static_cast<uint32_t>(compcntr::attach_op::rdma_read) ==
              COMPCNTR_QP_ATTACH_COMP_CNTR_OP_RDMA_READ);
static_assert(static_cast<uint32_t>(compcntr::attach_op::remote_rdma_read) ==
              COMPCNTR_QP_ATTACH_COMP_CNTR_OP_REMOTE_RDMA_READ);
static_assert(static_cast<uint32_t>(compcntr::attach_op::rdma_write) ==
              COMPCNTR_QP_ATTACH_COMP_CNTR_OP_RDMA_WRITE);
static_assert(static_cast<uint32_t>(compcntr::attach_op::remote_rdma_write) ==
              COMPCNTR_QP_ATTACH_COMP_CNTR_OP_REMOTE_RDMA_WRITE);
static_assert(static_cast<uint32_t>(compcntr::qp_state::reset) == COMPCNTR_QPS_RESET);
static_assert(static_cast<uint32_t>(compcntr::qp_state::init) == COMPCNTR_QPS_INIT);
static_assert(static_cast<uint32_t>(compcntr::qp_state::rts) == COMPCNTR_QPS_RTS);
static_assert(static_cast<uint32_t>(compcntr::qp_state::err) == COMPCNTR_QPS_ERR);

int result(const std::error_code& ec) noexcept { return ec ? ec.value() : 0; }

} // namespace

extern "C" {

struct compcntr_qp* compcntr_create_qp(struct compcntr_device* dev) {
  if (!dev) return fail_null<compcntr_qp>(fail(EINVAL, "create_qp: dev is NULL"));
  auto* q = new (std::nothrow) qp_obj{};
  if (!q) return fail_null<compcntr_qp>(fail(ENOMEM, "create_qp: out of memory"));
  std::error_code ec;
  q->cxx = impl(dev)->dev.create_qp(ec);
  if (ec) {
    delete q;
    return fail_null<compcntr_qp>(ec);
  }
  return pub(q);
}

int compcntr_destroy_qp(struct compcntr_qp* qp) {
  if (!qp) return null_arg("destroy_qp", "qp");
  delete impl(qp);
  return 0;
}

int compcntr_modify_qp(struct compcntr_qp* qp, enum compcntr_qp_state state) {
  if (!qp) return null_arg("modify_qp", "qp");
  // Read the raw bits: an out-of-range value in a C enum must not be loaded as one.
  uint32_t raw;
  static_assert(sizeof state == sizeof raw);
  std::memcpy(&raw, &state, sizeof raw);
  if (raw > COMPCNTR_QPS_ERR) return fail(EINVAL, "modify_qp: unknown state %u", raw).value();
  std::error_code ec;
  impl(qp)->cxx.modify(static_cast<compcntr::qp_state>(raw), ec);
  return result(ec);
}

int compcntr_connect_qp(struct compcntr_qp* qp, struct compcntr_qp* peer) {
  if (!qp) return null_arg("connect_qp", "qp");
  if (!peer) return null_arg("connect_qp", "peer");
  std::error_code ec;
  impl(qp)->cxx.connect(impl(peer)->cxx, ec);
  return result(ec);
}

enum compcntr_qp_state compcntr_qp_state(const struct compcntr_qp* qp) {
  if (!qp) {
    errno = null_arg("qp_state", "qp");
    return COMPCNTR_QPS_ERR;
  }
  return static_cast<enum compcntr_qp_state>(impl(qp)->cxx.state());
}

int compcntr_qp_attach_comp_cntr(struct compcntr_qp* qp, struct compcntr_comp_cntr* cc,
                                 struct compcntr_qp_attach_comp_cntr_attr* attr) {
  if (!qp) return null_arg("qp_attach_comp_cntr", "qp");
  if (!cc) return null_arg("qp_attach_comp_cntr", "cc");
  if (!attr) return null_arg("qp_attach_comp_cntr", "attr");
  std::error_code ec;
  impl(qp)->cxx.attach(impl(cc)->cxx, compcntr::attach_options{attr->comp_mask, attr->op_mask}, ec);
  return result(ec);
}

struct compcntr_mr* compcntr_reg_mr(struct compcntr_device* dev, void* addr, size_t length,
                                    int access) {
  if (!dev) return fail_null<compcntr_mr>(fail(EINVAL, "reg_mr: dev is NULL"));
  if (access < 0)
    return fail_null<compcntr_mr>(
        fail(EINVAL, "reg_mr: unknown access bit(s) 0x%x", static_cast<unsigned>(access)));
  auto* m = new (std::nothrow) c_mr{};
  if (!m) return fail_null<compcntr_mr>(fail(ENOMEM, "reg_mr: out of memory"));
  std::error_code ec;
  m->cxx = impl(dev)->dev.reg_mr(addr, length, static_cast<uint32_t>(access), ec);
  if (ec) {
    delete m;
    return fail_null<compcntr_mr>(ec);
  }
  m->pub.addr = m->cxx.addr();
  m->pub.length = m->cxx.length();
  m->pub.lkey = m->cxx.lkey();
  m->pub.rkey = m->cxx.rkey();
  return &m->pub;
}

int compcntr_dereg_mr(struct compcntr_mr* mr) {
  if (!mr) return null_arg("dereg_mr", "mr");
  delete impl(mr);
  return 0;
}

int compcntr_post_recv(struct compcntr_qp* qp, uint64_t wr_id, void* addr, size_t len,
                       uint32_t lkey) {
  if (!qp) return null_arg("post_recv", "qp");
  std::error_code ec;
  impl(qp)->cxx.post_recv(wr_id, addr, len, lkey, ec);
  return result(ec);
}

int compcntr_post_send(struct compcntr_qp* qp, uint64_t wr_id, const void* addr, size_t len,
                       uint32_t lkey) {
  if (!qp) return null_arg("post_send", "qp");
  std::error_code ec;
  impl(qp)->cxx.post_send(wr_id, addr, len, lkey, ec);
  return result(ec);
}

int compcntr_post_rdma_write(struct compcntr_qp* qp, uint64_t wr_id, const void* addr, size_t len,
                             uint32_t lkey, uint64_t remote_addr, uint32_t rkey) {
  if (!qp) return null_arg("post_rdma_write", "qp");
  std::error_code ec;
  impl(qp)->cxx.post_rdma_write(wr_id, addr, len, lkey, remote_addr, rkey, ec);
  return result(ec);
}

int compcntr_post_rdma_read(struct compcntr_qp* qp, uint64_t wr_id, void* addr, size_t len,
                            uint32_t lkey, uint64_t remote_addr, uint32_t rkey) {
  if (!qp) return null_arg("post_rdma_read", "qp");
  std::error_code ec;
  impl(qp)->cxx.post_rdma_read(wr_id, addr, len, lkey, remote_addr, rkey, ec);
  return result(ec);
}

int compcntr_progress(struct compcntr_device* dev, size_t* completions) {
  if (!dev) return null_arg("progress", "dev");
  const std::size_t n = impl(dev)->dev.progress();
  if (completions) *completions = n;
  return 0;
}

}  // extern "C"
