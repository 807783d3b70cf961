#!/usr/bin/env python3
"""Instructions per poll iteration from a callgrind output file written with --dump-instr=yes
--compress-pos=no (bench/opcount.sh). Prints "<total> <iterations> <per iteration>".

The collected function runs a spin loop an unknown number of times (until another thread
updates the word). Every poll of a spin loop executes one `pause`, so the iterations are the
executions of `pause` instructions: their addresses come from objdump of each object file the
output names (ob=), their execution counts from the per-instruction costs. (The loop may be
unrolled, so no single instruction's count is the iteration count.) Cost lines that follow a
"calls=" line are a callee's inclusive cost, not an instruction's own count: they are skipped."""
import re
import subprocess
import sys

pauses = {}  # object file -> set of addresses of pause instructions


def pause_addresses(obj):
    if obj not in pauses:
        found = set()
        try:
            out = subprocess.run(['objdump', '-d', '--no-show-raw-insn', obj], capture_output=True,
                                 text=True, check=True).stdout
            for line in out.splitlines():
                m = re.match(r'\s*([0-9a-f]+):\s+pause\b', line)
                if m:
                    found.add(int(m.group(1), 16))
        except (OSError, subprocess.CalledProcessError):
            pass
        pauses[obj] = found
    return pauses[obj]


total = 0
iterations = 0
obj = None
names = {}  # callgrind's compressed ob=(id) names
skip_next = False
with open(sys.argv[1]) as f:
    for line in f:
        if line.startswith('summary:'):
            total = int(line.split()[1])
            continue
        if line.startswith('ob='):
            v = line[3:].strip()
            m = re.match(r'\((\d+)\)\s*(.*)', v)
            if m:
                if m.group(2):
                    names[m.group(1)] = m.group(2)
                v = names.get(m.group(1), v)
            obj = v
            continue
        if line.startswith('cob='):  # a callee's object: may define a compressed name
            m = re.match(r'\((\d+)\)\s*(.*)', line[4:].strip())
            if m and m.group(2):
                names[m.group(1)] = m.group(2)
            continue
        if line.startswith('calls='):
            skip_next = True
            continue
        parts = line.split()
        if len(parts) == 3 and parts[0].startswith('0x'):
            if skip_next:
                skip_next = False
                continue
            if obj and int(parts[0], 16) in pause_addresses(obj):
                iterations += int(parts[2])
        else:
            skip_next = False
if iterations == 0:
    sys.exit('opcount_iter: no pause executed (run callgrind with --dump-instr=yes --compress-pos=no; objdump needed)')
print(total, iterations, f'{total / iterations:.2f}')
