// Fault injection for the `fault` suite (issue 15): a shim linked into the test program that
// replaces the points where compcntr (and what it calls) obtains resources, and makes them fail
// on demand. Nothing in the library changes: the program's definitions interpose the shared
// library's calls (ELF symbol interposition).
//
// Points (kinds):
//   alloc   every operator new / new[] (plain, nothrow, aligned): std::bad_alloc or nullptr
//   fd      eventfd, epoll_create1, timerfd_create, pipe2, socket: -1 with errno EMFILE
//   hwloc   hwloc_topology_init, hwloc_topology_load, hwloc_alloc, hwloc_alloc_membind,
//           hwloc_bitmap_alloc called by compcntr: their documented failure (-1 / NULL, errno
//           ENOMEM). Calls hwloc makes to its own exported functions (inside
//           hwloc_topology_init, _load and hwloc_alloc_membind) are not failed: hwloc does not check
//           them (a failed internal hwloc_bitmap_alloc is a NULL dereference in hwloc); what
//           fails inside hwloc is the malloc kind's business.
//   malloc  malloc, calloc, realloc, aligned_alloc, posix_memalign, memalign: NULL / ENOMEM.
//           Only without AddressSanitizer (whose runtime owns malloc): see available().
// Injection is per thread: only points reached by the thread that armed it count, so the
// engine thread's work and other threads never fail by accident.
#ifndef COMPCNTR_TESTS_FAULT_SHIM_HPP
#define COMPCNTR_TESTS_FAULT_SHIM_HPP

#include <cstddef>

namespace fault {

enum kind : unsigned { alloc = 1u, fd = 2u, hwloc = 4u, malloc_ = 8u, all = 15u };
enum class mode { off, count, once, from };

/// From now on, in this thread: count the points of `kinds` (mode count), fail the n-th one
/// (once, n >= 1), or fail the n-th and every later one (from).
void arm(mode m, long n = 0, unsigned kinds = all);
/// Stops injecting; returns how many points of the armed kinds were reached since arm().
long disarm();
/// How many points were made to fail since the last arm().
long failed();
/// Whether the malloc kind is in effect in this build (not under AddressSanitizer).
bool malloc_available();
/// Distinct call sites (return addresses) of points reached since the program started.
std::size_t distinct_sites();
/// True while the calling thread is inside hwloc_topology_init, hwloc_topology_load or
/// hwloc_alloc_membind (crash attribution).
bool inside_hwloc_load();

} // namespace fault

#endif
