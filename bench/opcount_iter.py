#!/usr/bin/env python3
"""Instructions per loop iteration from a callgrind output file written with --dump-instr=yes
--compress-pos=no (bench/opcount.sh). Prints "<total> <iterations> <per iteration>".

The collected function runs a poll loop an unknown number of times (until another thread
updates the word). Every instruction of the loop body executes once per iteration, so the
largest execution count of any single instruction is the number of iterations; instructions
outside the loop run once. Cost lines that follow a "calls=" line are a callee's inclusive cost,
not an instruction's own count: they are skipped (they are already counted in the callee)."""
import sys

total = 0
most = 0
skip_next = False
with open(sys.argv[1]) as f:
    for line in f:
        if line.startswith('summary:'):
            total = int(line.split()[1])
        if line.startswith('calls='):
            skip_next = True
            continue
        parts = line.split()
        if len(parts) == 3 and parts[0].startswith('0x'):
            if skip_next:
                skip_next = False
                continue
            most = max(most, int(parts[2]))
        else:
            skip_next = False
if most == 0:
    sys.exit('opcount_iter: no per-instruction counts (run callgrind with --dump-instr=yes --compress-pos=no)')
print(total, most, f'{total / most:.2f}')
