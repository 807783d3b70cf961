// The hook on endpoints (every fid_ep class: endpoints, scalable endpoints, tx/rx contexts,
// shared receive contexts, aliases): fid bind (a hook counter binds its hidden provider counter),
// close, control (FI_ENABLE re-installs the data tables; FI_ALIAS and FI_SETOPSFLAG follow
// FI_TRIGGER among the default flags), tx_ctx / rx_ctx. The records of which endpoints are
// enabled and which hook counters wait for an fi_enable (pending_add) live here.
#include "patch.hpp"

#include <cstdint>
#include <optional>

namespace compcntr_hook {
using namespace patching;
namespace {

std::mutex g_ep_mu; // the endpoint records below (control path only)

// FI_TRIGGER among an endpoint's default flags: transmit side, receive side (under g_ep_mu).
struct trig_state {
  bool tx = false, rx = false;
};
std::unordered_map<fid*, trig_state>& ep_trig() noexcept {
  static auto* m = new std::unordered_map<fid*, trig_state>;
  return *m;
}
bool trigger_default(fid* ep) noexcept {
  std::lock_guard lk(g_ep_mu);
  auto it = ep_trig().find(ep);
  return it != ep_trig().end() && (it->second.tx || it->second.rx);
}
void set_trigger_default(fid* ep, bool tx, bool rx) noexcept {
  std::lock_guard lk(g_ep_mu);
  try {
    if (tx || rx)
      ep_trig()[ep] = {tx, rx};
    else
      ep_trig().erase(ep);
  } catch (...) {
  }
}

fid_ep* ep_of(fid* f) noexcept { return reinterpret_cast<fid_ep*>(f); } // fid is the first member

// Endpoints enabled so far, and the hook counters bound to each endpoint before its fi_enable
// (see pending_add). Control path only.
std::unordered_map<fid*, bool>& ep_enabled() noexcept {
  static auto* m = new std::unordered_map<fid*, bool>;
  return *m;
}
/// Endpoints with a hook counter bound: only their enable and close exclude the progress thread
/// (control_guard). Objects a utility provider opens for itself (rxm's tcp endpoints: rxm opens
/// its core fabric with fi_fabric, so the hook is installed there too) never get a hook counter
/// (rxm's pass-through mode, off by default, would be the exception), and their binds, enables and
/// closes -- made by rxm's threads under rxm's locks -- never wait for the progress thread, which
/// itself may wait for those locks.
std::unordered_map<fid*, bool>& ep_has_cntr() noexcept {
  static auto* m = new std::unordered_map<fid*, bool>;
  return *m;
}
bool has_hook_cntr(fid* ep) noexcept {
  std::lock_guard lk(g_ep_mu);
  auto it = ep_has_cntr().find(ep);
  return it != ep_has_cntr().end() && it->second;
}
class ep_guard { // control_guard for endpoints with hook counters
 public:
  explicit ep_guard(bool needed) noexcept {
    if (needed) g_.emplace();
  }

 private:
  std::optional<control_guard> g_;
};

std::unordered_multimap<fid*, hook_cntr*>& ep_pending() noexcept {
  static auto* m = new std::unordered_multimap<fid*, hook_cntr*>;
  return *m;
}
void release_pending(fid* ep) noexcept {
  std::lock_guard lk(g_ep_mu);
  auto range = ep_pending().equal_range(ep);
  for (auto it = range.first; it != range.second; ++it) pending_add(it->second, -1);
  ep_pending().erase(ep);
}

int ep_bind(fid* f, fid* bfid, std::uint64_t flags) {
  const fi_ops* orig = orig_of(f->ops);
  if (hook_cntr* h = as_hook_cntr(bfid)) {
    control_guard g;
    const int r = bind_hidden(orig, f, h, flags);
    if (r != 0) {
      // A refused bind may still have linked the endpoint into the provider's counter (util's
      // duplicate-binding check runs after the link): after that endpoint closes, progressing the
      // counter would walk a freed endpoint -- as it would without the hook, if the application
      // read it. The progress thread leaves such a counter to the application's calls for good.
      pending_add(h, 1);
    } else {
      if (const layer_ops* l = layer()) l->ep_bound(ep_of(f), bfid, flags);
      std::lock_guard lk(g_ep_mu);
      try {
        ep_has_cntr()[f] = true;
      } catch (...) {
      }
      if (!ep_enabled()[f]) {
        try {
          ep_pending().emplace(f, h);
          pending_add(h, 1);
        } catch (...) { // no memory for the record: the thread may drive it early (as before)
        }
      }
    }
    return r;
  }
  const int r = orig->bind(f, bfid, flags);
  if (r == 0)
    if (const layer_ops* l = layer()) l->ep_bound(ep_of(f), bfid, flags);
  return r;
}

void fill_ep_data(fid_ep* ep) noexcept { install_ep_data(ep, trigger_default(&ep->fid)); }

int ep_close(fid* f) {
  if (const layer_ops* l = layer()) l->ep_closing(ep_of(f));
  ep_guard g(has_hook_cntr(f));
  const int r = orig_of(f->ops)->close(f);
  if (r == 0) {
    release_pending(f);
    std::lock_guard lk(g_ep_mu);
    ep_enabled().erase(f);
    ep_has_cntr().erase(f);
    ep_trig().erase(f);
  }
  return r;
}

int ep_control(fid* f, int command, void* arg) {
  const fi_ops* orig = orig_of(f->ops);
  ep_guard g(has_hook_cntr(f));
  int r = orig->control(f, command, arg);
  if (r != 0)
    if (const layer_ops* l = layer()) return l->ep_control_refused(f, command, arg, r);
  if (r == 0 &&
      (f->fclass == FI_CLASS_EP || f->fclass == FI_CLASS_SEP || f->fclass == FI_CLASS_TX_CTX ||
       f->fclass == FI_CLASS_RX_CTX || f->fclass == FI_CLASS_SRX_CTX)) {
    if (command == FI_ENABLE) {
      fill_ep_data(ep_of(f)); // a provider may choose its data-path tables when enabling
      {
        std::lock_guard lk(g_ep_mu);
        try {
          ep_enabled()[f] = true;
        } catch (...) {
        }
      }
      release_pending(f);
    } else if (command == FI_ALIAS && arg != nullptr) {
      auto* alias = static_cast<struct fi_alias*>(arg);
      if (alias->fid != nullptr && *alias->fid != nullptr) {
        const bool trig = (alias->flags & FI_TRIGGER) != 0;
        install_ep(ep_of(*alias->fid), trig && !(alias->flags & FI_RECV),
                   trig && (alias->flags & FI_RECV));
      }
    } else if (command == FI_SETOPSFLAG && arg != nullptr) {
      const std::uint64_t flags = *static_cast<std::uint64_t*>(arg);
      bool tx = false, rx = false;
      {
        std::lock_guard lk(g_ep_mu);
        if (auto it = ep_trig().find(f); it != ep_trig().end())
          tx = it->second.tx, rx = it->second.rx;
      }
      ((flags & FI_RECV) ? rx : tx) = (flags & FI_TRIGGER) != 0;
      set_trigger_default(f, tx, rx);
      install_ep_data(ep_of(f), tx || rx);
    }
  }
  return r;
}

void fill_ep_fid(fi_ops& t, std::size_t size) {
  if (HOOK_HAS(fi_ops, close, size) && t.close) t.close = ep_close;
  if (HOOK_HAS(fi_ops, bind, size) && t.bind) t.bind = ep_bind;
  if (HOOK_HAS(fi_ops, control, size) && t.control) t.control = ep_control;
}

int ep_tx_ctx(fid_ep* sep, int index, fi_tx_attr* attr, fid_ep** tx, void* context) {
  const int r = orig_of(sep->ops)->tx_ctx(sep, index, attr, tx, context);
  if (r == 0 && tx && *tx) install_ep(*tx, attr && (attr->op_flags & FI_TRIGGER), false);
  return r;
}
int ep_rx_ctx(fid_ep* sep, int index, fi_rx_attr* attr, fid_ep** rx, void* context) {
  const int r = orig_of(sep->ops)->rx_ctx(sep, index, attr, rx, context);
  if (r == 0 && rx && *rx) install_ep(*rx, false, attr && (attr->op_flags & FI_TRIGGER));
  return r;
}
void fill_ep_ops(fi_ops_ep& t, std::size_t size) {
  if (HOOK_HAS(fi_ops_ep, tx_ctx, size) && t.tx_ctx) t.tx_ctx = ep_tx_ctx;
  if (HOOK_HAS(fi_ops_ep, rx_ctx, size) && t.rx_ctx) t.rx_ctx = ep_rx_ctx;
}

} // namespace

void install_ep(fid_ep* ep, bool trigger_tx, bool trigger_rx) noexcept {
  if (ep == nullptr) return;
  install<fi_ops, k_ep_fid>(ep->fid.ops, fill_ep_fid);
  install<fi_ops_ep, k_ep_ops>(ep->ops, fill_ep_ops);
  set_trigger_default(&ep->fid, trigger_tx, trigger_rx);
  install_ep_data(ep, trigger_tx || trigger_rx);
}

} // namespace compcntr_hook
