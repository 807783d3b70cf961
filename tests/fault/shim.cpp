// The fault-injection shim (shim.hpp). Linked into the fault test program only; its definitions
// of operator new, the fd-creating calls, a few hwloc calls and (without AddressSanitizer) the
// malloc family take precedence over the C++ runtime's, libc's and libhwloc's for every call
// made by libcompcntr.so, libcompcntr-fabric.so and the program itself.
//
// Rules that keep the shim itself from failing: no allocation on the injection path (the site
// table is a fixed array, the state a trivially-constructed thread_local), and every real
// function resolved at start-up, before anything is armed (dlsym may allocate).
#include "shim.hpp"

#include <dlfcn.h>
#include <hwloc.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SHIM_ASAN 1
#endif
#endif
#ifndef SHIM_ASAN
#define SHIM_ASAN 0
#endif

namespace {

struct tls_state {
  fault::mode m;
  long n;
  long seen;
  long failed;
  unsigned kinds;
  int hwloc_load_depth;
};
thread_local tls_state st;  // zero-initialised: mode off

// Distinct return addresses of the points reached (open addressing, never freed).
constexpr std::size_t site_slots = 1u << 14;
std::atomic<std::uintptr_t> sites[site_slots];
std::atomic<std::size_t> sites_used{0};

void record(void* ra) {
  const auto a = reinterpret_cast<std::uintptr_t>(ra);
  std::size_t h = static_cast<std::size_t>((a >> 2) * 0x9E3779B97F4A7C15ull >> 50);
  for (std::size_t i = 0; i < site_slots; ++i) {
    std::atomic<std::uintptr_t>& s = sites[(h + i) & (site_slots - 1)];
    std::uintptr_t cur = s.load(std::memory_order_relaxed);
    if (cur == a) return;
    if (cur == 0 && s.compare_exchange_strong(cur, a, std::memory_order_relaxed)) {
      sites_used.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    if (cur == a) return;
  }
}

[[gnu::always_inline]] inline bool hit(unsigned kind, void* ra) {
  tls_state& s = st;
  if (s.m == fault::mode::off || (s.kinds & kind) == 0) return false;
  ++s.seen;
  record(ra);
  if ((s.m == fault::mode::once && s.seen == s.n) || (s.m == fault::mode::from && s.seen >= s.n)) {
    ++s.failed;
    return true;
  }
  return false;
}

// ---- the real functions, resolved before main ----

int (*real_eventfd)(unsigned, int);
int (*real_epoll_create1)(int);
int (*real_timerfd_create)(int, int);
int (*real_pipe2)(int*, int);
int (*real_socket)(int, int, int);
int (*real_topology_init)(hwloc_topology_t*);
int (*real_topology_load)(hwloc_topology_t);
void* (*real_hwloc_alloc)(hwloc_topology_t, std::size_t);
void* (*real_hwloc_alloc_membind)(hwloc_topology_t, std::size_t, hwloc_const_bitmap_t,
                                  hwloc_membind_policy_t, int);
hwloc_bitmap_t (*real_bitmap_alloc)(void);

template <class F>
void resolve(F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
  if (!f) {
    std::fprintf(stderr, "fault shim: cannot resolve %s: %s\n", name, dlerror());
    std::abort();
  }
}

[[gnu::constructor]] void resolve_all() {
  resolve(real_eventfd, "eventfd");
  resolve(real_epoll_create1, "epoll_create1");
  resolve(real_timerfd_create, "timerfd_create");
  resolve(real_pipe2, "pipe2");
  resolve(real_socket, "socket");
  resolve(real_topology_init, "hwloc_topology_init");
  resolve(real_topology_load, "hwloc_topology_load");
  resolve(real_hwloc_alloc, "hwloc_alloc");
  resolve(real_hwloc_alloc_membind, "hwloc_alloc_membind");
  resolve(real_bitmap_alloc, "hwloc_bitmap_alloc");
}

} // namespace

// ---- the malloc family (glibc's allocator underneath; free() stays glibc's) ----

#if !SHIM_ASAN
extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);

void* malloc(std::size_t n) {
  if (hit(fault::malloc_, __builtin_return_address(0))) {
    errno = ENOMEM;
    return nullptr;
  }
  return __libc_malloc(n);
}
void* calloc(std::size_t n, std::size_t m) {
  if (hit(fault::malloc_, __builtin_return_address(0))) {
    errno = ENOMEM;
    return nullptr;
  }
  return __libc_calloc(n, m);
}
void* realloc(void* p, std::size_t n) {
  if (hit(fault::malloc_, __builtin_return_address(0))) {
    errno = ENOMEM;
    return nullptr;
  }
  return __libc_realloc(p, n);
}
void* memalign(std::size_t a, std::size_t n) {
  if (hit(fault::malloc_, __builtin_return_address(0))) {
    errno = ENOMEM;
    return nullptr;
  }
  return __libc_memalign(a, n);
}
void* aligned_alloc(std::size_t a, std::size_t n) {
  if (hit(fault::malloc_, __builtin_return_address(0))) {
    errno = ENOMEM;
    return nullptr;
  }
  return __libc_memalign(a, n);
}
int posix_memalign(void** out, std::size_t a, std::size_t n) {
  if (hit(fault::malloc_, __builtin_return_address(0))) return ENOMEM;
  void* p = __libc_memalign(a, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}
}
#endif

namespace {
void* raw_alloc(std::size_t n) {
#if SHIM_ASAN
  return std::malloc(n ? n : 1);
#else
  return __libc_malloc(n ? n : 1);
#endif
}
void* raw_aligned(std::size_t a, std::size_t n) {
  if (a < sizeof(void*)) a = sizeof(void*);
#if SHIM_ASAN
  void* p = nullptr;
  return ::posix_memalign(&p, a, n ? n : 1) == 0 ? p : nullptr;
#else
  return __libc_memalign(a, n ? n : 1);
#endif
}
} // namespace

// ---- operator new / delete ----

void* operator new(std::size_t n) {
  if (hit(fault::alloc, __builtin_return_address(0))) throw std::bad_alloc();
  if (void* p = raw_alloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (hit(fault::alloc, __builtin_return_address(0))) throw std::bad_alloc();
  if (void* p = raw_alloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  if (hit(fault::alloc, __builtin_return_address(0))) return nullptr;
  return raw_alloc(n);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  if (hit(fault::alloc, __builtin_return_address(0))) return nullptr;
  return raw_alloc(n);
}
void* operator new(std::size_t n, std::align_val_t a) {
  if (hit(fault::alloc, __builtin_return_address(0))) throw std::bad_alloc();
  if (void* p = raw_aligned(static_cast<std::size_t>(a), n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) {
  if (hit(fault::alloc, __builtin_return_address(0))) throw std::bad_alloc();
  if (void* p = raw_aligned(static_cast<std::size_t>(a), n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  if (hit(fault::alloc, __builtin_return_address(0))) return nullptr;
  return raw_aligned(static_cast<std::size_t>(a), n);
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  if (hit(fault::alloc, __builtin_return_address(0))) return nullptr;
  return raw_aligned(static_cast<std::size_t>(a), n);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

// ---- fd creation ----

extern "C" {

int eventfd(unsigned int v, int flags) {
  if (hit(fault::fd, __builtin_return_address(0))) {
    errno = EMFILE;
    return -1;
  }
  if (!real_eventfd) resolve_all();  // a call before the shim's constructor ran
  return real_eventfd(v, flags);
}
int epoll_create1(int flags) {
  if (hit(fault::fd, __builtin_return_address(0))) {
    errno = EMFILE;
    return -1;
  }
  if (!real_epoll_create1) resolve_all();  // a call before the shim's constructor ran
  return real_epoll_create1(flags);
}
int timerfd_create(int clock, int flags) {
  if (hit(fault::fd, __builtin_return_address(0))) {
    errno = EMFILE;
    return -1;
  }
  if (!real_timerfd_create) resolve_all();  // a call before the shim's constructor ran
  return real_timerfd_create(clock, flags);
}
int pipe2(int fds[2], int flags) {
  if (hit(fault::fd, __builtin_return_address(0))) {
    errno = EMFILE;
    return -1;
  }
  if (!real_pipe2) resolve_all();  // a call before the shim's constructor ran
  return real_pipe2(fds, flags);
}
int socket(int domain, int type, int protocol) {
  if (hit(fault::fd, __builtin_return_address(0))) {
    errno = EMFILE;
    return -1;
  }
  if (!real_socket) resolve_all();  // a call before the shim's constructor ran
  return real_socket(domain, type, protocol);
}

// ---- hwloc ----

int hwloc_topology_init(hwloc_topology_t* t) {
  if (st.hwloc_load_depth == 0 && hit(fault::hwloc, __builtin_return_address(0))) {
    errno = ENOMEM;
    return -1;
  }
  ++st.hwloc_load_depth;
  const int r = real_topology_init(t);
  --st.hwloc_load_depth;
  return r;
}
int hwloc_topology_load(hwloc_topology_t t) {
  if (st.hwloc_load_depth == 0 && hit(fault::hwloc, __builtin_return_address(0))) {
    errno = ENOMEM;
    return -1;
  }
  ++st.hwloc_load_depth;
  const int r = real_topology_load(t);
  --st.hwloc_load_depth;
  return r;
}
void* hwloc_alloc(hwloc_topology_t t, std::size_t len) {
  if (st.hwloc_load_depth == 0 && hit(fault::hwloc, __builtin_return_address(0))) {
    errno = ENOMEM;
    return nullptr;
  }
  return real_hwloc_alloc(t, len);
}
void* hwloc_alloc_membind(hwloc_topology_t t, std::size_t len, hwloc_const_bitmap_t set,
                          hwloc_membind_policy_t policy, int flags) {
  if (st.hwloc_load_depth == 0 && hit(fault::hwloc, __builtin_return_address(0))) {
    errno = ENOMEM;
    return nullptr;
  }
  ++st.hwloc_load_depth;
  void* p = real_hwloc_alloc_membind(t, len, set, policy, flags);
  --st.hwloc_load_depth;
  return p;
}
hwloc_bitmap_t hwloc_bitmap_alloc(void) {
  if (st.hwloc_load_depth == 0 && hit(fault::hwloc, __builtin_return_address(0))) {
    errno = ENOMEM;
    return nullptr;
  }
  return real_bitmap_alloc();
}

}  // extern "C"

// ---- control ----

namespace fault {

void arm(mode m, long n, unsigned kinds) {
  tls_state& s = st;
  s.seen = 0;
  s.failed = 0;
  s.n = n;
  s.kinds = kinds;
  s.m = m;  // last: from here on points count
}

long disarm() {
  tls_state& s = st;
  s.m = mode::off;
  return s.seen;
}

long failed() { return st.failed; }

bool malloc_available() { return !SHIM_ASAN; }

std::size_t distinct_sites() { return sites_used.load(std::memory_order_relaxed); }

bool inside_hwloc_load() { return st.hwloc_load_depth > 0; }

} // namespace fault
