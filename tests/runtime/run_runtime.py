#!/usr/bin/env python3
"""Runs examples/runtime under mpirun and asserts its exit code and printed checks.

usage: run_runtime.py MPIRUN PROGRAM NP EXPECT [program args...]
  EXPECT  pass            exit 0, every check line PASS, the exact message and write totals,
                          "runtime: all checks passed"
          pass:longer=S   the same, for a run meant to outlast S seconds (a watchdog shorter
                          than the run); a run that was over sooner exercised nothing and is
                          reported as skipped (exit 77), not passed
          fail:<text>     a non-zero exit, <text> in the output, and the run bounded in time

Every run is bounded (a hung job is killed and fails the test). mpirun runs as root with
--allow-run-as-root when needed and oversubscribes the machine's cores (2 here) on purpose.
"""
import os
import re
import subprocess
import sys
import time


def arg_value(args, name, default):
    return int(args[args.index(name) + 1]) if name in args else default


def main():
    mpirun, prog, np_, expect = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    args = sys.argv[5:]
    cmd = [mpirun]
    if os.geteuid() == 0:
        cmd.append('--allow-run-as-root')
    cmd += ['--oversubscribe', '--bind-to', 'none', '-np', str(np_), prog] + args
    limit = 90
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=limit,
                           env=dict(os.environ, OMPI_MCA_btl_base_warn_component_unused='0'))
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b'').decode(errors='replace')
        print(out)
        print(f'FAIL: the job did not finish within {limit} s (a hang)')
        return 1
    dt = time.monotonic() - t0
    out = p.stdout.decode(errors='replace')
    print(' '.join(cmd))
    print(out)
    print(f'exit code {p.returncode} after {dt:.1f} s')
    problems = []
    longer = None
    if expect.startswith('pass:longer='):
        longer = float(expect.split('=', 1)[1])
        expect = 'pass'
    if expect == 'pass':
        if p.returncode != 0:
            problems.append(f'exit code {p.returncode}, expected 0')
        checks = re.findall(r'^  check: (.*)  (PASS|FAIL)$', out, re.M)
        flow = '--no-flow' not in args
        want = 5 if flow else 4
        if len(checks) != want:
            problems.append(f'{len(checks)} check lines, expected {want}')
        for text, verdict in checks:
            if verdict != 'PASS':
                problems.append(f'check failed: {text}')
        msgs = arg_value(args, '--msgs', 20000)
        writes = arg_value(args, '--writes', 256)
        total = msgs * np_ * (np_ - 1)
        if f'({total} of {total}, bad 0, duplicates 0, missing 0' not in out:
            problems.append(f'the delivery line does not say {total} of {total} with nothing bad')
        if f'({writes * np_ * (np_ - 1)} writes, window bytes wrong 0' not in out:
            problems.append('the RMA line does not report every write landed')
        if flow and 'violations 0; truncation / error completions 0)' not in out:
            problems.append('the posted-buffer line is not clean')
        rows = re.findall(r'^  (\d+) +(\d+) +(\d+) +\d+ +(\d+)/(\d+) ', out, re.M)
        if len(rows) != np_:
            problems.append(f'{len(rows)} rows in the per-rank table, expected {np_}')
        for r, sent, received, infl, win in rows:
            if int(sent) != msgs * (np_ - 1) or int(received) != msgs * (np_ - 1):
                problems.append(f'rank {r}: sent {sent} / received {received}, expected {msgs * (np_ - 1)}')
            if flow and not 0 < int(infl) <= int(win):
                problems.append(f'rank {r}: {infl} in flight for a window of {win}')
        if 'runtime: all checks passed' not in out:
            problems.append('no "runtime: all checks passed" line')
    elif expect.startswith('fail:'):
        text = expect[5:]
        if p.returncode == 0:
            problems.append('exit code 0, expected the job to fail')
        if text not in out:
            problems.append(f'"{text}" not in the output')
        if 'runtime: all checks passed' in out:
            problems.append('a failed job claims all checks passed')
    else:
        problems.append(f'unknown EXPECT {expect}')
    for pr in problems:
        print('FAIL:', pr)
    if problems:
        return 1
    if longer is not None:
        m = re.search(r'RMA writes of \d+ B per pair, ([0-9.]+) s$', out, re.M)
        wall = float(m.group(1)) if m else 0.0
        if wall <= longer:
            print(f'SKIP: the run took {wall:.2f} s, not longer than {longer} s: nothing exercised')
            return 77
        print(f'the run took {wall:.2f} s, longer than {longer} s')
    return 0


if __name__ == '__main__':
    sys.exit(main())
