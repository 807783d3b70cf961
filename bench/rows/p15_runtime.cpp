// P15: credit-controlled messaging between MPI ranks over libfabric tcp, and quiet() latency.
// Targets (performance.md): message rate >= 0.9x the same traffic without flow control;
// quiet() after one RMA write <= 1.0x fi_cntr_wait on the provider's counter. Information:
// the same exchange with MPI_Isend/MPI_Irecv windows on Open MPI, restricted to TCP (btl
// tcp,self: both cross the same loopback) and with its default shared-memory transport.
//
// The measurement runs in an MPI program (bench/runtime/runtime_bench.c, built on
// examples/runtime's engine) that this row launches with mpirun, 2 ranks on this host
// (127.0.0.1), with every credit returned by a libfabric message (--no-node-shm: the two ranks
// share a node, and P19 measures their credits through shared counters), twice: once with
// `--mca pml ob1 --mca btl tcp,self` (every libfabric variant and the MPI-over-TCP windows,
// interleaved on the same ranks), once with Open MPI's defaults (the MPI windows only). Its "sample" lines become this row's results (--reps samples each).
//
// Messages: 64 bytes, 20,000 per pair per sample (500 with --smoke), a window of 1024 receive
// buffers per source, credits returned in batches of 128; information: the same with a window
// of 64 (batches of 16), where a sender waits for every 64 messages' credits to come back over
// the loopback (latency-bound; on a loaded 2-vCPU machine each such wait can cost the peer's
// scheduling delay). The MPI windows use the main window (1024). Two clocks (runtime_bench.c): thread
// CPU time of both ranks per message (the cost, robust on a shared machine: a waiting rank
// yields its core) for the target line, and wall time of the slowest rank (the delivered rate,
// information). quiet: wall time per write, 200 writes per sample (20 with --smoke).
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "../harness.hpp"
#include "mpi_rows.hpp"

namespace {

using bench::goal;
using bench::result;
using bench::mpi_rows::make;
using bench::mpi_rows::mpi_run;
#if defined(COMPCNTR_BENCH_RUNTIME_PROG) && !defined(COMPCNTR_BENCH_SANITIZED)
using bench::mpi_rows::run_mpi;
#endif

void run(bench::context& ctx) {
  const bool smoke = ctx.opt.smoke;
  const std::size_t reps = static_cast<std::size_t>(ctx.opt.reps);
  const std::uint64_t msgs = smoke ? 500 : 20000;
  const int writes = smoke ? 20 : 200;
  const std::string cpu = "thread CPU time of both ranks per message";
  const std::string wall = "wall time of the slowest rank per message it sent";
  mpi_run tcp, sm;
#if !defined(COMPCNTR_BENCH_RUNTIME_PROG)
  tcp.why = sm.why =
      "built without Open MPI or libfabric (not found when meson configured the build)";
#elif defined(COMPCNTR_BENCH_SANITIZED)
  tcp.why = sm.why = std::string("sanitizer build (") + COMPCNTR_BENCH_SANITIZED +
                     "): Open MPI and libfabric are not instrumented; measured by ./dev bench";
#else
  const std::vector<std::string> args = {"--reps",       std::to_string(reps),
                                         "--msgs",       std::to_string(msgs),
                                         "--writes",     std::to_string(writes),
                                         "--window",     "1024",
                                         "--batch",      "128",
                                         "--addr",       "127.0.0.1",
                                         "--no-node-shm"};  // credits by messages (P19: not)
  std::vector<std::string> tcp_args = args;
  tcp_args.insert(tcp_args.end(), {"--small-window", "64"});
  tcp = run_mpi({"--mca", "pml", "ob1", "--mca", "btl", "tcp,self"}, tcp_args);
  std::vector<std::string> sm_args = args;
  sm_args.push_back("--mpi-only");
  sm = run_mpi({}, sm_args);
#endif
  const std::string prov = tcp.info.count("provider") ? tcp.info.at("provider") : "tcp;ofi_rxm";
  const result credits =
      make(tcp, "credits", "credits (compcntr flow control)", "ns/msg", msgs, cpu, reps);
  const result noflow =
      make(tcp, "noflow", "same traffic, no flow control", "ns/msg", msgs, cpu, reps);
  ctx.add(bench::compare("P15",
                         "message rate: credit flow control vs none (" + prov + ", 2 ranks, CPU)",
                         credits, noflow, goal::speedup_at_least, 0.9,
                         "ratio = rate with compcntr credits / rate without flow control"));
  ctx.add(bench::compare(
      "P15", "the same, delivered rate (wall time of the slowest rank)",
      make(tcp, "credits_wall", "credits (wall)", "ns/msg", msgs, wall, reps),
      make(tcp, "noflow_wall", "no flow control (wall)", "ns/msg", msgs, wall, reps)));
  ctx.add(bench::compare(
      "P15", "window 64 instead of 1024 vs no flow control (CPU)",
      make(tcp, "credits_small", "credits, window 64", "ns/msg", msgs, cpu, reps), noflow));
  ctx.add(bench::compare(
      "P15", "window 64: delivered rate (wall time of the slowest rank)",
      make(tcp, "credits_small_wall", "credits, window 64 (wall)", "ns/msg", msgs, wall, reps),
      make(tcp, "noflow_wall", "no flow control (wall)", "ns/msg", msgs, wall, reps)));
  ctx.add(bench::compare("P15", "credits vs MPI_Isend/Irecv windows, Open MPI btl tcp,self (CPU)",
                         credits,
                         make(tcp, "mpi", "MPI windows, btl tcp,self", "ns/msg", msgs, cpu, reps)));
  ctx.add(bench::compare(
      "P15", "credits vs MPI_Isend/Irecv windows, Open MPI default (shared memory)", credits,
      make(sm, "mpi", "MPI windows, default transport", "ns/msg", msgs, cpu, reps)));
  ctx.add(bench::compare("P15",
                         "quiet() after one RMA write vs fi_cntr_wait on the provider's counter",
                         make(tcp, "quiet", "compcntr_tracker_quiet", "ns/write",
                              static_cast<std::uint64_t>(writes), "wall time per write", reps),
                         make(tcp, "cntrwait", "fi_cntr_wait (provider write counter)", "ns/write",
                              static_cast<std::uint64_t>(writes), "wall time per write", reps),
                         goal::ratio_at_most, 1.0));
  // What the MPI program checked on the way (the example's checks, over every sample).
  result faults;
  faults.name = "sends above the window + delivery errors + counts differing from the provider's";
  faults.unit = "count";
  if (!tcp.why.empty() || !tcp.info.count("counts_differing")) {
    faults.available = false;
    faults.why = tcp.why.empty() ? "the MPI program printed no checks" : tcp.why;
  } else {
    const double v = std::atof(tcp.info["credit_violations"].c_str()) +
                     std::atof(tcp.info["delivery_errors"].c_str()) +
                     std::atof(tcp.info["counts_differing"].c_str());
    faults.n = msgs;
    faults.st = bench::summarize(std::vector<double>(reps, v));
  }
  ctx.add(bench::absolute("P15", "credits: never above the window, exact delivery and counts",
                          faults, goal::value_at_most, 0));
}

} // namespace

COMPCNTR_BENCH_ROW("P15",
                   "credit-controlled messaging and quiet() between MPI ranks over libfabric tcp",
                   run);
