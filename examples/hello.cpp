// Count completions with the C++ module on the software device.
#include <cstdio>
#include <system_error>
#include <thread>
#include <vector>

import compcntr;

int main() {
  std::error_code ec;
  auto dev = compcntr::device::open("soft", ec);
  if (ec) return std::fprintf(stderr, "open: %s\n", ec.message().c_str()), 1;
  auto bytes = dev.create_counter(compcntr::counter_type::bytes, ec);
  if (ec) return std::fprintf(stderr, "create: %s\n", compcntr::last_error_message().data()), 1;

  std::vector<std::thread> workers;  // four "completion engines" counting 4 KiB transfers
  for (int t = 0; t < 4; ++t)
    workers.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) bytes.add(4096);
    });
  for (auto& w : workers) w.join();

  std::printf("%llu bytes completed\n", static_cast<unsigned long long>(bytes.value()));
  return bytes.value() == 4 * 1000 * 4096 ? 0 : 1;
}
