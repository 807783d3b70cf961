// A C++ consumer: `import compcntr;` through the subproject's dependency (its BMIs and
// -fmodule-file= flags come with dependency('compcntr')).
#include <cstdio>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include <compcntr/version.h>

import compcntr;

int main() {
  if (compcntr::version() != std::string_view{COMPCNTR_VERSION_STRING}) return 1;
  std::error_code ec;
  auto dev = compcntr::device::open("soft", ec);
  if (ec) return std::fprintf(stderr, "open: %s\n", ec.message().c_str()), 1;
  auto done = dev.create_counter(compcntr::counter_type::wrs, ec);
  if (ec) return std::fprintf(stderr, "create: %s\n", compcntr::last_error_message().data()), 1;
  std::vector<std::thread> workers;
  for (int t = 0; t < 2; ++t)
    workers.emplace_back([&] {
      for (int i = 0; i < 500; ++i) done.add();
    });
  const auto waited = compcntr::wait(done, 1000, std::chrono::milliseconds(10000));
  for (auto& w : workers) w.join();
  std::printf("consumer_cpp: compcntr %s, %llu completions, wait %s\n", compcntr::version().data(),
              static_cast<unsigned long long>(done.value()),
              waited == std::errc{} ? "ok" : "FAILED");
  return waited == std::errc{} && done.value() == 1000 ? 0 : 1;
}
