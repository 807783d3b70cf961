#!/usr/bin/env bash
# Instructions per operation of compcntr's hot paths and their raw baselines, counted by
# callgrind (exact and repeatable, unlike time on a shared machine). Compare two versions of the
# code by running this on each (e.g. two worktrees) and diffing the output.
#
#   bench/opcount.sh [BUILD_DIR] [N]      (default build-release, N = 1000000)
#
# Counts include the loop's own instructions (counter increment, compare, branch: ~3), identical
# for a compcntr op and its raw_* baseline, so "read - raw_load" is compcntr's extra cost.
# The *_poll ops (a wait's spin loop until another thread updates the counter, which it does
# after 200 ms) are counted per loop iteration (opcount_iter.py: collected instructions / the
# execution count of the loop's instructions).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-release}
n=${2:-1000000}
exe=$build/bench/compcntr_opcount
[ -x "$exe" ] || { echo "opcount.sh: $exe not built (./dev bench --list builds build-release)" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "opcount.sh: valgrind not installed" >&2; exit 1; }
export LD_BIND_NOW=1  # no lazy PLT binding inside the counted calls (~900 instructions at a first call)
printf '%-20s %14s %12s\n' op instructions 'per op'
# op -> the function callgrind counts (the C ops are the loops of bench/rows/p11_c_loops.c)
declare -A fn=([c_read]=p11_c_read [c_read_err]=p11_c_read_err [c_inc]=p11_c_inc
               [c_inc_err]=p11_c_inc_err [c_wait_satisfied]=p11_c_wait_satisfied
               [c_raw_load]=p11_c_raw_load [c_raw_fetch_add]=p11_c_raw_fetch_add)
for op in raw_load read c_raw_load c_read c_read_err raw_add add add_armed_ahead trigger_fire c_raw_fetch_add c_inc c_inc_err \
          c_wait_satisfied striped_add striped_read shared_add shared_wait_satisfied create_destroy create_destroy_one c_create_destroy \
          freelist_one freelist_all; do
  f=${fn[$op]:-opcount_$op}
  ir=$(valgrind --tool=callgrind --toggle-collect="$f" --callgrind-out-file=/dev/null \
         "$exe" "$op" "$n" 2>&1 >/dev/null | sed -n 's/.*Collected : \([0-9]*\).*/\1/p')
  awk -v op="$op" -v ir="$ir" -v n="$n" 'BEGIN { printf "%-20s %14d %12.2f\n", op, ir, ir / n }'
done
# P5's sleeping round trip, user space only (callgrind does not see the kernel): one wait that
# sleeps until an update 200 ms later, and that update (it finds the sleeper and wakes it).
printf '%-20s %14s %14s\n' 'sleep (P5)' 'wait (instr)' 'update (instr)'
for op in sleep atomic_sleep futex_sleep; do
  case $op in sleep) fw=opcount_sleep_wait fu=opcount_sleep_wake ;;
              atomic_sleep) fw=opcount_atomic_wait fu=opcount_atomic_wake ;;
              futex_sleep) fw=opcount_futex_wait fu=opcount_futex_wake ;; esac
  iw=$(valgrind --tool=callgrind --toggle-collect="$fw" --callgrind-out-file=/dev/null \
         "$exe" "$op" 200 2>&1 >/dev/null | sed -n 's/.*Collected : \([0-9]*\).*/\1/p')
  iu=$(valgrind --tool=callgrind --toggle-collect="$fu" --callgrind-out-file=/dev/null \
         "$exe" "$op" 200 2>&1 >/dev/null | sed -n 's/.*Collected : \([0-9]*\).*/\1/p')
  printf '%-20s %14d %14d\n' "$op" "$iw" "$iu"
done
printf '%-20s %14s %12s\n' 'poll loop' instructions 'per iteration'
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
for op in raw_poll wait_poll raw_poll_timeout wait_poll_timeout shared_wait_poll; do
  valgrind --tool=callgrind --toggle-collect="opcount_$op" --dump-instr=yes --compress-pos=no \
    --callgrind-out-file="$tmp" "$exe" "$op" 200 >/dev/null 2>&1
  read -r total iters per < <(python3 bench/opcount_iter.py "$tmp")
  printf '%-20s %14d %12s   (%d iterations)\n' "$op" "$total" "$per" "$iters"
done
