// The compcntr hook provider (libcompcntr-fi.so, provider name ofi_hook_compcntr): internals
// shared by its translation units. Reference: docs/hook.md.
//
// How the hook sits in libfabric (1.17, learned from src/fabric.c): libfabric dlopens every
// *-fi.so of FI_PROVIDER_PATH (default $libdir/libfabric), calls fi_prov_ini(), and a provider
// whose getinfo is NULL is a hook. With FI_HOOK=compcntr, every successful fi_fabric() calls our
// fabric(attr, &fabric, hooked_provider) with attr->fabric the provider's fabric; whatever we
// store in *fabric is what the application gets.
//
// Installing in place. Debian's libfabric exports no hook framework, and wrapping every object
// class (as libfabric's in-tree hooks do) would put a hop on every data-path call and require
// translating every fid the application passes or receives (CQ/EQ entries, AV, MR descriptors).
// Instead the hook keeps the provider's objects and replaces only their ops-table *pointers*
// with copies in which the few entries it owns are wrapped; every other entry is the provider's
// own function pointer, so all of it passes straight through with no extra call:
//   fabric:  domain, domain2 (to install on domains), trywait (mixed compcntr/provider fids)
//   domain:  cntr_open (compcntr counters), endpoint, endpoint2, scalable_ep, srx_ctx, poll_open,
//            mr reg/regv/regattr (to install on what they return), fid control (FI_QUEUE_WORK),
//            fid close (bookkeeping)
//   ep:      fid bind (counters -> hidden provider counter), fid control (re-install after
//            FI_ENABLE), tx_ctx / rx_ctx, and the *msg data calls (sendmsg, writemsg, ...) only to
//            translate FI_TRIGGER contexts naming a compcntr counter
//   mr:      fid bind (counters);   pollset: poll_add / poll_del (counters)
// A wrapper finds the provider's table from the copy it is called through (the copy records
// its original), so no lookup happens on any call.
#ifndef COMPCNTR_FABRIC_HOOK_HPP
#define COMPCNTR_FABRIC_HOOK_HPP

#include <compcntr/fabric.h>

#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <rdma/providers/fi_prov.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>

namespace compcntr_hook {

/// This provider (for fi_log and fi_param): the hook's (main.cpp) or ofi_compcntr's (../ofi/).
fi_provider& self() noexcept;

/// What differs between the two modules built on this machinery: the environment variable
/// naming the stats file and the first word of the stats line.
struct module_names {
  const char* stats_env;
  const char* stats_prefix;
};
const module_names& module() noexcept;
/// Reads the settings (cfg()) from the environment; the module's fi_prov_ini calls it.
void read_config() noexcept;

/// The layered provider ofi_compcntr (../ofi/ofi.hpp) builds on this machinery and adds its own
/// behaviour at these points; the hook's layer() is nullptr and nothing below is called.
struct hook_cntr;  // hook_cntr.hpp

struct layer_ops {
  /// The fi_info to hand the provider below for an fi_info the application got from the layer
  /// (fi_dupinfo'd; nullptr: pass `info` as it is). Freed with fi_freeinfo.
  fi_info* (*lower_info)(const fi_info* info);
  /// After a domain was opened and installed on (`info`: the application's).
  void (*domain_opened)(fid_domain* d, const fi_info* info);
  /// fi_close of a domain, before the provider's close; and the domain's fi_control.
  void (*domain_closing)(fid_domain* d);
  int (*domain_control)(fid* f, int command, void* arg, const fi_ops* orig);
  /// fi_cq_open of the domain (the layer installs its reads on the CQ).
  int (*cq_open)(fid_domain* d, fi_cq_attr* attr, fid_cq** cq, void* context,
                 const fi_ops_domain* orig);
  /// After an endpoint was opened and installed on; a successful bind; before its close.
  void (*ep_opened)(fid_ep* ep, fid_domain* d, const fi_info* info);
  void (*ep_bound)(fid_ep* ep, fid* bfid, std::uint64_t flags);
  void (*ep_closing)(fid_ep* ep);
  /// fi_control(ep, command) the provider refused (FI_ALIAS where the provider has no aliases):
  /// the layer's answer, or `r` unchanged.
  int (*ep_control_refused)(fid* f, int command, void* arg, int r);
  /// The *msg data calls with FI_TRIGGER (or, for writes, every one on an endpoint where the
  /// layer emulates FI_RMA_EVENT): the layer's answer. `orig`: the provider's table.
  ssize_t (*sendmsg)(fid_ep* ep, const fi_msg* msg, std::uint64_t flags, bool tagged,
                     const fi_msg_tagged* tmsg);
  ssize_t (*recvmsg)(fid_ep* ep, const fi_msg* msg, std::uint64_t flags, bool tagged,
                     const fi_msg_tagged* tmsg);
  ssize_t (*rmamsg)(fid_ep* ep, const fi_msg_rma* msg, std::uint64_t flags, bool write);
  ssize_t (*atomicmsg)(fid_ep* ep, const fi_msg_atomic* msg, const fi_ioc* comparev,
                       void** compare_desc, size_t compare_count, fi_ioc* resultv,
                       void** result_desc, size_t result_count, std::uint64_t flags, int kind);
  /// Whether writes and reads on `ep` must go through rmamsg (the layer emulates FI_RMA_EVENT
  /// there).
  bool (*emulates_rma_event)(fid_ep* ep);
  /// After fi_mr_reg / regv / regattr of domain `d` returned `mr`; before the MR's fi_close.
  void (*mr_opened)(fid_domain* d, fid_mr* mr);
  void (*mr_closing)(fid_mr* mr);
  /// fi_mr_bind of counter `c` (one of the machinery's) to `mr`: true when the layer answered
  /// (its answer in *r; the provider is not called), false to bind as the hook does.
  bool (*mr_bind)(fid_mr* mr, fid_cntr* c, std::uint64_t flags, int* r);
  /// fi_close of one of the layer's counters, before anything is closed: 0, or the answer
  /// (-FI_EBUSY: armed, due or in-flight work would still update it).
  int (*cntr_closing)(fid_cntr* c);
  /// After every counter read, wait round, add and set: the layer's deferred work runs here.
  /// `pulled`: a counter the caller pulled from the provider just before (its value is fresh:
  /// the round need not drive the provider for it again), or nullptr.
  void (*progress)(const hook_cntr* pulled);
  /// Whether the layer has work the next progress call should retry at once (a wait that would
  /// sleep on the provider's fds goes round again instead).
  bool (*busy)();
};
const layer_ops* layer() noexcept;

/// A copy of a provider's ops table with some entries replaced. `ops` is the first member: the
/// object's table pointer points at it, and a wrapper gets back to `orig` from that pointer.
template <class Ops>
struct patched {
  Ops ops;
  const Ops* orig;
};
template <class Ops>
inline const Ops* orig_of(const Ops* p) noexcept {
  return reinterpret_cast<const patched<Ops>*>(p)->orig;
}

/// Settings read from the environment once, when libfabric loads the hook.
struct config {
  bool progress_thread = false;       ///< COMPCNTR_FI_PROGRESS_THREAD=1 (or =always), and
      ///< not declined for a pinned process (below)
  /// COMPCNTR_FI_PROGRESS_THREAD=1 asked for the thread, but the process is pinned to one CPU of
  /// several (a launcher's binding, e.g. mpiexec's --bind-to core): the thread would run only by
  /// preempting the application's thread on that CPU, so counters use caller progress (=always
  /// starts it anyway).
  bool progress_thread_declined = false;
  std::int64_t wait_spin_ns = 100'000;  ///< COMPCNTR_FI_WAIT_SPIN_US (default 100)
  /// Spin of a wait that can sleep on a provider wait set whose fds report arriving data
  /// (FI_WAIT_UNSPEC/FD counters of tcp;ofi_rxm and udp;ofi_rxd): 0 unless
  /// COMPCNTR_FI_WAIT_SPIN_US is set. Such a wait runs one progress round, then sleeps on the
  /// provider's fds, as libfabric's own wait does: spinning there lost to it (P13: 122 us against
  /// 13 us per round trip; the spinner holds a CPU its peer process or another runnable task
  /// needs). (shm refuses wait sets: its waits take compcntr's wait, spinning wait_spin_ns.)
  std::int64_t fd_wait_spin_ns = 0;
  std::uint32_t progress_idle_us = 1000; ///< COMPCNTR_FI_PROGRESS_IDLE_US: progress thread's
      ///< sleep between rounds once idle for 10 ms
  std::string stats_path; ///< COMPCNTR_FI_HOOK_STATS
};
const config& cfg() noexcept;

/// Process-wide statistics (the COMPCNTR_FI_HOOK_STATS line). Relaxed RMWs, off the hot paths;
/// per-read counts live in each counter and are summed when it closes.
struct statistics {
  std::atomic<std::uint64_t> fabrics{0}, domains{0}, cntr_open{0}, cntr_served{0},
      cntr_open_refused{0}, cntr_bound{0}, cntr_closed{0}, reads{0}, readerrs{0}, waits{0},
      trywaits{0}, triggers_translated{0}, work_translated{0}, fd_waits{0};
};
statistics& stats() noexcept;
void write_stats() noexcept; ///< once per process (cleanup or module destructor)

/// The compcntr device every hook counter lives on ("soft": software counters in the pool).
compcntr_device* device() noexcept;

/// What the hook records about each fabric it was installed on.
struct fabric_state {
  fid_fabric* fabric = nullptr;
  const fi_provider* prov = nullptr; ///< the provider under the hook
  std::string prov_name;
  bool sockets = false; ///< the sockets provider: its counter semantics differ (hook_cntr.cpp)
};
struct domain_state {
  fid_domain* domain = nullptr;
  fabric_state* fabric = nullptr;
  const fi_ops_domain* orig = nullptr; ///< the provider's domain ops (to open hidden counters)
  bool progress_thread = false; ///< the progress thread drives this domain's counters (it was
      ///< opened FI_THREAD_SAFE)
  bool auto_progress = false; ///< data_progress FI_PROGRESS_AUTO (sockets: the provider's own
      ///< thread moves data; a waiter must not spin against it)
};

fabric_state* find_fabric(fid_fabric* f) noexcept;
domain_state* find_domain(fid_domain* d) noexcept;
/// The records (provider.cpp): kept from installation until the object's close succeeds.
bool add_fabric(std::unique_ptr<fabric_state> fs) noexcept; ///< false without memory
void forget_fabric(fid_fabric* f) noexcept;
bool add_domain(std::unique_ptr<domain_state> ds) noexcept; ///< false without memory
void forget_domain(fid_domain* d) noexcept;

// ---- counters (hook_cntr.cpp) ----------------------------------------------------------------

struct hook_cntr;
/// The hook counter behind `f`, or nullptr if `f` is not one (reads only the fid header).
hook_cntr* as_hook_cntr(const fid* f) noexcept;
/// The provider counter a hook counter stands for (never nullptr for a live counter).
fid_cntr* hidden_of(hook_cntr* c) noexcept;
/// A successful bind of the hidden counter (statistics; progress bookkeeping).
void note_bound(hook_cntr* c) noexcept;
/// fi_ep_bind / fi_mr_bind of hook counter `h` to `f`: binds its hidden provider counter through
/// the provider's bind `orig` and notes a success (note_bound); -FI_EINVAL if `h` has no hidden
/// counter. Call with a control_guard held (a control-path operation).
int bind_hidden(const fi_ops* orig, fid* f, hook_cntr* h, std::uint64_t flags) noexcept;
/// Bindings to endpoints not enabled yet: the progress thread leaves such a counter alone (a
/// provider's endpoint cannot be progressed before fi_enable: rxm crashes). ep.cpp counts them
/// up at fi_ep_bind and down at fi_enable or fi_close of the endpoint.
void pending_add(hook_cntr* c, int delta) noexcept;
/// fi_poll_add / fi_poll_del of a hook counter (its hidden counter) succeeded: +1 / -1.
void polled_add(hook_cntr* c, int delta) noexcept;
/// After a provider's fi_poll reported events: pulls every progress-thread counter that is in a
/// poll set, in the caller. The provider's poll ran progress and saw a hidden counter change; the
/// application's next fi_cntr_read (a load) must show it, or a fabtests-style loop (poll until
/// the counter is reported, then read it) waits forever: the poll never reports that change again.
void pull_polled() noexcept;
/// How many pulls application threads made on progress-thread counters (the thread backs off
/// while it grows).
std::uint64_t caller_pulls() noexcept;
std::uint64_t waiter_pulls() noexcept; // waits and fi_poll only
void set_thread_backed_off(bool on) noexcept;
/// Pulls the provider's counter into the compcntr counter now (caller progress), as
/// fi_cntr_read does, without counting a read -- unless the counter is bound to an endpoint that
/// is not enabled yet (or a bind of it was refused): as the progress thread, it leaves such a
/// counter to the application's own calls (ofi_compcntr's progress rounds pull through this).
void pull(hook_cntr* c) noexcept;
/// The compcntr counter behind a hook counter.
compcntr_comp_cntr* comp_of(hook_cntr* c) noexcept;
/// domain ops cntr_open.
int cntr_open(fid_domain* domain, fi_cntr_attr* attr, fid_cntr** cntr, void* context) noexcept;
/// compcntr_fi_trywait-style arming for hook counters inside the fabric's fi_trywait: collects
/// the provider fids to pass on in `pass` (capacity `cap`, count in *npass). 0, -FI_EAGAIN,
/// or -FI_EINVAL (a counter without FI_WAIT_FD) / -FI_ENOMEM.
int cntr_trywait(hook_cntr* c, fid** pass, int cap, int* npass) noexcept;
/// Drives every live counter once (the progress thread). Returns true if a value changed.
bool progress_all() noexcept;
/// Adds the per-counter read counts of live counters (for the stats line at exit). false: left
/// out, because an abandoned progress thread holds the live list.
bool sum_live_counts(std::uint64_t& reads, std::uint64_t& readerrs, std::uint64_t& waits) noexcept;

// ---- installing on objects: one unit per libfabric class -------------------------------------
// fabric.cpp, domain.cpp, ep.cpp (endpoint control), ep_data.cpp (data calls), mr.cpp, poll.cpp;
// the patched tables they share: patch.hpp.

/// The provider's fabric() entry: installs on the fabric libfabric hands the hook.
int install_fabric(fi_fabric_attr* attr, fid_fabric** fabric, void* context);
/// Installs on fabric `f` of provider `prov_name` (install_fabric and ofi_compcntr's fabric()).
int install_fabric_on(fid_fabric* f, const char* prov_name) noexcept;

void install_domain(fid_domain* d, fabric_state* fs) noexcept;
/// With the progress thread, a copy of `info` asking FI_THREAD_SAFE (the thread drives the
/// domain's endpoints while the application calls them); nullptr when nothing is to change.
fi_info* thread_safe_info(const fi_info* info) noexcept;
/// Installs on an endpoint (any fid_ep class); trigger_*: FI_TRIGGER among its default flags.
void install_ep(fid_ep* ep, bool trigger_tx = false, bool trigger_rx = false) noexcept;
/// Installs the data-call tables on an endpoint: the *msg wrappers, or with `trigger_default`
/// every call with a context (ep_data.cpp).
void install_ep_data(fid_ep* ep, bool trigger_default) noexcept;
/// The patched copy of a domain's MR table (mr.cpp); nullptr without memory.
fi_ops_mr* patch_mr_ops(fi_ops_mr* ops) noexcept;
/// Installs on a poll set (poll.cpp).
void install_poll(fid_poll* p) noexcept;

// ---- progress thread (progress.cpp) ----------------------------------------------------------

/// Control-path operations on endpoints and memory regions (enable, bind, close) exclude the
/// progress thread's rounds: FI_THREAD_SAFE makes data calls safe beside progress, but a
/// provider's endpoint half-way through fi_enable or fi_close must not be progressed (rxm
/// crashes). Shared by each round of the thread, exclusive for those calls; taken only while
/// the thread exists, so with caller progress it costs nothing.
std::shared_mutex& control_lock() noexcept;
class control_guard {
 public:
  control_guard() noexcept;
  ~control_guard();
  control_guard(const control_guard&) = delete;
  control_guard& operator=(const control_guard&) = delete;

 private:
  bool held_ = false;
};

void progress_thread_start() noexcept; ///< idempotent; only with cfg().progress_thread
void progress_thread_stop() noexcept; ///< idempotent; joins
bool progress_thread_running() noexcept;
/// A stop gave up waiting for the thread (it is blocked in a provider call): it was detached.
bool progress_thread_abandoned() noexcept;

} // namespace compcntr_hook

#endif
