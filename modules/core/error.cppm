// compcntr:error -- errno-valued errors with a message that names the cause.
//
// Purpose: every failing compcntr call reports a plain errno value (std::error_code in the
// generic category, so `ec == std::errc::invalid_argument` works) and, in the calling thread, a
// sentence naming the cause: compcntr::last_error_message() (C: compcntr_last_error_message()).
// Requirements: read the message right after the failure, in the failing thread.
// Guarantees: the message is thread-local and at most 255 bytes (longer ones are cut); a
// successful call leaves it alone (it is only meaningful after a failure).
// Memory ordering: none (thread-local).
//
// Example:
//     auto c = dev.create_counter(compcntr::counter_options{.numa_node = 99}, ec);
//     if (ec) std::fprintf(stderr, "%s\n", compcntr::last_error_message().data());
module;
#include <string_view>
#include <system_error>
export module compcntr:error;

export namespace compcntr {

/// The sentence describing the most recent failure of a compcntr call in this thread
/// (e.g. "create_comp_cntr: flags must be 0 (got 0x4)"). Empty if none failed yet.
std::string_view last_error_message() noexcept;

} // namespace compcntr

namespace compcntr::detail {

/// Records `printf`-style message as this thread's last error and returns errno `err`
/// as a std::error_code in the generic category.
[[gnu::format(printf, 2, 3)]] std::error_code fail(int err, const char* fmt, ...) noexcept;

/// The same, assigning to `ec`; returns false so callers can `return fail_into(ec, ...)` in
/// boolean helpers.
[[gnu::format(printf, 3, 4)]] bool fail_into(std::error_code& ec, int err, const char* fmt,
                                             ...) noexcept;

/// std::system_category(), looked up once: `ec.assign(0, system_category_cached())` is
/// ec.clear() without a call into libstdc++ on hot success paths (counter creation).
inline const std::error_category& system_category_cached() noexcept {
  static const std::error_category& c = std::system_category();
  return c;
}

} // namespace compcntr::detail
