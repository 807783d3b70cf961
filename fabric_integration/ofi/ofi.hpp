// ofi_compcntr: a layered libfabric provider (DL provider libofi_compcntr-fi.so) that adds
// FI_TRIGGER, deferred work (FI_QUEUE_WORK / FI_CANCEL_WORK / FI_FLUSH_WORK), FI_RMA_EVENT and
// endpoint aliases where the provider below lacks them. Reference: docs/ofi_compcntr.md.
//
// How it sits in libfabric (1.17, src/fabric.c): a provider whose name has the "ofi_" prefix is a
// utility provider. fi_getinfo asks it when the hints name no provider, name a core provider
// alone ("tcp", "shm": rule 1c, any utility provider may layer over it) or end in
// ";ofi_compcntr"; libfabric appends ";ofi_compcntr" to the prov_name of what it returns, and
// fi_fabric on such an fi_info calls our fabric(). Our getinfo (provider.cpp) answers only hints
// that ask for FI_TRIGGER or FI_RMA_EVENT and only with providers that lack them; everything
// else is -FI_ENODATA, so a program asking for neither sees the list it sees without us.
//
// The objects are the provider's own, installed on in place by the hook machinery
// (../hook/hook.hpp: compcntr counters with hidden provider counters mirrored into them); this
// layer adds its behaviour at the machinery's layer_ops points:
//   provider.cpp  fi_prov_ini, getinfo, the fi_info the provider below gets (lower_info)
//   fabric.cpp    fabric(): opens the provider below's fabric and installs on it
//   domain.cpp    domain records; fi_control FI_QUEUE_WORK / FI_CANCEL_WORK / FI_FLUSH_WORK
//   ep.cpp        endpoint records (binds), FI_TRIGGER data calls, FI_RMA_EVENT emulation,
//                 fi_ep_alias where the provider has none
//   cq.cpp        the domain's CQs: entries of the layer's own (emulated RMA events, deferred
//                 work's completions) taken out, the application's passed on
//   cntr.cpp      progress: what the counter calls and CQ reads drive
//   trigger.cpp   armed operations: copies, compcntr triggers, posting, cancel, flush
#ifndef COMPCNTR_FABRIC_OFI_HPP
#define COMPCNTR_FABRIC_OFI_HPP

#include "../cntr_base.hpp"
#include "hook.hpp"

#include <compcntr/trigger.h>

#include <rdma/fi_trigger.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <string>
#include <vector>

namespace compcntr_ofi {

using compcntr_hook::hook_cntr;

/// Remote CQ data of the writes through which the layer emulates FI_RMA_EVENT (ep.cpp): the
/// target's provider counts them on its FI_REMOTE_WRITE counters (rxm: every write carrying CQ
/// data), and cq.cpp drops their CQ entries at the target (counting the counters bound to the
/// memory region they hit: rma_event.cpp). The upper 32 bits are this tag, the lower 32 the low
/// bits of the write's first MR key (the providers that emulate here have cq_data_size 8).
constexpr std::uint64_t k_rma_event_tag = 0xc0c7e17dULL;
constexpr std::uint64_t rma_event_data(std::uint64_t key) noexcept {
  return (k_rma_event_tag << 32) | (key & 0xffffffffULL);
}
constexpr bool is_rma_event_data(std::uint64_t data) noexcept {
  return (data >> 32) == k_rma_event_tag;
}

/// The integer in an enum field of the application's structures (fi_triggered_context's
/// event_type, fi_deferred_work's op_type, an atomic's datatype and op): a C caller may store any
/// int there (issue 22: UBSan at check_ctx). One helper for the libfabric layers: cntr_base.hpp.
using compcntr_fabric::raw_enum;

/// Caps the layer can add.
constexpr std::uint64_t k_added_caps = FI_TRIGGER | FI_RMA_EVENT;

struct domain_st;
struct item;
struct cq_st;

/// What the layer records of an endpoint of its domains.
struct ep_st {
  fid_ep* ep = nullptr;
  domain_st* dom = nullptr;
  std::uint64_t tx_op_flags = 0, rx_op_flags = 0;
  fid_cq* tx_cq = nullptr; ///< bound with FI_TRANSMIT
  fid_cq* rx_cq = nullptr; ///< bound with FI_RECV
  bool tx_selective = false, rx_selective = false; ///< FI_SELECTIVE_COMPLETION in those binds
  fid_cntr* cntr_send = nullptr; ///< bound counters by event (errors of refused posts)
  fid_cntr* cntr_recv = nullptr;
  fid_cntr* cntr_write = nullptr;
  fid_cntr* cntr_read = nullptr;
  fid_cntr* cntr_rwrite = nullptr; ///< FI_REMOTE_WRITE
  fid_cntr* cntr_rread = nullptr; ///< FI_REMOTE_READ
  // Remote-read notification (rma_event.cpp), on endpoints that emulate FI_RMA_EVENT only:
  fid_av* av = nullptr;            ///< the AV bound to the endpoint
  fi_info* hidden_info = nullptr;  ///< the provider's fi_info for the hidden endpoint
  fid_ep* hidden = nullptr;        ///< the layer's endpoint that sends the notifications
  fid_cq* hidden_cq = nullptr;     ///< its CQ (the provider's)
  long reads = 0;                  ///< reads posted whose completion the layer waits for
  std::chrono::steady_clock::duration connect_wait{}; ///< notifications waiting for connections
};

/// A counter bound to a memory region of a domain that emulates FI_RMA_EVENT (rma_event.cpp).
struct mr_rec {
  fid_mr* mr = nullptr;
  std::vector<fid_cntr*> rwrite; ///< bound with FI_REMOTE_WRITE
};

/// A domain of the layer.
struct domain_st {
  fid_domain* d = nullptr;
  bool emulate_rma_event = false; ///< the application asked FI_RMA_EVENT; the provider lacks it
  std::list<item*> items; ///< armed, due or in flight (under g_mu)
  std::deque<item*> ready; ///< due, to be posted in this order (under g_mu)
  std::vector<mr_rec> mrs; ///< emulating domains: their memory regions (under g_mu)
};

/// Everything below is under g_mu (control path, and the progress round).
std::recursive_mutex& mu() noexcept;

/// Items armed, due or in flight in the process: progress() does nothing while 0.
std::atomic<long>& active() noexcept;

// domain.cpp
domain_st* find_domain(fid_domain* d) noexcept;
/// Every domain of the layer (progress).
std::vector<domain_st*>& domains() noexcept;

// ep.cpp
ep_st* find_ep(fid_ep* ep) noexcept;
/// The endpoints of `d` (under mu()).
std::vector<ep_st*> eps_of(domain_st* d) noexcept;
// alias.cpp
/// The endpoint an operation is posted on: an alias of ours stands for its endpoint.
fid_ep* base_ep(fid_ep* ep) noexcept;
/// fi_ep_alias(base, ...) the provider refused: an alias endpoint of the layer's. 0 or -FI_E*.
int make_alias(fid_ep* base, struct fi_alias* arg);
// ep.cpp (continued)
/// The provider below's *msg calls (bypassing the layer and the machinery's wrappers).
ssize_t post_sendmsg(fid_ep* ep, const fi_msg* msg, std::uint64_t flags) noexcept;
ssize_t post_recvmsg(fid_ep* ep, const fi_msg* msg, std::uint64_t flags) noexcept;
ssize_t post_tsendmsg(fid_ep* ep, const fi_msg_tagged* msg, std::uint64_t flags) noexcept;
ssize_t post_trecvmsg(fid_ep* ep, const fi_msg_tagged* msg, std::uint64_t flags) noexcept;
ssize_t post_writemsg(fid_ep* ep, const fi_msg_rma* msg, std::uint64_t flags) noexcept;
ssize_t post_readmsg(fid_ep* ep, const fi_msg_rma* msg, std::uint64_t flags) noexcept;
ssize_t post_atomicmsg(fid_ep* ep, const fi_msg_atomic* msg, const fi_ioc* comparev,
                       void** compare_desc, size_t compare_count, fi_ioc* resultv,
                       void** result_desc, size_t result_count, std::uint64_t flags,
                       int kind) noexcept;

// cq.cpp
int cq_open(fid_domain* d, fi_cq_attr* attr, fid_cq** cq, void* context, const fi_ops_domain* orig);
/// Reads what the provider has on `cq` into the CQ's own queue (the layer's entries handled).
void cq_drain(fid_cq* cq) noexcept;
/// Room for one error entry of the layer's own on `cq` (false: no memory; nothing changed).
/// Made before a triggered operation is posted, so that a refusal is never lost.
bool cq_reserve_error(fid_cq* cq) noexcept;
/// Gives back the room of cq_reserve_error (the operation was posted or will be retried).
void cq_unreserve_error(fid_cq* cq) noexcept;
/// An error entry of the layer's own (a triggered operation the provider refused to post),
/// in the room cq_reserve_error made.
void cq_push_error(fid_cq* cq, void* context, std::uint64_t flags, int err) noexcept;
/// The layer's posted operations waiting for their completion entry (context -> item).
/// inflight_add is called before the operation is posted (false: no memory, not posted).
bool inflight_add(item* it) noexcept;
void inflight_remove(item* it) noexcept;

// rma_event.cpp: FI_RMA_EVENT emulation for remote reads and memory-region counters
/// Items of the emulation in the process (reads followed, notifications due or in flight,
/// MR-bound counters): progress() runs rma_round while it is not 0.
std::atomic<long>& rma_active() noexcept;
/// A read on an endpoint that emulates FI_RMA_EVENT: posted with a context of the layer, so
/// that its completion sends the target its notification. Other reads: the provider's.
ssize_t read_counted(fid_ep* ep, const fi_msg_rma* msg, std::uint64_t flags) noexcept;
/// A CQ entry whose context is a followed read (cq.cpp's keep, under mu()): restores the
/// context it was posted with, makes its notification due (not for an error), sets *wants to
/// whether the entry goes on. false: not one of them.
bool read_completed(fi_cq_tagged_entry& e, bool error, bool* wants) noexcept;
/// A remote write of the layer arrived at `d` (its CQ entry's data): counts the counters bound
/// to the memory region it hit (under mu()).
void remote_write_seen(domain_st* d, std::uint64_t data) noexcept;
/// Posts due notifications; reaps the hidden endpoints' completions; drains the CQs where
/// followed reads complete and where MR-counted writes arrive (under mu(), inside the layer).
void rma_round() noexcept;
/// Posts due notifications only (after an application's CQ read completed followed reads).
void rma_post_due() noexcept;
/// An endpoint's records of the emulation (ep.cpp): opened, bound to an AV, closing.
void rma_ep_opened(ep_st* e, const fi_info* info) noexcept;
void rma_ep_closing(ep_st* e) noexcept;
/// CQ `cq` closed (cq.cpp, after the provider's close): the followed reads that were to
/// complete there and whose entry never came (their endpoint closed first) are freed.
void rma_cq_closed(fid_cq* cq) noexcept;
/// layer_ops::mr_opened / mr_closing / mr_bind; counter close (forgets its MR bindings).
void rma_mr_opened(fid_domain* d, fid_mr* mr);
void rma_mr_closing(fid_mr* mr);
bool rma_mr_bind(fid_mr* mr, fid_cntr* c, std::uint64_t flags, int* r);
void rma_cntr_closed(fid_cntr* c) noexcept;

// cntr.cpp
/// One round (cntr.cpp's file comment). `pulled`: a counter the caller pulled just before
/// (layer_ops::progress): not pulled again.
void progress(const compcntr_hook::hook_cntr* pulled = nullptr) noexcept;
bool busy() noexcept;
/// Marks the calling thread as inside the layer (nested progress calls return at once).
class in_layer {
 public:
  in_layer() noexcept;
  ~in_layer();
  bool nested() const noexcept { return nested_; }
  in_layer(const in_layer&) = delete;
  in_layer& operator=(const in_layer&) = delete;

 private:
  bool nested_;
};

// trigger.cpp
/// FI_TRIGGER data calls (ep.cpp's entries after it checked the context).
ssize_t arm_msg(fid_ep* ep, const fi_msg* msg, const fi_msg_tagged* tmsg, std::uint64_t flags,
                bool recv, const fi_triggered_context* tc);
ssize_t arm_rma(fid_ep* ep, const fi_msg_rma* msg, std::uint64_t flags, bool write,
                const fi_triggered_context* tc);
ssize_t arm_atomic(fid_ep* ep, const fi_msg_atomic* msg, const fi_ioc* comparev,
                   void** compare_desc, size_t compare_count, fi_ioc* resultv, void** result_desc,
                   size_t result_count, std::uint64_t flags, int kind,
                   const fi_triggered_context* tc);
/// FI_QUEUE_WORK / FI_CANCEL_WORK / FI_FLUSH_WORK.
int queue_work(domain_st* ds, const fi_deferred_work* w);
int cancel_work(domain_st* ds, const fi_deferred_work* w);
int flush_work(domain_st* ds);
/// Posts the due items of every domain in order (under mu()); frees finished ones.
void post_ready() noexcept;
/// The counters a progress round pulls: the triggering counters of armed items, and one
/// counter bound to each endpoint that none of those (nor `pulled`, fresh) is bound to.
void armed_counters(std::vector<hook_cntr*>& out, const hook_cntr* pulled) noexcept;
/// The CQs where posted items' completions will appear (progress drains them).
void inflight_cqs(std::vector<fid_cq*>& out) noexcept;
/// A completion entry of a posted item (cq.cpp): counts its completion counter; returns the
/// application's context and whether the application wants the entry.
void* item_completed(item* it, bool error, bool* app_wants) noexcept;
/// Cancels and frees every item of `ds` (domain close) or that posts on `ep` (endpoint close).
void drop_items(domain_st* ds, fid_ep* ep) noexcept;
/// fi_close of counter `c` (layer_ops::cntr_closing): -FI_EBUSY while an armed, due or in-flight
/// item names it as its FI_OP_CNTR_ADD/SET target or its completion counter, else 0.
int cntr_closing(fid_cntr* c) noexcept;

} // namespace compcntr_ofi

#endif
