// compcntr_bench: libfabric's own counters, the references of P1/P2, P4/P6 (and later P9).
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

#include <cstdint>
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
  fid_cntr* bound = nullptr; ///< bound to ep with FI_SEND | FI_RECV; ep enabled
  fid_cntr* unbound = nullptr; ///< same domain, no endpoint bound
  std::string provider; ///< fi_info's provider name as libfabric reports it
  std::string wait_obj; ///< wait object the counters were opened with
};

/// The provider's objects (opened on first use), or nullptr with `why`.
const handles* get(const std::string& provider, std::string& why);
void close_all();

enum class which { bound, unbound };

/// Times fi_cntr_read (result consumed) on the provider's bound or unbound counter.
variant read_variant(const std::string& label, const std::string& provider, which w);
/// Times fi_cntr_add(cntr, 1) (return code consumed).
variant add_variant(const std::string& label, const std::string& provider, which w);

// ---- fi_cntr_wait references (P4 ping-pong, P6 idle waiter) ----

/// Two more endpoints on the provider's domain (each with its own AV and CQ), each with its own
/// counter opened with a wait object (FI_WAIT_UNSPEC: the provider picks) and bound to it with
/// FI_SEND | FI_RECV, endpoints enabled. The objects of a fi_cntr_wait ping-pong between two
/// threads that each own an endpoint: each waits on its own counter (fi_cntr_wait on a counter
/// bound to an endpoint drives that endpoint's progress, as in an application) and adds to the
/// other's. Opened on first use, cached like get(); closed by close_all().
struct wait_pair {
  fid_cntr* a = nullptr; ///< the initiator's counter (endpoint 1)
  fid_cntr* b = nullptr; ///< the responder's counter (endpoint 2)
  std::string provider;
  std::string wait_obj; ///< as requested; the provider maps FI_WAIT_UNSPEC to its default
};
const wait_pair* get_wait_pair(const std::string& provider, std::string& why);

/// fi_cntr_set / fi_cntr_add / fi_cntr_read (libfabric's inline wrappers; codes as libfabric's).
int cntr_set(fid_cntr* c, std::uint64_t v);
int cntr_add(fid_cntr* c, std::uint64_t v);
std::uint64_t cntr_read(fid_cntr* c);
/// fi_cntr_wait(c, threshold, timeout_ms): 0, -FI_ETIMEDOUT, -FI_EAVAIL, ...
int cntr_wait(fid_cntr* c, std::uint64_t threshold, int timeout_ms);
/// "fi_cntr_wait: Timer expired (-62)" for a libfabric return code.
std::string error_text(const char* call, int ret);

/// Notes for a variant using `p` (provider, wait object, libfabric version).
void describe(variant& v, const wait_pair& p);

} // namespace bench::fabric
