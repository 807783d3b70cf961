// ./dev demo: what compcntr does, shown on the software device.
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <system_error>
#include <thread>
#include <vector>

import compcntr;

namespace {

void section(const char* title) { std::printf("\n== %s\n", title); }

void show_error(const char* what, const std::error_code& ec) {
  std::printf("  %-44s -> %s (errno %d): %s\n", what, ec.message().c_str(), ec.value(),
              compcntr::last_error_message().data());
}

}  // namespace

int main() {
  std::error_code ec;

  section("devices");
  auto dev = compcntr::device::open("auto", ec);
  if (ec) return std::fprintf(stderr, "open auto: %s\n", compcntr::last_error_message().data()), 1;
  const auto caps = dev.caps();
  std::printf("  open(\"auto\") -> \"%.*s\" (no RDMA device here, so the software device)\n",
              static_cast<int>(dev.name().size()), dev.name().data());
  std::printf("  caps: max_value %" PRIu64 ", max_counters %u, qp attach ops 0x%x\n", caps.max_value,
              caps.max_counters, caps.supported_qp_attach_ops);
  auto none = compcntr::device::open("mlx5_0", ec);
  show_error("open(\"mlx5_0\")", ec);

  section("counters updated from 4 threads at once");
  auto wrs = dev.create_counter(compcntr::counter_type::wrs, ec);
  auto bytes = dev.create_counter(compcntr::counter_type::bytes, ec);
  constexpr int threads = 4, ops = 250000;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (int i = 0; i < ops; ++i) {
        const std::uint64_t len = 64u << (i % 4);  // 64..512-byte "messages"
        if ((i + t) % 1000 == 999) {
          wrs.add_error();  // one in a thousand fails
        } else {
          wrs.add();
          bytes.add(len);
        }
      }
    });
  for (auto& th : pool) th.join();
  const double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  std::printf("  %d threads x %d completions in %.1f ms (%.1f ns per update, contended)\n", threads,
              ops, ns / 1e6, ns / (2.0 * threads * ops));
  std::printf("  WRS counter:   completions %" PRIu64 ", errors %" PRIu64 " (expected %d and %d)\n",
              wrs.value(), wrs.errors(), threads * ops - threads * (ops / 1000), threads * (ops / 1000));
  std::printf("  BYTES counter: %" PRIu64 " bytes\n", bytes.value());

  section("set, wrap-around, independence");
  wrs.set(UINT64_MAX);
  wrs.add(2);
  std::printf("  set(UINT64_MAX) then add(2) -> %" PRIu64 " (values wrap at max_value)\n", wrs.value());
  std::printf("  the BYTES counter is untouched: %" PRIu64 "\n", bytes.value());

  section("bad input changes nothing");
  auto bad = dev.create_counter(static_cast<compcntr::counter_type>(7), ec);
  show_error("create_counter(type 7)", ec);
  dev.close(ec);
  show_error("close() with 2 live counters", ec);
  std::printf("  device still open: %s, live counters: %u\n", dev ? "yes" : "no", dev.live_counters());

  section("clean up");
  wrs.reset();
  bytes.reset();
  dev.close(ec);
  std::printf("  counters destroyed, close() -> %s\n", ec ? ec.message().c_str() : "ok");
  return 0;
}
