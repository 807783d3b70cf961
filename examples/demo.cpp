// ./dev demo: what compcntr does, shown on the software device, across two processes on a shared
// device (demo_shared.cpp), then (built with libfabric) on real libfabric loopback traffic
// (demo_fabric.cpp).
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

const char* state_name(compcntr::qp_state s) {
  switch (s) {
    case compcntr::qp_state::reset: return "RESET";
    case compcntr::qp_state::init: return "INIT";
    case compcntr::qp_state::rts: return "RTS";
    case compcntr::qp_state::err: return "ERR";
  }
  return "?";
}

// Counters fed by real completions: two loopback QPs of the software device move bytes between
// registered buffers, and the attached counters count what completed (or failed).
void loopback_traffic() {
  using compcntr::attach_op;
  std::error_code ec;
  auto dev = compcntr::device::open("soft", ec);

  section("QPs: counters fed by real loopback traffic (software device)");
  auto a = dev.create_qp(ec), b = dev.create_qp(ec);
  auto sent = dev.create_counter(compcntr::counter_type::wrs, ec);         // a: SEND
  auto received = dev.create_counter(compcntr::counter_type::bytes, ec);   // b: RECV
  auto rdma = dev.create_counter(compcntr::counter_type::wrs, ec);         // a: RDMA_WRITE|READ
  auto incoming = dev.create_counter(compcntr::counter_type::bytes, ec);   // b: REMOTE_*
  a.attach(sent, attach_op::send, ec);
  a.attach(rdma, attach_op::rdma_write | attach_op::rdma_read, ec);
  b.attach(received, attach_op::recv, ec);
  b.attach(incoming, attach_op::remote_rdma_write | attach_op::remote_rdma_read, ec);
  a.modify(compcntr::qp_state::init, ec);
  b.modify(compcntr::qp_state::init, ec);
  a.connect(b, ec);
  std::printf("  QP %u <-> QP %u connected: %s / %s\n", a.qp_num(), b.qp_num(),
              state_name(a.state()), state_name(b.state()));
  b.attach(sent, attach_op::send, ec);
  show_error("attach after connect (QP in RTS)", ec);

  std::vector<char> out(4096), in(4096, '.'), window(8192, '.');
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>('a' + i % 26);
  auto out_mr = dev.reg_mr(out.data(), out.size(), compcntr::access::local_write, ec);
  auto in_mr = dev.reg_mr(in.data(), in.size(), compcntr::access::local_write, ec);
  auto win_mr = dev.reg_mr(window.data(), window.size(), compcntr::access::all, ec);

  for (int i = 0; i < 8; ++i) b.post_recv(i, in.data() + 512 * i, 512, in_mr.lkey(), ec);
  std::uint64_t total = 0;
  for (int i = 0; i < 8; ++i) {
    const std::size_t len = 16u << (i % 6);  // 16 .. 512 bytes
    a.post_send(100 + i, out.data(), len, out_mr.lkey(), ec);
    total += len;
  }
  std::printf("  8 sends of 16..512 B into 8 posted receives:\n");
  std::printf("    a SEND (WRS):   %" PRIu64 " completed, %" PRIu64 " failed\n", sent.value(),
              sent.errors());
  std::printf("    b RECV (BYTES): %" PRIu64 " bytes (expected %" PRIu64
              "), first message \"%.16s\"\n",
              received.value(), total, in.data());

  a.post_send(200, out.data(), 64, out_mr.lkey(), ec);
  std::printf("  a send with no receive posted waits: SEND %" PRIu64 " ...", sent.value());
  b.post_recv(9, in.data(), 64, in_mr.lkey(), ec);
  std::printf(" b posts a receive -> SEND %" PRIu64 ", RECV %" PRIu64 " bytes\n", sent.value(),
              received.value());

  a.post_rdma_write(300, out.data(), 4096, out_mr.lkey(),
                    reinterpret_cast<std::uint64_t>(window.data()), win_mr.rkey(), ec);
  a.post_rdma_read(301, in.data(), 1024, in_mr.lkey(),
                   reinterpret_cast<std::uint64_t>(window.data()) + 26, win_mr.rkey(), ec);
  std::printf("  RDMA write 4 KiB + RDMA read 1 KiB: a RDMA %" PRIu64
              " completed; b incoming %" PRIu64 " bytes; read back \"%.10s\"\n",
              rdma.value(), incoming.value(), in.data());

  section("QPs: an error completion");
  const auto incoming_before = incoming.value();
  a.post_rdma_write(400, out.data(), 64, out_mr.lkey(),
                    reinterpret_cast<std::uint64_t>(window.data()), win_mr.lkey(),
                    ec);  // an lkey where the rkey belongs
  std::printf("  RDMA write with a wrong key: post returned %s, a RDMA %" PRIu64
              " completed / %" PRIu64 " failed\n",
              ec ? ec.message().c_str() : "ok", rdma.value(), rdma.errors());
  std::printf("    why: %.*s; a is now %s, b stays %s; b's incoming counter unchanged (%" PRIu64
              " -> %" PRIu64 ")\n",
              static_cast<int>(a.last_completion_error().size()), a.last_completion_error().data(),
              state_name(a.state()), state_name(b.state()), incoming_before, incoming.value());
  a.post_send(401, out.data(), 8, out_mr.lkey(), ec);
  show_error("post_send on a QP in ERR", ec);
  sent.destroy(ec);
  show_error("destroy a counter still attached", ec);
  std::printf("  it stays usable: SEND %" PRIu64 " completed, %" PRIu64 " failed\n", sent.value(),
              sent.errors());

  section("QPs: 2 threads, 2 QP pairs, one shared counter");
  auto shared = dev.create_counter(compcntr::counter_type::wrs, ec);
  constexpr int msgs = 100000;
  std::vector<compcntr::qp> qps;
  for (int i = 0; i < 4; ++i) qps.push_back(dev.create_qp(ec));
  for (int p = 0; p < 2; ++p) {
    qps[2 * p].attach(shared, attach_op::send, ec);
    qps[2 * p + 1].attach(shared, attach_op::recv, ec);
    qps[2 * p].modify(compcntr::qp_state::init, ec);
    qps[2 * p + 1].modify(compcntr::qp_state::init, ec);
    qps[2 * p].connect(qps[2 * p + 1], ec);
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (int p = 0; p < 2; ++p)
    workers.emplace_back([&, p] {
      std::error_code e;
      std::vector<char> buf(64);
      auto mr = dev.reg_mr(buf.data(), buf.size(), compcntr::access::local_write, e);
      for (int i = 0; i < msgs; ++i) {
        qps[2 * p + 1].post_recv(i, buf.data() + 32, 32, mr.lkey(), e);
        qps[2 * p].post_send(i, buf.data(), 32, mr.lkey(), e);
      }
    });
  for (auto& w : workers) w.join();
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  std::printf("  %d messages per pair: shared counter %" PRIu64
              " (expected %d), %.0f ns per message\n",
              msgs, shared.value(), 2 * 2 * msgs, us * 1000.0 / (2.0 * msgs));
}

} // namespace

void runtime_demo(compcntr::device& dev);  // demo_runtime.cpp
void shared_demo();                        // demo_shared.cpp

// Triggered operations (docs/trigger.md): actions armed on a counter and a threshold.
void trigger_demo(compcntr::device& dev) {
  section("triggers: actions that run when a counter reaches a threshold");
  std::error_code ec;
  auto inputs = dev.create_counter(compcntr::counter_type::wrs, ec);
  auto ready = dev.create_counter(compcntr::counter_type::wrs, ec);
  auto stage2 = dev.create_counter(compcntr::counter_type::wrs, ec);
  std::vector<std::uint64_t> order;
  std::vector<compcntr::trigger> ts;
  for (std::uint64_t th : {30, 10, 20})  // armed out of order
    ts.push_back(compcntr::trigger::arm(
        inputs, th, compcntr::trigger_mode::immediate,
        [&order, th](int status) {
          if (status == 0) order.push_back(th);
        },
        ec));
  ts.push_back(compcntr::trigger::arm_add(inputs, 40, ready, 1, ec));   // ready += 1 at 40
  ts.push_back(compcntr::trigger::arm_add(ready, 1, stage2, 100, ec));  // a chain: stage2 += 100
  auto later =
      compcntr::trigger::arm(inputs, 1000, compcntr::trigger_mode::deferred, [](int) {}, ec);
  inputs.add(25);
  inputs.add_error(3);  // errors do not advance the completion value: nothing fires
  inputs.add(15);
  std::printf("  armed at 30, 10, 20 (out of order); add(25), add_error(3), add(15):\n");
  std::printf("    fired in threshold order:");
  for (std::uint64_t th : order) std::printf(" %" PRIu64, th);
  std::printf("\n    arm_add chain at 40: ready %" PRIu64 ", stage2 %" PRIu64
              " (expected 1, 100)\n",
              ready.value(), stage2.value());
  std::printf("  the deferred trigger at 1000: cancel() -> %s; state %s\n",
              later.cancel() == std::errc{} ? "cancelled (its action got ECANCELED)" : "EALREADY",
              later.state() == compcntr::trigger_state::cancelled ? "cancelled" : "?");
  ts.clear();
}
#if COMPCNTR_DEMO_FABRIC
void fabric_demo();  // demo_fabric.cpp
#endif

int main() {
  std::error_code ec;

  section("devices");
  auto dev = compcntr::device::open("auto", ec);
  if (ec) return std::fprintf(stderr, "open auto: %s\n", compcntr::last_error_message().data()), 1;
  const auto caps = dev.caps();
  std::printf("  open(\"auto\") -> \"%.*s\" (no RDMA device here, so the software device)\n",
              static_cast<int>(dev.name().size()), dev.name().data());
  std::printf("  caps: max_value %" PRIu64 ", max_counters %u, qp attach ops 0x%x\n",
              caps.max_value, caps.max_counters, caps.supported_qp_attach_ops);
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
              wrs.value(), wrs.errors(), threads * ops - threads * (ops / 1000),
              threads * (ops / 1000));
  std::printf("  BYTES counter: %" PRIu64 " bytes\n", bytes.value());

  section("set, wrap-around, independence");
  wrs.set(UINT64_MAX);
  wrs.add(2);
  std::printf("  set(UINT64_MAX) then add(2) -> %" PRIu64 " (values wrap at max_value)\n",
              wrs.value());
  std::printf("  the BYTES counter is untouched: %" PRIu64 "\n", bytes.value());

  section("bad input changes nothing");
  auto bad = dev.create_counter(static_cast<compcntr::counter_type>(7), ec);
  show_error("create_counter(type 7)", ec);
  dev.close(ec);
  show_error("close() with 2 live counters", ec);
  std::printf("  device still open: %s, live counters: %u\n", dev ? "yes" : "no",
              dev.live_counters());

  shared_demo();  // forks: before any other thread of this process starts
  trigger_demo(dev);
  loopback_traffic();
  runtime_demo(dev);
#if COMPCNTR_DEMO_FABRIC
  fabric_demo();
#endif

  section("clean up");
  wrs.reset();
  bytes.reset();
  dev.close(ec);
  std::printf("  counters destroyed, close() -> %s\n", ec ? ec.message().c_str() : "ok");
  return 0;
}
