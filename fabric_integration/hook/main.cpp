// The compcntr hook provider (libcompcntr-fi.so, provider name ofi_hook_compcntr): what
// libfabric loads -- fi_prov_ini and the fi_provider. The machinery it installs is shared with
// the layered provider ofi_compcntr (provider.cpp, fabric.cpp, domain.cpp, ep.cpp,
// ep_data.cpp, mr.cpp, poll.cpp, hook_cntr.cpp, progress.cpp).
#include "hook.hpp"

namespace compcntr_hook {
namespace {

void hook_cleanup() {
  progress_thread_stop();
  write_stats();
}

fi_provider g_prov = {
    .version = FI_VERSION(0, 1),
    .fi_version = FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION),
    .context = {},
    .name = "ofi_hook_compcntr",
    .getinfo = nullptr, // NULL getinfo: libfabric treats the provider as a hook
    .fabric = install_fabric,
    .cleanup = hook_cleanup,
};

const module_names g_names = {"COMPCNTR_FI_HOOK_STATS", "compcntr-hook"};

} // namespace

fi_provider& self() noexcept { return g_prov; }
const module_names& module() noexcept { return g_names; }
const layer_ops* layer() noexcept { return nullptr; } // the hook adds nothing of its own

} // namespace compcntr_hook

extern "C" __attribute__((visibility("default"))) struct fi_provider* fi_prov_ini(void) {
  compcntr_hook::read_config();
  return &compcntr_hook::self();
}
