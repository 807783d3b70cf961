// Shared pieces of the fuzz harnesses (docs/reliability.md, "Fuzzing against a reference
// model"): the input decoder, the operation trace printed when the library and the reference
// model disagree, and the checks.
//
// Every harness decodes its input into a sequence of C API calls, makes each call on the
// library and on a small reference model written from the spec (/work/shared/spec/semantics.md,
// c-api.md, the docs/*.md man pages), and compares return values, errno values and counter
// values after every call. A difference prints the trace of the input's calls and aborts, so
// libFuzzer saves the input; sanitizer reports do the same.
//
// Only the public C headers are used: the harnesses exercise the library as a C caller does.
#ifndef COMPCNTR_TESTS_FUZZ_COMMON_HPP
#define COMPCNTR_TESTS_FUZZ_COMMON_HPP

#include <compcntr/compcntr.h>

#include <fuzzer/FuzzedDataProvider.h>

#include <poll.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace fuzz {

/// The calls of the current input, printed when a check fails (the last `keep` of them).
class trace {
 public:
  static trace& get() {
    static trace t;
    return t;
  }
  void clear() {
    lines_.clear();
    dropped_ = 0;
  }
  void add(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    // FUZZ_TRACE_ALL set: each call printed as it is made (for inputs that crash).
    static const bool all = std::getenv("FUZZ_TRACE_ALL") != nullptr;
    if (all) std::fprintf(stderr, "  %s\n", buf);
    if (lines_.size() == keep) {
      lines_.erase(lines_.begin());
      ++dropped_;
    }
    lines_.emplace_back(buf);
  }
  void print() const {
    std::fprintf(stderr, "---- calls of this input (%zu earlier ones not shown):\n", dropped_);
    for (const std::string& l : lines_) std::fprintf(stderr, "  %s\n", l.c_str());
  }

 private:
  static constexpr std::size_t keep = 200;
  std::vector<std::string> lines_;
  std::size_t dropped_ = 0;
};

#define FUZZ_TRACE(...) ::fuzz::trace::get().add(__VA_ARGS__)

[[noreturn]] inline void mismatch(const char* file, int line, const char* what, const char* fmt,
                                  ...) __attribute__((format(printf, 4, 5)));
inline void mismatch(const char* file, int line, const char* what, const char* fmt, ...) {
  trace::get().print();
  std::fprintf(stderr, "==== library and model disagree at %s:%d: %s\n     ", file, line, what);
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "\n     last error message: '%s'\n", compcntr_last_error_message());
  std::abort();
}

/// The library's value `got` must equal the model's `want`.
#define FUZZ_EQ(got, want, what)                                                        \
  do {                                                                                  \
    const auto g_ = (got);                                                              \
    const auto w_ = (want);                                                             \
    if (!(g_ == w_))                                                                    \
      ::fuzz::mismatch(__FILE__, __LINE__, what, "library %" PRIu64 ", model %" PRIu64, \
                       static_cast<std::uint64_t>(g_), static_cast<std::uint64_t>(w_)); \
  } while (0)

#define FUZZ_TRUE(cond, what)                                                       \
  do {                                                                              \
    if (!(cond)) ::fuzz::mismatch(__FILE__, __LINE__, what, "expected: %s", #cond); \
  } while (0)

/// An int-returning call: its return value must be the model's; a failure must leave a message.
inline void expect_rc(const char* file, int line, const char* call, int got, int want) {
  if (got != want)
    mismatch(file, line, call, "returned %d (%s), model says %d (%s)", got, std::strerror(got),
             want, std::strerror(want));
  if (want != 0 && compcntr_last_error_message()[0] == '\0')
    mismatch(file, line, call, "failed with %d but compcntr_last_error_message() is empty", got);
}
#define FUZZ_RC(call, got, want) ::fuzz::expect_rc(__FILE__, __LINE__, call, got, want)

/// A constructor: NULL with errno == want, or non-NULL when want is 0.
inline void expect_ptr(const char* file, int line, const char* call, const void* got, int err,
                       int want) {
  if (want == 0 && got == nullptr)
    mismatch(file, line, call, "returned NULL (errno %d, %s), model says it succeeds", err,
             std::strerror(err));
  if (want != 0 && got != nullptr)
    mismatch(file, line, call, "succeeded, model says NULL with errno %d (%s)", want,
             std::strerror(want));
  if (want != 0 && err != want)
    mismatch(file, line, call, "errno %d (%s), model says %d (%s)", err, std::strerror(err), want,
             std::strerror(want));
  if (want != 0 && compcntr_last_error_message()[0] == '\0')
    mismatch(file, line, call, "failed but compcntr_last_error_message() is empty");
}
#define FUZZ_PTR(call, got, err, want) ::fuzz::expect_ptr(__FILE__, __LINE__, call, got, err, want)

/// A 64-bit value biased towards the edges that break arithmetic (0, 1, wrap points).
inline std::uint64_t edgy_u64(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0: return 0;
    case 1: return 1;
    case 2: return UINT64_MAX;
    case 3: return UINT64_MAX - in.ConsumeIntegralInRange<std::uint64_t>(0, 16);
    case 4: return (std::uint64_t{1} << 63) + in.ConsumeIntegralInRange<std::uint64_t>(0, 2) - 1;
    case 5: return in.ConsumeIntegral<std::uint64_t>();
    default: return in.ConsumeIntegralInRange<std::uint64_t>(0, 64);
  }
}

/// Stores raw bits into a C enum field (out-of-range values are part of the contract's EINVAL);
/// memcpy, never a load of the enum type (undefined in C++ for values outside its range).
template <class Enum>
void set_raw(Enum& field, std::uint32_t bits) {
  static_assert(sizeof(Enum) == sizeof bits);
  std::memcpy(&field, &bits, sizeof bits);
}

/// poll(2) on one fd for POLLIN, retrying on EINTR (libFuzzer's -timeout arms a periodic
/// SIGALRM) with what is left of `ms`. Returns poll's result; revents in *revents.
inline int poll_in(int fd, int ms, short* revents = nullptr) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, ms);
    if (revents) *revents = p.revents;
    if (r >= 0 || errno != EINTR) return r;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    ms = left.count() > 0 ? static_cast<int>(left.count()) : 0;
  }
}

/// A software device opened once per process and shared by every input (opening one loads the
/// hwloc topology, ~5 ms): each input leaves it without objects. `max_counters` 0 means the
/// default capacity; otherwise COMPCNTR_MAX_COUNTERS is set for the open.
struct shared_device {
  compcntr_device* dev = nullptr;
  std::uint32_t max_counters = 0;  ///< as the caps report it
  const char* env = nullptr;

  void open(const char* max_env) {
    env = max_env;
    if (max_env)
      setenv("COMPCNTR_MAX_COUNTERS", max_env, 1);
    else
      unsetenv("COMPCNTR_MAX_COUNTERS");
    dev = compcntr_open_device("soft");
    if (!dev) {
      std::fprintf(stderr, "fuzz: cannot open the software device: %s\n",
                   compcntr_last_error_message());
      std::abort();
    }
    unsetenv("COMPCNTR_MAX_COUNTERS");
    compcntr_comp_cntr_caps caps{};
    if (compcntr_query_comp_cntr_caps(dev, &caps) != 0) std::abort();
    max_counters = caps.max_counters;
  }
  /// Closes and opens it again (the input asked for close_device with nothing alive).
  void reopen() {
    if (compcntr_close_device(dev) != 0) {
      std::fprintf(stderr, "fuzz: close_device of an empty device failed: %s\n",
                   compcntr_last_error_message());
      std::abort();
    }
    open(env);
  }
};

/// NUMA nodes (OS indices) a counter may name: probed once against the library's topology.
inline bool numa_node_exists(compcntr_device* dev, int node) {
  static int known[64];  // 0 unknown, 1 exists, 2 does not
  if (node < 0) return false;
  if (node >= 64) return false;  // no machine here has 64 nodes; the model says EINVAL
  if (known[node] == 0) {
    compcntr_comp_cntr_init_attr a{};
    a.comp_mask = COMPCNTR_COMP_CNTR_INIT_ATTR_NUMA_NODE;
    a.numa_node = node;
    compcntr_comp_cntr* c = compcntr_create_comp_cntr(dev, &a);
    known[node] = c ? 1 : 2;
    if (c) compcntr_destroy_comp_cntr(c);
  }
  return known[node] == 1;
}

/// Sometimes a striped counter (compcntr.h: the STRIPES comp_mask bit): every call a harness
/// makes on a plain counter must behave the same on a striped one (docs/counters.md).
inline std::uint32_t maybe_striped(FuzzedDataProvider& in, compcntr_comp_cntr_init_attr& a) {
  static const std::uint32_t choice[] = {2, 4, 16, COMPCNTR_COMP_CNTR_STRIPES_PER_CPU};
  if (in.ConsumeIntegralInRange<int>(0, 3) != 0) return 0;
  a.comp_mask |= COMPCNTR_COMP_CNTR_INIT_ATTR_STRIPES;
  a.stripes = choice[in.ConsumeIntegralInRange<int>(0, 3)];
  return a.stripes;
}

} // namespace fuzz

#endif
