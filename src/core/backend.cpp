// The defaults of the device seam (compcntr:backend): what a counter backend does unless it
// overrides it, and the pool capacity of a new device (which backend a name opens: src/devices/open.cpp).
module;
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <string_view>
#include <system_error>
#include "compcntr_config.h"
module compcntr;

namespace compcntr::plugin {

using detail::fail;

std::error_code backend::check_type(counter_type type) const noexcept {
  if (type == counter_type::wrs || type == counter_type::bytes) return {};
  return fail(EINVAL, "unknown counter type %u", static_cast<unsigned>(type));
}

std::error_code backend::bind_counter(slot&) noexcept { return {}; }

void backend::unbind_counter(slot&) noexcept {}

bool backend::binds_counters() const noexcept { return true; }

void backend::query_values(std::span<slot* const> slots, counter_values* out) noexcept {
  for (std::size_t i = 0; i < slots.size(); ++i) {
    slot& s = *slots[i];
    if (s.hw != nullptr && s.hw->refresh != nullptr) s.hw->refresh(s);
    out[i] = counter_values{s.load_value(), s.load_errors()};
  }
}

} // namespace compcntr::plugin

namespace compcntr::detail {

std::error_code max_counters_from_env(std::uint32_t& out) noexcept {
  const char* env = std::getenv("COMPCNTR_MAX_COUNTERS");
  if (env == nullptr) {
    out = default_max_counters;
    return {};
  }
  // A decimal count and nothing else (issue 15, defect 4): no sign, no blanks, no base prefix
  // (strtoull with base 0 read "010000" as octal and "0x10" as hex), no empty string (it used to
  // mean the default). Leading zeros are decimal.
  std::uint64_t v = 0;
  bool ok = *env != '\0';
  for (const char* p = env; ok && *p; ++p) {
    ok = *p >= '0' && *p <= '9';
    if (ok) v = v * 10 + static_cast<std::uint64_t>(*p - '0');
    ok = ok && v <= slot_pool::max_capacity; // also stops before v * 10 could overflow
  }
  if (!ok || v == 0)
    return fail(EINVAL,
                "open_device: COMPCNTR_MAX_COUNTERS='%s' is not a decimal count in 1..%u "
                "(digits only; unset it for the default %u)",
                env, slot_pool::max_capacity, default_max_counters);
  out = static_cast<std::uint32_t>(v);
  return {};
}

} // namespace compcntr::detail
