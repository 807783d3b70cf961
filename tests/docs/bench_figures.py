#!/usr/bin/env python3
"""Suite docs: the figures table of bench/README.md ("Latest figures") is exactly what
bench/snapshot_table.py renders from bench/snapshot/compcntr_bench.json, so the README's figures
cannot drift from the snapshot. Fix a failure with bench/snapshot_table.py --update.

    tests/docs/bench_figures.py SOURCE_ROOT
"""
import os
import subprocess
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..', '..')
script = os.path.join(root, 'bench', 'snapshot_table.py')
sys.exit(subprocess.run([sys.executable, script, '--check',
                         os.path.join(root, 'bench', 'snapshot', 'compcntr_bench.json')]).returncode)
