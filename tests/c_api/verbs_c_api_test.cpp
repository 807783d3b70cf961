// The verbs C API (include/compcntr/verbs.h): compcntr_wrap_ibv_qp and compcntr_progress over fake
// CQs (tests/support/fake_verbs.hpp).
#include <doctest/doctest.h>

#include "compcntr_config.h"

#if COMPCNTR_HAVE_VERBS
#include <infiniband/verbs.h>
#endif

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

import compcntr;

#include <compcntr/verbs.h>

#include "qp_fixture.hpp"
#if COMPCNTR_HAVE_VERBS
#include "fake_verbs.hpp"
#endif

using namespace qpt;
#if COMPCNTR_HAVE_VERBS
using namespace fake_verbs;
#endif

#if COMPCNTR_HAVE_VERBS

TEST_CASE("C: compcntr_wrap_ibv_qp and compcntr_progress") {
  compcntr_device* dev = compcntr_open_device("soft");
  REQUIRE(dev);
  fake_cq cq;
  fake_qp vq(81);
  compcntr_verbs_qp_attr attr{};
  attr.send_cq = &cq;
  errno = 0;
  CHECK(compcntr_wrap_ibv_qp(nullptr, &vq, &attr) == nullptr);
  CHECK(errno == EINVAL);
  errno = 0;
  CHECK(compcntr_wrap_ibv_qp(dev, nullptr, &attr) == nullptr);
  CHECK(errno == EINVAL);
  errno = 0;
  CHECK(compcntr_wrap_ibv_qp(dev, &vq, nullptr) == nullptr);
  CHECK(errno == EINVAL);
  attr.send_cq = nullptr;
  errno = 0;
  CHECK(compcntr_wrap_ibv_qp(dev, &vq, &attr) == nullptr);
  CHECK(errno == EINVAL);
  attr.send_cq = &cq;
  compcntr_qp* q = compcntr_wrap_ibv_qp(dev, &vq, &attr);
  REQUIRE(q);
  compcntr_comp_cntr_init_attr ca{};
  compcntr_comp_cntr* cc = compcntr_create_comp_cntr(dev, &ca);
  REQUIRE(cc);
  compcntr_qp_attach_comp_cntr_attr aa{0, COMPCNTR_QP_ATTACH_COMP_CNTR_OP_RECV};
  CHECK(compcntr_qp_attach_comp_cntr(q, cc, &aa) == 0);
  aa.op_mask = COMPCNTR_QP_ATTACH_COMP_CNTR_OP_REMOTE_RDMA_WRITE;
  CHECK(compcntr_qp_attach_comp_cntr(q, cc, &aa) == ENOTSUP);
  CHECK(compcntr_post_send(q, 1, &vq, 1, 1) == ENOTSUP);
  cq.ok(IBV_WC_RECV, 5);
  cq.ok(IBV_WC_RECV, 5);
  std::size_t n = 0;
  CHECK(compcntr_progress(nullptr, &n) == EINVAL);
  CHECK(compcntr_progress(dev, &n) == 0);
  CHECK(n == 2);
  CHECK(compcntr_progress(dev, nullptr) == 0);
  std::uint64_t v = 0;
  CHECK(compcntr_read_comp_cntr(cc, &v) == 0);
  CHECK(v == 2);
  CHECK(compcntr_destroy_comp_cntr(cc) == EBUSY);
  CHECK(compcntr_destroy_qp(q) == 0);
  CHECK(compcntr_destroy_comp_cntr(cc) == 0);
  CHECK(compcntr_close_device(dev) == 0);
}

#endif  // COMPCNTR_HAVE_VERBS
