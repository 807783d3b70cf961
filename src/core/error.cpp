// Thread-local "last error" messages (compcntr:error).
module;
#include <cstdarg>
#include <cstdio>
#include <string_view>
#include <system_error>
module compcntr;

namespace compcntr {
namespace {
thread_local char last_message[256];
}

std::string_view last_error_message() noexcept { return last_message; }

namespace detail {
namespace {
void record(const char* fmt, std::va_list ap) noexcept {
  std::vsnprintf(last_message, sizeof last_message, fmt, ap);
}
} // namespace

std::error_code fail(int err, const char* fmt, ...) noexcept {
  std::va_list ap;
  va_start(ap, fmt);
  record(fmt, ap);
  va_end(ap);
  return {err, std::generic_category()};
}

bool fail_into(std::error_code& ec, int err, const char* fmt, ...) noexcept {
  std::va_list ap;
  va_start(ap, fmt);
  record(fmt, ap);
  va_end(ap);
  ec.assign(err, std::generic_category());
  return false;
}
} // namespace detail
} // namespace compcntr
