// Shared helpers of the QP suites: a software device, registered buffers, connected QP pairs.
// Include after `import compcntr;` and <doctest/doctest.h>.
#ifndef COMPCNTR_TESTS_QP_FIXTURE_HPP
#define COMPCNTR_TESTS_QP_FIXTURE_HPP

#include <cstddef>
#include <cstdint>
#include <system_error>
#include <vector>

#include "support.hpp"

namespace qpt {

using compcntr::attach_op;
using compcntr::counter_type;
using compcntr::qp_state;

using test_support::make_counter;
using test_support::open_soft;

inline compcntr::qp make_qp(compcntr::device& dev) {
  std::error_code ec;
  auto q = dev.create_qp(ec);
  REQUIRE_FALSE(ec);
  REQUIRE(q.state() == qp_state::reset);
  return q;
}

inline void to_init(compcntr::qp& q) {
  std::error_code ec;
  q.modify(qp_state::init, ec);
  REQUIRE_FALSE(ec);
}

inline void connect(compcntr::qp& a, compcntr::qp& b) {
  std::error_code ec;
  a.connect(b, ec);
  REQUIRE_FALSE(ec);
  REQUIRE(a.state() == qp_state::rts);
  REQUIRE(b.state() == qp_state::rts);
}

inline void attach(compcntr::qp& q, const compcntr::counter& c, std::uint32_t mask) {
  std::error_code ec;
  q.attach(c, mask, ec);
  REQUIRE_FALSE(ec);
}

/// A buffer of `n` bytes filled with `fill`, registered with `access`.
struct buffer {
  std::vector<unsigned char> bytes;
  compcntr::memory_region mr;
  buffer(compcntr::device& dev, std::size_t n, std::uint32_t access, unsigned char fill = 0)
      : bytes(n, fill) {
    std::error_code ec;
    mr = dev.reg_mr(bytes.data(), bytes.size(), access, ec);
    REQUIRE_FALSE(ec);
  }
  unsigned char* data() { return bytes.data(); }
  std::uint64_t addr(std::size_t off = 0) {
    return reinterpret_cast<std::uint64_t>(bytes.data() + off);
  }
  std::uint32_t lkey() const { return mr.lkey(); }
  std::uint32_t rkey() const { return mr.rkey(); }
  /// Fills with a recognisable pattern: byte i = seed + i.
  void pattern(unsigned char seed) {
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(seed + i);
  }
  bool all(unsigned char v, std::size_t from = 0, std::size_t to = SIZE_MAX) const {
    if (to > bytes.size()) to = bytes.size();
    for (std::size_t i = from; i < to; ++i)
      if (bytes[i] != v) return false;
    return true;
  }
};

inline constexpr std::uint32_t rw = compcntr::access::local_write | compcntr::access::remote_write;
inline constexpr std::uint32_t all_access = compcntr::access::all;

/// Two connected QPs a <-> b with one WRS and one BYTES counter per op per side.
struct pair {
  compcntr::device dev = open_soft();
  compcntr::qp a = make_qp(dev), b = make_qp(dev);
  // [side][op index] counters: WRS counts on a/b, BYTES counts on a/b.
  std::vector<compcntr::counter> wrs_a, wrs_b;  // index = bit position of the op
  explicit pair(bool with_counters = true) {
    if (with_counters) {
      for (int i = 0; i < 6; ++i) {
        wrs_a.push_back(make_counter(dev));
        wrs_b.push_back(make_counter(dev));
        attach(a, wrs_a.back(), 1u << i);
        attach(b, wrs_b.back(), 1u << i);
      }
    }
    to_init(a);
    to_init(b);
    connect(a, b);
  }
  static int idx(attach_op op) { return __builtin_ctz(static_cast<std::uint32_t>(op)); }
  compcntr::counter& on_a(attach_op op) { return wrs_a[idx(op)]; }
  compcntr::counter& on_b(attach_op op) { return wrs_b[idx(op)]; }
  /// Sum of completion counts / error counts over every counter of a side.
  static std::uint64_t sum(const std::vector<compcntr::counter>& v) {
    std::uint64_t s = 0;
    for (auto& c : v) s += c.value();
    return s;
  }
  static std::uint64_t sum_err(const std::vector<compcntr::counter>& v) {
    std::uint64_t s = 0;
    for (auto& c : v) s += c.errors();
    return s;
  }
};

} // namespace qpt

#endif
