#!/bin/sh
# Suite `hook`, test `hook_launcher`: compcntr-fi-run and the COMPCNTR_FI_HOOK_STATS line.
#   launcher_test.sh LAUNCHER HOOK_DIR PROBE
# 1. the launcher runs an unmodified libfabric program (PROBE) with the hook: one stats line,
#    pid = the program's pid, cntr_open = the program's fi_cntr_open calls, all served,
#    cntr_bound = its two binds, cntr_reads = its reads;
# 2. it keeps hooks already named in FI_HOOK and libfabric's own provider directory;
# 3. without the launcher (no FI_HOOK) the program runs unhooked: the hook, though found on
#    FI_PROVIDER_PATH, serves nothing (fabrics=0, cntr_served=0);
# 4. a missing hook directory is exit status 127 with a message, no PROGRAM is usage (2).
set -eu
launcher=$1 dir=$2 probe=$3
run() { sh "$launcher" "$@"; }  # the build tree's copy is not executable (install sets the mode)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" "$2"; }

unset FI_HOOK FI_PROVIDER_PATH COMPCNTR_FI_PROGRESS_THREAD
# 1.
COMPCNTR_FI_HOOK_DIR=$dir COMPCNTR_FI_HOOK_STATS=$tmp/s1 run sh -c 'echo "pid=$$"; exec "$0" 7' "$probe" >"$tmp/o1" \
  || fail "the probe failed under the launcher: $(cat "$tmp/o1")"
[ "$(wc -l <"$tmp/s1")" -eq 1 ] || fail "expected one stats line, got: $(cat "$tmp/s1")"
pid=$(sed -n 's/^pid=//p' "$tmp/o1")
grep -q "^compcntr-hook pid=$pid " "$tmp/s1" || fail "stats line not from pid $pid: $(cat "$tmp/s1")"
grep -q "^fi_cntr_open calls: 7$" "$tmp/o1" || fail "probe output: $(cat "$tmp/o1")"
[ "$(field cntr_open "$tmp/s1")" = 7 ] || fail "cntr_open: $(cat "$tmp/s1")"
[ "$(field cntr_served "$tmp/s1")" = 7 ] || fail "cntr_served: $(cat "$tmp/s1")"
[ "$(field cntr_closed "$tmp/s1")" = 7 ] || fail "cntr_closed: $(cat "$tmp/s1")"
[ "$(field cntr_bound "$tmp/s1")" = 2 ] || fail "cntr_bound: $(cat "$tmp/s1")"
[ "$(field cntr_reads "$tmp/s1")" = 7 ] || fail "cntr_reads: $(cat "$tmp/s1")"
[ "$(field fabrics "$tmp/s1")" = 1 ] || fail "fabrics: $(cat "$tmp/s1")"
[ "$(field providers "$tmp/s1")" = shm ] || fail "providers: $(cat "$tmp/s1")"
# 2.
out=$(COMPCNTR_FI_HOOK_DIR=$dir FI_HOOK=noop run sh -c 'echo "$FI_HOOK|$FI_PROVIDER_PATH"')
case "$out" in
  "noop;compcntr|$dir:"?*) ;;
  *) fail "FI_HOOK/FI_PROVIDER_PATH set by the launcher: $out" ;;
esac
out=$(COMPCNTR_FI_HOOK_DIR=$dir FI_HOOK=compcntr FI_PROVIDER_PATH=/x run sh -c 'echo "$FI_HOOK|$FI_PROVIDER_PATH"')
[ "$out" = "compcntr|$dir:/x" ] || fail "existing FI_HOOK=compcntr / FI_PROVIDER_PATH: $out"
out=$(COMPCNTR_FI_HOOK_DIR=$dir FI_PROVIDER_PATH=@/x run sh -c 'echo "$FI_PROVIDER_PATH"' 2>&1 || true)
[ "$out" = "@$dir:/x" ] || fail "FI_PROVIDER_PATH=@/x: $out"
out=$(COMPCNTR_FI_HOOK_DIR=$dir FI_PROVIDER_PATH=/y:$dir run sh -c 'echo "$FI_PROVIDER_PATH"')
[ "$out" = "/y:$dir" ] || fail "hook directory already on FI_PROVIDER_PATH: $out"
# 3.
FI_PROVIDER_PATH=$dir COMPCNTR_FI_HOOK_STATS=$tmp/s3 "$probe" 3 >"$tmp/o3" || fail "the probe failed unhooked"
[ "$(field fabrics "$tmp/s3")" = 0 ] || fail "without FI_HOOK the hook was installed: $(cat "$tmp/s3")"
[ "$(field cntr_served "$tmp/s3")" = 0 ] || fail "without FI_HOOK a counter was served: $(cat "$tmp/s3")"
# 4.
set +e
COMPCNTR_FI_HOOK_DIR=$tmp/none run true 2>"$tmp/e4"; rc=$?
[ $rc -eq 127 ] || fail "missing hook directory: status $rc"
grep -q "libcompcntr-fi.so not found" "$tmp/e4" || fail "missing hook directory: $(cat "$tmp/e4")"
run 2>/dev/null; rc=$?
[ $rc -eq 2 ] || fail "no PROGRAM: status $rc"
set -e
echo "hook_launcher: all checks passed"
