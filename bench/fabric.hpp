// compcntr_bench: libfabric's own counters, the references of P1/P2 (and later P4, P9).
//
// Purpose: for a provider ("tcp;ofi_rxm", "udp;ofi_rxd", "shm") open real libfabric objects the way
// an application does -- fi_getinfo(FI_EP_RDM, provider name, 127.0.0.1 for the IP providers),
// fabric, domain, AV, CQ, an endpoint with a counter bound to it (FI_SEND | FI_RECV) and enabled,
// plus a second counter on the same domain with nothing bound -- and time fi_cntr_read /
// fi_cntr_add on them. The loops live in fabric.cpp (compiled with libfabric's inline wrappers),
// so the reference pays exactly what an application pays, no extra call layer.
//
// Requirements: none at build time -- without libfabric (meson found none) every variant is
// "unavailable: built without libfabric". A provider that does not open at run time is reported
// unavailable with libfabric's error, never a failure of the program.
// Guarantees: each provider is opened at most once per process (cached, also when it failed);
// close_all() closes everything (main calls it before exit).
#pragma once

#include <string>

#include "harness.hpp"

struct fi_info;
struct fid_fabric;
struct fid_domain;
struct fid_av;
struct fid_cq;
struct fid_ep;
struct fid_cntr;

namespace bench::fabric {

/// True when this program was built against libfabric.
bool built_with_libfabric() noexcept;

/// The objects of one opened provider. Rows that need more than the variants below (ping-pong,
/// traffic) include <rdma/fi_*.h> under COMPCNTR_BENCH_HAVE_FABRIC and use these directly.
struct handles {
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_av* av = nullptr;
  fid_cq* cq = nullptr;
  fid_ep* ep = nullptr;
  fid_cntr* bound = nullptr;    ///< bound to ep with FI_SEND | FI_RECV; ep enabled
  fid_cntr* unbound = nullptr;  ///< same domain, no endpoint bound
  std::string provider;         ///< fi_info's provider name as libfabric reports it
  std::string wait_obj;         ///< wait object the counters were opened with
};

/// The provider's objects (opened on first use), or nullptr with `why`.
const handles* get(const std::string& provider, std::string& why);
void close_all();

enum class which { bound, unbound };

/// Times fi_cntr_read (result consumed) on the provider's bound or unbound counter.
variant read_variant(const std::string& label, const std::string& provider, which w);
/// Times fi_cntr_add(cntr, 1) (return code consumed).
variant add_variant(const std::string& label, const std::string& provider, which w);

}  // namespace bench::fabric
