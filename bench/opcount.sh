#!/usr/bin/env bash
# Instructions per operation of compcntr's hot paths and their raw-atomic baselines, counted by
# callgrind (exact and repeatable, unlike time on a shared machine). Compare two versions of the
# code by running this on each (e.g. two worktrees) and diffing the output.
#
#   bench/opcount.sh [BUILD_DIR] [N]      (default build-release, N = 1000000)
#
# Counts include the loop's own instructions (counter increment, compare, branch: ~3), identical
# for a compcntr op and its raw_* baseline, so "read - raw_load" is compcntr's extra cost.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-release}
n=${2:-1000000}
exe=$build/bench/compcntr_opcount
[ -x "$exe" ] || { echo "opcount.sh: $exe not built (./dev bench --list builds build-release)" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "opcount.sh: valgrind not installed" >&2; exit 1; }
printf '%-16s %14s %12s\n' op instructions 'per op'
for op in raw_load read raw_add add create_destroy; do
  ir=$(valgrind --tool=callgrind --toggle-collect="opcount_$op" --callgrind-out-file=/dev/null \
         "$exe" "$op" "$n" 2>&1 >/dev/null | sed -n 's/.*Collected : \([0-9]*\).*/\1/p')
  awk -v op="$op" -v ir="$ir" -v n="$n" 'BEGIN { printf "%-16s %14d %12.2f\n", op, ir, ir / n }'
done
