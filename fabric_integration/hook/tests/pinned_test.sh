#!/bin/sh
# Suite `hook`, test `hook_thread_pinned`: COMPCNTR_FI_PROGRESS_THREAD=1 in a process pinned to one
# CPU of several (a launcher's binding: mpiexec --bind-to core) declines the progress thread
# (caller progress; the stats line says progress_thread=pinned); =always starts it anyway; a
# process allowed two CPUs starts it. (issue 23: SOS's latencies with the thread beside a PE
# pinned to its core were 1.3-1.5x.)
#   pinned_test.sh HOOK_DIR PROBE
set -eu
dir=$1 probe=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" "$2"; }
ncpu=$(getconf _NPROCESSORS_ONLN)
if [ "$ncpu" -lt 2 ]; then echo "one CPU online: nothing to pin against"; exit 77; fi
unset FI_HOOK COMPCNTR_FI_PROGRESS_THREAD
# run FILE THREAD CPUS: the probe (shm) hooked, with COMPCNTR_FI_PROGRESS_THREAD=THREAD, on CPUS
run() {
  FI_HOOK=compcntr FI_PROVIDER_PATH=$dir COMPCNTR_FI_HOOK_STATS=$tmp/$1 COMPCNTR_FI_PROGRESS_THREAD=$2 \
    taskset -c "$3" "$probe" 3 >"$tmp/$1.out" || fail "the probe failed ($2 on CPUs $3): $(cat "$tmp/$1.out")"
  [ "$(wc -l <"$tmp/$1")" -eq 1 ] || fail "expected one stats line ($2 on CPUs $3): $(cat "$tmp/$1")"
  [ "$(field cntr_served "$tmp/$1")" = 3 ] || fail "cntr_served ($2 on CPUs $3): $(cat "$tmp/$1")"
}
run one 1 0
[ "$(field progress_thread "$tmp/one")" = pinned ] || fail "pinned to CPU 0: $(cat "$tmp/one")"
run always always 0
[ "$(field progress_thread "$tmp/always")" = 1 ] || fail "=always pinned to CPU 0: $(cat "$tmp/always")"
run two 1 0,1
[ "$(field progress_thread "$tmp/two")" = 1 ] || fail "on CPUs 0,1: $(cat "$tmp/two")"
echo "hook_thread_pinned: all checks passed"
