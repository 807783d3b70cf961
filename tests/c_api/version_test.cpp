// compcntr_version() (C), compcntr::version() (C++) and <compcntr/version.h>: one version.
#include <doctest/doctest.h>

#include <compcntr/compcntr.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

import compcntr;

TEST_CASE("compcntr_version is the library's version, the headers' and the C++ one") {
  const char* v = compcntr_version();
  REQUIRE(v != nullptr);
  CHECK(std::string(v) == COMPCNTR_VERSION_STRING);
  CHECK(compcntr::version() == std::string_view{v});
  CHECK(compcntr::version().data() == v);  // one static string, NUL-terminated
  CHECK(compcntr_version() == v);          // the same pointer on every call
}

TEST_CASE("the version macros spell COMPCNTR_VERSION_STRING and order as one number") {
  char spelled[64];
  std::snprintf(spelled, sizeof spelled, "%d.%d.%d", COMPCNTR_VERSION_MAJOR, COMPCNTR_VERSION_MINOR,
                COMPCNTR_VERSION_PATCH);
  CHECK(std::string(spelled) == COMPCNTR_VERSION_STRING);
  CHECK(COMPCNTR_VERSION_NUMBER ==
        COMPCNTR_VERSION_MAJOR * 10000 + COMPCNTR_VERSION_MINOR * 100 + COMPCNTR_VERSION_PATCH);
  static_assert(COMPCNTR_VERSION_MINOR < 100 && COMPCNTR_VERSION_PATCH < 100,
                "COMPCNTR_VERSION_NUMBER needs minor and patch below 100");
}

TEST_CASE("compcntr_version sets no error") {
  errno = 0;
  CHECK(compcntr_open_device("no-such-device-xyz") == nullptr);  // sets errno and a message
  const int e = errno;
  const std::string msg = compcntr_last_error_message();
  (void)compcntr_version();
  CHECK(errno == e);
  CHECK(std::string(compcntr_last_error_message()) == msg);
}
