#!/bin/sh
# Suite `hook`, test `hook_exit_signal`: a process using the hook with the progress thread ends
# when exit() is called from a signal handler while its main thread is inside the provider
# (fabtests' SIGTERM handler does exactly that; the hook's exit handler used to join the progress
# thread, which waited for the endpoint lock the exiting thread held: the process never ended).
#   exit_test.sh HOOK_DIR PROBE TRIALS
# For tcp;ofi_rxm and shm, PROBE runs TRIALS processes (each bounded to 10 s, see exit_probe.c);
# each must exit with status 0 and write its statistics line with progress_thread=1 and its
# counter served by compcntr (proof that the hook and its thread were really there).
set -eu
dir=$1 probe=$2 trials=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
for prov in "tcp;ofi_rxm" shm; do
  stats=$tmp/stats.$(echo "$prov" | tr -c 'a-z\n' _)
  FI_HOOK=compcntr FI_PROVIDER_PATH=$dir COMPCNTR_FI_PROGRESS_THREAD=1 COMPCNTR_FI_HOOK_STATS=$stats \
    "$probe" "$prov" "$trials" || fail "$prov: some process did not exit (output above)"
  lines=$(grep -c '^compcntr-hook .* cntr_served=1 .* progress_thread=1 ' "$stats" || true)
  [ "$lines" = "$trials" ] || { cat "$stats" >&2; fail "$prov: $lines statistics lines with the progress thread, expected $trials"; }
  echo "$prov: $trials processes exited, hook and progress thread in each ($(grep -c 'live_counts=skipped' "$stats" || true) with the thread left blocked in the provider)"
done
echo PASS
