// P19: credit-controlled messaging between two ranks of one node, the credits in shared counters
// (issue 21), the data over libfabric shm. Target (performance.md): message rate >= 0.95x the
// same traffic without flow control. Information: the same credits returned by libfabric shm
// messages instead (what the shared counters save), a window of 64, the delivered rate, and
// Open MPI's default shared-memory window exchange (MPI_Isend/MPI_Irecv windows).
//
// As P15 (bench/runtime/runtime_bench.c on examples/runtime's engine, launched by this row with
// mpirun, 2 ranks on this host), with `--provider shm`, Open MPI's defaults (its MPI windows use
// its shared-memory transport), and the runtime's node awareness: the two ranks share a node, so
// each creates its credit counters on the node's shared device (shm:ccrt-...) and the receiver
// returns credits by incrementing the sender's counter itself, at once (no message, no batch).
// Every variant runs in the same job, samples interleaved: credits (shared counters), noflow,
// msgcredits (--no-node-shm's credit messages, batches of 125), window 64 (shared counters), the
// MPI windows. Messages: 64 bytes, 20,000 per pair per sample (500 with --smoke), a window of
// 1000 receive buffers per source (shm's receive queue holds 1024 entries, and the msgcredits
// variant also posts its credit receives there: 1024 + 12 are refused with ENOMEM). Clocks as P15: thread CPU time of both ranks per message
// (target line), wall time of the slowest rank (information).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "../harness.hpp"
#include "mpi_rows.hpp"

namespace {

using bench::goal;
using bench::result;
using bench::mpi_rows::make;
using bench::mpi_rows::mpi_run;

void run(bench::context& ctx) {
  const bool smoke = ctx.opt.smoke;
  const std::size_t reps = static_cast<std::size_t>(ctx.opt.reps);
  const std::uint64_t msgs = smoke ? 500 : 20000;
  const std::string cpu = "thread CPU time of both ranks per message";
  const std::string wall = "wall time of the slowest rank per message it sent";
  mpi_run r;
#if !defined(COMPCNTR_BENCH_RUNTIME_PROG)
  r.why = "built without Open MPI or libfabric (not found when meson configured the build)";
#elif defined(COMPCNTR_BENCH_SANITIZED)
  r.why = std::string("sanitizer build (") + COMPCNTR_BENCH_SANITIZED +
          "): Open MPI and libfabric are not instrumented; measured by ./dev bench";
#else
  r = bench::mpi_rows::run_mpi(
      {}, {"--reps", std::to_string(reps), "--msgs", std::to_string(msgs), "--writes",
           smoke ? "5" : "20", "--window", "1000", "--batch", "125", "--provider", "shm",
           "--msg-credits", "--small-window", "64"});
#endif
  const std::string prov = r.info.count("provider") ? r.info.at("provider") : "shm";
  const result credits =
      make(r, "credits", "credits in shared counters", "ns/msg", msgs, cpu, reps);
  const result noflow =
      make(r, "noflow", "same traffic, no flow control", "ns/msg", msgs, cpu, reps);
  ctx.add(bench::compare(
      "P19", "message rate: shared-counter credits vs none (" + prov + ", 2 ranks, one node, CPU)",
      credits, noflow, goal::speedup_at_least, 0.95,
      "ratio = rate with credits in shared counters / rate without flow control"));
  ctx.add(bench::compare(
      "P19", "the same, delivered rate (wall time of the slowest rank)",
      make(r, "credits_wall", "shared-counter credits (wall)", "ns/msg", msgs, wall, reps),
      make(r, "noflow_wall", "no flow control (wall)", "ns/msg", msgs, wall, reps)));
  ctx.add(bench::compare(
      "P19", "credits in shared counters vs credits by libfabric shm messages (CPU)", credits,
      make(r, "msgcredits", "credits by messages (--no-node-shm)", "ns/msg", msgs, cpu, reps)));
  ctx.add(bench::compare(
      "P19", "window 64 instead of 1000 vs no flow control (CPU)",
      make(r, "credits_small", "shared-counter credits, window 64", "ns/msg", msgs, cpu, reps),
      noflow));
  ctx.add(bench::compare(
      "P19", "shared-counter credits vs MPI_Isend/Irecv windows, Open MPI default (CPU)", credits,
      make(r, "mpi", "MPI windows, default transport", "ns/msg", msgs, cpu, reps)));
  // What the MPI program checked on the way, and that the credits really went through shared
  // counters (both ranks returned some that way).
  result faults;
  faults.name = "sends above the window + delivery errors + counts differing + ranks that "
                "returned no credit through a shared counter";
  faults.unit = "count";
  if (!r.why.empty() || !r.info.count("counts_differing") || !r.info.count("shm_credit_ranks")) {
    faults.available = false;
    faults.why = r.why.empty() ? "the MPI program printed no checks" : r.why;
  } else {
    const double v = std::atof(r.info["credit_violations"].c_str()) +
                     std::atof(r.info["delivery_errors"].c_str()) +
                     std::atof(r.info["counts_differing"].c_str()) +
                     (2 - std::atof(r.info["shm_credit_ranks"].c_str()));
    faults.n = msgs;
    faults.st = bench::summarize(std::vector<double>(reps, v));
  }
  ctx.add(bench::absolute("P19",
                          "shared-counter credits: never above the window, exact delivery, both "
                          "ranks' credits through shared counters",
                          faults, goal::value_at_most, 0));
}

} // namespace

COMPCNTR_BENCH_ROW("P19",
                   "credit-controlled messaging between two ranks of one node, credits in shared "
                   "counters, data over libfabric shm",
                   run);
