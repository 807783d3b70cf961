#!/usr/bin/env python3
"""Smoke test of compcntr_bench: runs every row briefly (--smoke) and checks the program exits 0
and writes well-formed JSON (the expected fields, every registered row present) and a parseable
SVG. It never looks at timings: the machine running it may be arbitrarily busy."""
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

exe, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
rows = [line.split()[0] for line in
        subprocess.run([exe, '--list'], check=True, capture_output=True, text=True).stdout.splitlines()]
assert rows, 'no rows registered'
run = subprocess.run([exe, '--smoke', '--out', out], capture_output=True, text=True, timeout=100)
sys.stdout.write(run.stdout)
sys.stderr.write(run.stderr)
assert run.returncode == 0, f'compcntr_bench --smoke exited with {run.returncode}'

with open(os.path.join(out, 'compcntr_bench.json')) as f:
    doc = json.load(f)
for key in ('program', 'version', 'date', 'machine', 'options', 'lines'):
    assert key in doc, f'JSON lacks "{key}"'
assert doc['options']['smoke'] is True
seen = set()
for line in doc['lines']:
    for key in ('row', 'measure', 'compcntr', 'reference', 'ratio', 'target', 'verdict'):
        assert key in line, f'line {line.get("row")} lacks "{key}"'
    assert line['verdict'] in ('PASS', 'FAIL', 'info', 'n/a'), line['verdict']
    seen.add(line['row'])
    cc = line['compcntr']
    assert cc['name'] and cc['unit']
    # compcntr's own side never depends on an external provider: it must have been measured,
    # except that a two-thread row cannot run where this process may use a single CPU, and P15
    # and P19 (MPI ranks over libfabric) do not run in sanitizer builds or without Open MPI.
    if not cc['available']:
        why = cc.get('why', '')
        assert 'needs 2 CPUs' in why or (line['row'] in ('P15', 'P19') and (
            'sanitizer build' in why or 'built without Open MPI' in why)), \
            f'{line["row"]} {line["measure"]}: compcntr side unavailable: {cc.get("why")}'
        continue
    # P7's memory lines are one reading; P13's ping-pongs run in child processes (probe
    # p13-pingpong) that report one sample per configuration in --smoke.
    assert len(cc['samples']) == doc['options']['reps'] or line['row'] in ('P7', 'P13')
    ref = line['reference']
    if ref is not None and not ref['available']:
        assert ref['why'], 'an unavailable reference must say why'
missing = set(rows) - seen
assert not missing, f'rows without a line in the JSON: {sorted(missing)}'

ET.parse(os.path.join(out, 'compcntr_bench.svg'))
print(f'bench smoke: {len(doc["lines"])} lines from rows {sorted(seen)}, JSON and SVG well-formed')
