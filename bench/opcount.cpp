// compcntr_opcount: runs N operations of one kind in a loop of its own, for instruction counting
// with callgrind (stable on a noisy machine, unlike time). Each loop is an extern "C" noinline
// function named opcount_<op>, so callgrind can count just that function:
//
//   valgrind --tool=callgrind --toggle-collect=opcount_add --callgrind-out-file=/dev/null \
//       build-release/bench/compcntr_opcount add 1000000
//   -> "Collected : 9000012"  => 9 instructions per add (loop overhead included; compare with
//      the raw_* ops, which run the same loop around a bare std::atomic)
//
// bench/opcount.sh does this for every op and prints instructions per operation.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <system_error>
#include <vector>

#include "harness.hpp"

import compcntr;

extern "C" {

__attribute__((noinline)) void opcount_read(const compcntr::counter& c, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) bench::keep(c.value());
}
__attribute__((noinline)) void opcount_raw_load(const std::atomic<std::uint64_t>& a, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) bench::keep(a.load(std::memory_order_acquire));
}
__attribute__((noinline)) void opcount_add(compcntr::counter& c, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) c.add(1);
}
__attribute__((noinline)) void opcount_raw_add(std::atomic<std::uint64_t>& a, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i) a.fetch_add(1);
}
/// n creates then n destroys (P7's pattern); callgrind follows the calls into libcompcntr.
__attribute__((noinline)) void opcount_create_destroy(compcntr::device& dev,
                                                      std::vector<compcntr::counter>& v,
                                                      std::uint64_t n) {
  std::error_code ec;
  for (std::uint64_t i = 0; i < n; ++i) v[i] = dev.create_counter(compcntr::counter_type::wrs, ec);
  for (std::uint64_t i = 0; i < n; ++i) v[i].reset();
}

}  // extern "C"

/// Not counted (name does not match opcount_*): fills the pool so the counted pass recycles slots.
__attribute__((noinline)) static void warm_pool(compcntr::device& dev, std::vector<compcntr::counter>& v,
                                                std::uint64_t n) {
  std::error_code ec;
  for (std::uint64_t i = 0; i < n; ++i) v[i] = dev.create_counter(compcntr::counter_type::wrs, ec);
  for (std::uint64_t i = 0; i < n; ++i) v[i].reset();
}

int main(int argc, char** argv) {
  const char* ops = "read raw_load add raw_add create_destroy";
  if (argc != 3) {
    std::fprintf(stderr, "usage: compcntr_opcount OP N   (OP: %s)\n", ops);
    return 2;
  }
  const std::string op = argv[1];
  const std::uint64_t n = std::strtoull(argv[2], nullptr, 10);
  std::error_code ec;
  auto dev = compcntr::device::open("soft", ec);
  if (ec) return std::fprintf(stderr, "open soft: %s\n", compcntr::last_error_message().data()), 1;
  auto c = dev.create_counter(compcntr::counter_type::wrs, ec);
  if (ec) return std::fprintf(stderr, "create: %s\n", compcntr::last_error_message().data()), 1;
  std::atomic<std::uint64_t> a{0};
  if (op == "read") opcount_read(c, n);
  else if (op == "raw_load") opcount_raw_load(a, n);
  else if (op == "add") opcount_add(c, n);
  else if (op == "raw_add") opcount_raw_add(a, n);
  else if (op == "create_destroy") {
    std::vector<compcntr::counter> v(n);
    warm_pool(dev, v, n);
    opcount_create_destroy(dev, v, n);
  } else {
    std::fprintf(stderr, "unknown op '%s' (OP: %s)\n", op.c_str(), ops);
    return 2;
  }
  std::printf("%s x %llu done (value %llu)\n", op.c_str(), static_cast<unsigned long long>(n),
              static_cast<unsigned long long>(c.value() + a.load()));
  return 0;
}
