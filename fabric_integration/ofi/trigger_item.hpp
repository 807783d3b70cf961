// ofi_compcntr's armed operation (an FI_TRIGGER call or an FI_QUEUE_WORK item), shared by
// trigger.cpp (arming, cancel, flush) and post.cpp (posting due items, their completions).
#ifndef COMPCNTR_OFI_TRIGGER_ITEM_HPP
#define COMPCNTR_OFI_TRIGGER_ITEM_HPP

#include "ofi.hpp"

#include <cstdint>
#include <vector>

namespace compcntr_ofi {

enum kind_t : int {
  k_send,
  k_recv,
  k_tsend,
  k_trecv,
  k_write,
  k_read,
  k_atomic,
  k_cntr_add,
  k_cntr_set
};
enum state_t : int { s_armed, s_due, s_inflight, s_done };

struct item {
  fi_context2 ctx{}; // first: the context of a posted deferred-work operation (cq.cpp)
  domain_st* dom = nullptr;
  kind_t kind = k_send;
  int atomic_kind = 0; // 0 write, 1 fetch, 2 compare
  state_t state = s_armed;
  fid_ep* ep = nullptr;
  std::uint64_t flags = 0;
  fi_addr_t addr = FI_ADDR_UNSPEC;
  void* context = nullptr; // the application's
  std::uint64_t data = 0, tag = 0, ignore = 0, value = 0;
  int dt = 0, op = 0; // an atomic's datatype and op, as the application's integers (raw_enum)
  std::vector<iovec> iov;
  std::vector<fi_ioc> ioc, res, cmp;
  std::vector<void*> desc, res_desc, cmp_desc;
  std::vector<fi_rma_iov> riov;
  std::vector<fi_rma_ioc> rioc;
  fid_cntr* target = nullptr;     // FI_OP_CNTR_ADD / SET
  fid_cntr* completion = nullptr; // fi_deferred_work's completion counter
  const fi_deferred_work* work = nullptr; // FI_QUEUE_WORK's (FI_CANCEL_WORK finds it)
  compcntr_trigger* trig = nullptr;
  hook_cntr* trig_cntr = nullptr;
};

/// Finished: the trigger destroyed, the item freed (under mu(); never inside fire()).
void finish(item* it) noexcept;
/// Posts one due item (under mu()). -FI_EAGAIN: try again at the next progress call (nothing
/// changed); 0 otherwise (a refusal completes the item with an error entry: post.cpp).
ssize_t post(item* it) noexcept;
/// The CQ of the direction an item posts on.
fid_cq* cq_of(item* it, ep_st* e) noexcept;

} // namespace compcntr_ofi

#endif
