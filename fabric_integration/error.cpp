// compcntr_fi_last_error(): the sentence naming the cause of the last failure in this thread.
#include <compcntr/fabric.h>

#include <cstdarg>
#include <cstdio>

#include "internal.hpp"

namespace {
// 256 bytes: the longest sentence (a compcntr message quoted inside ours) fits; longer ones are
// cut, never overflowed (vsnprintf).
thread_local char last_error[256];
} // namespace

namespace compcntr_fabric {

int fail(int err, const char* fmt, ...) noexcept {
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return err;
}

} // namespace compcntr_fabric

extern "C" const char* compcntr_fi_last_error(void) { return last_error; }
