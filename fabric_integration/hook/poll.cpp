// The hook on poll sets: fi_poll_add / fi_poll_del of a hook counter add its hidden provider
// counter; fi_poll lets progress-thread counters catch up with what the provider's poll saw.
#include "patch.hpp"

#include <cstdint>

namespace compcntr_hook {
using namespace patching;
namespace {

fid* translate(fid* f) noexcept {
  if (hook_cntr* h = as_hook_cntr(f)) {
    fid_cntr* hidden = hidden_of(h);
    return hidden ? &hidden->fid : f;
  }
  return f;
}
int poll_add(fid_poll* p, fid* event_fid, std::uint64_t flags) {
  const int r = orig_of(p->ops)->poll_add(p, translate(event_fid), flags);
  if (r == 0)
    if (hook_cntr* h = as_hook_cntr(event_fid)) polled_add(h, 1);
  return r;
}
int poll_del(fid_poll* p, fid* event_fid, std::uint64_t flags) {
  const int r = orig_of(p->ops)->poll_del(p, translate(event_fid), flags);
  if (r == 0)
    if (hook_cntr* h = as_hook_cntr(event_fid)) polled_add(h, -1);
  return r;
}
// fi_poll: the provider's poll, then (progress thread) the hook counters in poll sets catch up
// with what that poll saw (pull_polled says why).
int poll_run(fid_poll* p, void** context, int count) {
  const int r = orig_of(p->ops)->poll(p, context, count);
  if (r > 0 && cfg().progress_thread) pull_polled();
  return r;
}
void fill_poll(fi_ops_poll& t, std::size_t size) {
  if (HOOK_HAS(fi_ops_poll, poll, size) && t.poll) t.poll = poll_run;
  if (HOOK_HAS(fi_ops_poll, poll_add, size) && t.poll_add) t.poll_add = poll_add;
  if (HOOK_HAS(fi_ops_poll, poll_del, size) && t.poll_del) t.poll_del = poll_del;
}

} // namespace

void install_poll(fid_poll* p) noexcept {
  if (p != nullptr) install<fi_ops_poll, k_poll>(p->ops, fill_poll);
}

} // namespace compcntr_hook
