// compcntr::credit_tracker (modules/features/credits.cppm): creation and adoption. Holds the
// shape checks the C++ and C layers share (detail::check_credit_shape, check_credit_windows:
// npeers, a power-of-two counter range, windows of at most a quarter of it), create (one WRS
// counter per peer, made here) and adopt (the caller's counters: same device, WRS, one counter
// per peer, what they counted so far taken as completed). The model, acquire, release and
// flush: credits.cpp. Built from the public counter API only.
module;
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <span>
#include <system_error>
module compcntr;

namespace compcntr {

std::uint64_t detail::check_credit_shape(const char* call, const device& dev, std::size_t npeers,
                                         std::uint64_t credits, std::error_code& ec) noexcept {
  using detail::fail_into;
  if (!dev) return fail_into(ec, EINVAL, "%s: the device is empty", call), 0;
  if (npeers == 0) return fail_into(ec, EINVAL, "%s: npeers must be > 0", call), 0;
  if (npeers > UINT32_MAX)
    return fail_into(ec, EINVAL, "%s: %zu peers (at most 2^32 - 1)", call, npeers), 0;
  if (credits == 0) return fail_into(ec, EINVAL, "%s: credits_per_peer must be > 0", call), 0;
  const std::uint64_t mask = dev.caps().max_value;
  if (mask == 0 || (mask & (mask + 1)) != 0)
    return fail_into(ec, ENOTSUP,
                     "%s: the device's counters wrap at max_value %llu + 1, not a "
                     "power of two: credit arithmetic needs one",
                     call, static_cast<unsigned long long>(mask)),
           0;
  // A quarter of the range (mask + 1) / 4, e.g. 2^62 on the software device (docs/credits.md):
  // outstanding counts then stay <= a quarter, far from the inconsistent half.
  const std::uint64_t quarter = mask >= 3 ? (mask >> 2) + 1 : 0;
  if (credits > quarter)
    return fail_into(ec, EINVAL,
                     "%s: credits_per_peer %llu is above a quarter of the counter "
                     "range (%llu): outstanding counts could not be told from wrapped ones",
                     call, static_cast<unsigned long long>(credits),
                     static_cast<unsigned long long>(quarter)),
           0;
  return mask;
}

std::uint64_t detail::check_credit_windows(const char* call, const device& dev,
                                           std::span<const std::uint64_t> windows,
                                           std::error_code& ec) noexcept {
  using detail::fail_into;
  // The shape with a window of 1, then every window against the same limits.
  const std::uint64_t mask = check_credit_shape(call, dev, windows.size(), 1, ec);
  if (mask == 0) return 0;
  const std::uint64_t quarter = (mask >> 2) + 1;  // as check_credit_shape: 2^62 on soft
  for (std::size_t i = 0; i < windows.size(); ++i) {
    if (windows[i] == 0)
      return fail_into(ec, EINVAL, "%s: the window of peer %zu is 0 (each must be > 0)", call, i),
             0;
    if (windows[i] > quarter)
      return fail_into(ec, EINVAL,
                       "%s: the window of peer %zu, %llu, is above a quarter of the "
                       "counter range (%llu): outstanding counts could not be told from wrapped "
                       "ones",
                       call, i, static_cast<unsigned long long>(windows[i]),
                       static_cast<unsigned long long>(quarter)),
             0;
  }
  return mask;
}

credit_tracker credit_tracker::create(device& dev, std::uint32_t npeers,
                                      std::uint64_t credits_per_peer,
                                      std::error_code& ec) noexcept {
  const std::uint64_t mask =
      detail::check_credit_shape("credits_create", dev, npeers, credits_per_peer, ec);
  if (mask == 0) return {};
  return make(dev, npeers, nullptr, credits_per_peer, mask, ec);
}

credit_tracker credit_tracker::create(device& dev, std::span<const std::uint64_t> windows,
                                      std::error_code& ec) noexcept {
  const std::uint64_t mask = detail::check_credit_windows("credits_create", dev, windows, ec);
  if (mask == 0) return {};
  return make(dev, static_cast<std::uint32_t>(windows.size()), windows.data(), 0, mask, ec);
}

credit_tracker credit_tracker::make(device& dev, std::uint32_t npeers, const std::uint64_t* windows,
                                    std::uint64_t credits, std::uint64_t mask,
                                    std::error_code& ec) noexcept {
  const counter_caps caps = dev.caps();
  if (npeers > caps.max_counters - std::min(caps.max_counters, dev.live_counters())) {
    detail::fail_into(ec, ENOMEM,
                      "credits_create: %u peers need %u counters, the device has "
                      "room for %u more",
                      npeers, npeers,
                      caps.max_counters - std::min(caps.max_counters, dev.live_counters()));
    return {};
  }
  credit_tracker t;
  t.owned_.reset(new (std::nothrow) counter[npeers]);
  t.peers_.reset(new (std::nothrow) cache_padded<detail::credit_peer>[npeers]);
  if (!t.owned_ || !t.peers_) {
    detail::fail_into(ec, ENOMEM, "credits_create: out of memory for %u peers", npeers);
    return {};
  }
  std::uint64_t largest = 0;
  for (std::uint32_t i = 0; i < npeers; ++i) {
    t.owned_[i] = dev.create_counter(counter_type::wrs, ec);
    if (ec) return {};  // t's destructor destroys the counters made so far
    t.peers_[i]->c = t.owned_[i];
    t.peers_[i]->window = windows != nullptr ? windows[i] : credits;
    largest = std::max(largest, t.peers_[i]->window);
  }
  t.npeers_ = npeers;
  t.credits_ = largest;
  t.mask_ = mask;
  ec.clear();
  return t;
}

namespace {
// adopt() over any list of counters: `at(i)` is the i-th counter's view (empty for a null one);
// windows[i] is peer i's window, or credits_per_peer for every peer when windows is null.
// `largest` gets the largest window.
template <class At>
bool adopt_views(const device& dev, std::size_t n, At at, std::uint64_t credits_per_peer,
                 const std::uint64_t* windows, std::error_code& ec,
                 std::unique_ptr<cache_padded<detail::credit_peer>[]>& peers, std::uint64_t& mask,
                 std::uint64_t& largest) noexcept {
  mask = windows == nullptr
             ? detail::check_credit_shape("credits_adopt", dev, n, credits_per_peer, ec)
             : detail::check_credit_windows("credits_adopt", dev, {windows, n}, ec);
  if (mask == 0) return false;
  for (std::size_t i = 0; i < n; ++i) {
    const counter_view c = at(i);
    if (!c) {
      detail::fail_into(ec, EINVAL, "credits_adopt: counter %zu is null or empty", i);
      return false;
    }
    if (c.native_slot()->dev != dev.core()) {
      // Its range may differ from the mask computed from dev, and waits on it would not drive
      // dev's progress sources: refused, as completion_tracker::create and the C adopt do.
      detail::fail_into(ec, EINVAL, "credits_adopt: counter %zu belongs to another device", i);
      return false;
    }
    if (c.type() != counter_type::wrs) {
      detail::fail_into(ec, EINVAL,
                        "credits_adopt: counter %zu counts bytes: credits need a WRS "
                        "counter (one completion or error per operation)",
                        i);
      return false;
    }
  }
  // One counter per peer: a counter shared by two peers would count the completions of both,
  // so either peer's completions would return the other's credits (over-subscription). Sorted
  // by slot, O(n log n) for the large peer counts of MPI jobs.
  if (n > 1) {
    struct entry {
      const detail::slot* s;
      std::size_t i;
    };
    std::unique_ptr<entry[]> e(new (std::nothrow) entry[n]);
    if (!e) {
      detail::fail_into(ec, ENOMEM, "credits_adopt: out of memory for %zu peers", n);
      return false;
    }
    for (std::size_t i = 0; i < n; ++i) e[i] = {at(i).native_slot(), i};
    std::sort(e.get(), e.get() + n, [](const entry& x, const entry& y) {
      return x.s != y.s ? std::less<const detail::slot*>{}(x.s, y.s) : x.i < y.i;
    });
    for (std::size_t k = 1; k < n; ++k)
      if (e[k].s == e[k - 1].s) {
        detail::fail_into(ec, EINVAL,
                          "credits_adopt: counters %zu and %zu are the same counter "
                          "(each peer needs its own: a shared one would return one peer's "
                          "credits for the other's completions)",
                          e[k - 1].i, e[k].i);
        return false;
      }
  }
  peers.reset(new (std::nothrow) cache_padded<detail::credit_peer>[n]);
  if (!peers) {
    detail::fail_into(ec, ENOMEM, "credits_adopt: out of memory for %zu peers", n);
    return false;
  }
  largest = 0;
  for (std::size_t i = 0; i < n; ++i) {
    detail::credit_peer& p = *peers[i];
    p.c = at(i);
    p.window = windows != nullptr ? windows[i] : credits_per_peer;
    largest = std::max(largest, p.window);
    // What the counter counted so far is not outstanding. Relaxed: the tracker is published
    // to other threads by whatever hands it over (a happens-before edge).
    p.issued.store(p.c.value() + p.c.errors(), std::memory_order_relaxed);
  }
  return true;
}
} // namespace

credit_tracker credit_tracker::adopt(const device& dev, std::span<const counter_view> counters,
                                     std::uint64_t credits_per_peer, std::error_code& ec) noexcept {
  credit_tracker t;
  if (!adopt_views(
          dev, counters.size(), [&](std::size_t i) noexcept { return counters[i]; },
          credits_per_peer, nullptr, ec, t.peers_, t.mask_, t.credits_))
    return {};
  t.npeers_ = static_cast<std::uint32_t>(counters.size());
  ec.clear();
  return t;
}

credit_tracker credit_tracker::adopt(const device& dev, std::span<const counter_view> counters,
                                     std::span<const std::uint64_t> windows,
                                     std::error_code& ec) noexcept {
  if (windows.size() != counters.size()) {
    detail::fail_into(ec, EINVAL, "credits_adopt: %zu counters but %zu windows", counters.size(),
                      windows.size());
    return {};
  }
  credit_tracker t;
  if (!adopt_views(
          dev, counters.size(), [&](std::size_t i) noexcept { return counters[i]; }, 0,
          windows.data(), ec, t.peers_, t.mask_, t.credits_))
    return {};
  t.npeers_ = static_cast<std::uint32_t>(counters.size());
  ec.clear();
  return t;
}

credit_tracker credit_tracker::adopt(const device& dev, std::span<counter* const> counters,
                                     std::span<const std::uint64_t> windows,
                                     std::error_code& ec) noexcept {
  if (windows.size() != counters.size()) {
    detail::fail_into(ec, EINVAL, "credits_adopt: %zu counters but %zu windows", counters.size(),
                      windows.size());
    return {};
  }
  credit_tracker t;
  if (!adopt_views(
          dev, counters.size(),
          [&](std::size_t i) noexcept {
            return counters[i] != nullptr ? counters[i]->view() : counter_view();
          },
          0, windows.data(), ec, t.peers_, t.mask_, t.credits_))
    return {};
  t.npeers_ = static_cast<std::uint32_t>(counters.size());
  ec.clear();
  return t;
}

credit_tracker credit_tracker::adopt(const device& dev, std::span<counter* const> counters,
                                     std::uint64_t credits_per_peer, std::error_code& ec) noexcept {
  credit_tracker t;
  if (!adopt_views(
          dev, counters.size(),
          [&](std::size_t i) noexcept {
            return counters[i] != nullptr ? counters[i]->view() : counter_view();
          },
          credits_per_peer, nullptr, ec, t.peers_, t.mask_, t.credits_))
    return {};
  t.npeers_ = static_cast<std::uint32_t>(counters.size());
  ec.clear();
  return t;
}

} // namespace compcntr
