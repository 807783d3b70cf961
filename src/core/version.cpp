// compcntr::version() and, through it, compcntr_version(): the project version of meson.build,
// compiled into the library (so a program reports the library it runs with, not the headers it
// was built with; <compcntr/version.h> is the headers' version).
module;
#include <compcntr/version.h>

#include <string_view>
module compcntr;

namespace compcntr {

std::string_view version() noexcept { return COMPCNTR_VERSION_STRING; }

} // namespace compcntr
