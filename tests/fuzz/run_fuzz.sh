#!/usr/bin/env bash
# Runs one libFuzzer harness for a fixed time and prints executions, executions/s and coverage.
#   run_fuzz.sh FUZZER SECONDS WORKDIR SEEDDIR [libFuzzer args...]
# New inputs go to WORKDIR (in the build tree, never the source tree); SEEDDIR (the committed
# corpus) is read only. A disagreement with the model or a sanitizer report stops the run with
# the input saved as WORKDIR/crash-* and a non-zero status.
set -uo pipefail
fuzzer=$1 seconds=$2 work=$3 seeds=$4
shift 4
mkdir -p "$work"
name=$(basename "$fuzzer")
log="$work.log"
# -rss_limit_mb: well above a harness's need (< 200 MB), below what would hurt the machine.
# -timeout: no input may run for more than 25 s (the harnesses never block). -max_len: inputs of
# at most 1 KiB (100-300 calls) keep the committed corpus small. -error_exitcode: libFuzzer's
# default for a crash, a model disagreement or a leak is 77, which meson reads as SKIP: a found
# defect would pass CI as a skipped test.
"$fuzzer" "$work" "$seeds" -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=1536 \
  -timeout=25 -max_len=1024 -artifact_prefix="$work/" -close_fd_mask=0 \
  -error_exitcode=1 -timeout_exitcode=1 "$@" >"$log" 2>&1
rc=$?
[ $rc -eq 77 ] && rc=1  # never a skip, whatever made the harness exit 77
last=$(grep -E '^#[0-9]+' "$log" | tail -n 1)
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
edges=$(sed -n 's/^INFO: Loaded [0-9]* modules *(\([0-9]*\) inline 8-bit counters).*/\1/p' "$log" | head -n 1)
ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
echo "$name: ${runs:-?} executions in ${seconds} s (${rate:-?} exec/s), coverage ${cov:-?} of ${edges:-?} instrumented edges, ${ft:-?} features, corpus ${corp:-?} inputs (rc $rc)"
if [ $rc -ne 0 ]; then
  tail -n 80 "$log"
  ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* 2>/dev/null
fi
exit $rc
