#!/usr/bin/env python3
"""The figures table of bench/README.md, rendered from a compcntr_bench JSON file.

    bench/snapshot_table.py [JSON]            print the table (default: bench/snapshot/compcntr_bench.json)
    bench/snapshot_table.py --update [JSON]   rewrite the table between the markers in bench/README.md
    bench/snapshot_table.py --check [JSON]    exit 1 (with a diff) if bench/README.md's table differs

bench/README.md holds the rendered table between FIGURES_BEGIN and FIGURES_END; the docs suite's
test `bench_figures` (tests/docs/bench_figures.py) runs --check, so the figures in the README are
always the snapshot's and no prose restates them. After committing a new snapshot (the JSON that
`./dev bench --out bench/snapshot` writes), run --update.

Numbers are formatted as compcntr_bench prints its own table (bench/output.cpp: human(), cell(),
ratio_cell()), so a line of the README reads as the line of the run's terminal output.
"""
import difflib
import json
import math
import os
import re
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
README = os.path.join(BENCH, 'README.md')
DEFAULT_JSON = os.path.join(BENCH, 'snapshot', 'compcntr_bench.json')
FIGURES_BEGIN = '<!-- figures: begin (bench/snapshot_table.py --update renders this part) -->'
FIGURES_END = '<!-- figures: end -->'


def human(v):
    """bench/output.cpp human(): 3 significant digits, no exponent for the usual ranges."""
    if v >= 100 and abs(v - round(v)) < 0.0005:
        return '%.0f' % v
    if v >= 10:
        return '%.1f' % v
    if v >= 1:
        return '%.2f' % v
    return '%.3f' % v


def num(v, prec):
    """bench/output.cpp num(): %.*g."""
    if not math.isfinite(v):
        return 'null'
    return '%.*g' % (prec, v)


def cell(r):
    """bench/output.cpp cell(): "median unit ±spread%"."""
    if r is None:
        return '-'
    if not r.get('available', False):
        return 'unavailable'
    s = human(r['median']) + ' ' + r['unit']
    if len(r.get('samples', [])) > 1 and r['median'] > 0:
        spread = (r['max'] - r['min']) / 2 / r['median'] * 100
        s += ' ±' + (num(spread, 2) if spread < 10 else human(spread)) + '%'
    return s


def ratio_cell(line):
    """bench/output.cpp ratio_cell()."""
    if not line.get('ratio_kind'):
        return '-'
    s = human(line['ratio']) + ' ' + line['ratio_kind']
    if line['ratio_min'] != line['ratio_max']:
        s += ' [' + human(line['ratio_min']) + '-' + human(line['ratio_max']) + ']'
    return s


def md(text):
    """A table cell: '|' would end it."""
    return str(text).replace('|', '\\|')


def registered_rows():
    """Row ids registered in bench/rows/ (COMPCNTR_BENCH_ROW("P4", ...)), in file-name order."""
    rows = []
    rows_dir = os.path.join(BENCH, 'rows')
    for name in sorted(os.listdir(rows_dir)):
        if name.endswith('.cpp'):
            with open(os.path.join(rows_dir, name), encoding='utf-8') as f:
                rows += re.findall(r'COMPCNTR_BENCH_ROW\(\s*"([A-Z][0-9]+)"', f.read())
    return rows


def row_key(row):
    return (row[0] != 'P', row[0], int(row[1:]))


def render(data, json_name):
    m = data['machine']
    opts = data['options']
    lines = data['lines']
    verdicts = {}
    for line in lines:
        verdicts[line['verdict']] = verdicts.get(line['verdict'], 0) + 1
    out = []
    load_start = m.get('loadavg_start', '').split(' ')[0] or '?'
    load_end = m.get('loadavg_end', '').split(' ')[0] or '?'
    out.append(
        f"`{json_name}`: {data['program']} {data['version']} ({data['build']}, "
        f"{data['compiler']}) on {m['cpu']}, {len(m['cpus'])} CPU(s), {m['kernel']}; "
        f"{data['date']}; {opts['reps']} samples of ~{opts['sample_ms']:g} ms per variant; "
        f"load average {load_start} at the start, {load_end} at the end; "
        f"{data['seconds']:.0f} s. "
        f"{verdicts.get('PASS', 0)} PASS, {verdicts.get('FAIL', 0)} FAIL, "
        f"{verdicts.get('info', 0)} info lines.")
    out.append('')
    out.append('| row | measure | compcntr | reference | ratio [paired range] | target | result |')
    out.append('| --- | --- | --- | --- | --- | --- | --- |')
    for line in lines:
        out.append('| ' + ' | '.join(md(x) for x in (
            line['row'], line['measure'], cell(line['compcntr']), cell(line.get('reference')),
            ratio_cell(line), line['target'], line['verdict'])) + ' |')
    notes = [line for line in lines if line.get('note')]
    unavailable = [(line, r) for line in lines for r in (line['compcntr'], line.get('reference'))
                   if r is not None and not r.get('available', False)]
    if notes or unavailable:
        out.append('')
        out.append('Notes of the run (each line\'s "note" in the JSON):')
        out.append('')
        for line, r in unavailable:
            out.append(f"- {line['row']}: {r['name']} unavailable: {r.get('why', '')}")
        for line in notes:
            out.append(f"- {line['row']}, {line['measure']}: {line['note']}")
    in_run = {line['row'] for line in lines}
    missing = sorted((r for r in set(registered_rows()) if r not in in_run), key=row_key)
    if missing:
        out.append('')
        out.append('Rows of bench/rows/ that this snapshot does not have (registered after the run): '
                   + ', '.join(missing) + '.')
    return '\n'.join(out) + '\n'


def readme_figures(text):
    b = text.find(FIGURES_BEGIN)
    e = text.find(FIGURES_END)
    if b < 0 or e < b:
        raise SystemExit(f'snapshot_table.py: {README} has no {FIGURES_BEGIN!r} ... {FIGURES_END!r}')
    b += len(FIGURES_BEGIN)
    return b, e, text[b:e].strip('\n') + '\n'


def main(argv):
    mode = 'print'
    if argv and argv[0] in ('--update', '--check'):
        mode = argv.pop(0)[2:]
    path = argv[0] if argv else DEFAULT_JSON
    with open(path, encoding='utf-8') as f:
        data = json.load(f)
    name = os.path.relpath(os.path.abspath(path), os.path.dirname(BENCH))
    table = render(data, name)
    if mode == 'print':
        sys.stdout.write(table)
        return 0
    with open(README, encoding='utf-8') as f:
        text = f.read()
    b, e, current = readme_figures(text)
    if mode == 'update':
        with open(README, 'w', encoding='utf-8') as f:
            f.write(text[:b] + '\n' + table + text[e:])
        return 0
    if current == table:
        print(f'bench/README.md: the figures are those of {name}')
        return 0
    sys.stdout.writelines(difflib.unified_diff(
        current.splitlines(True), table.splitlines(True),
        'bench/README.md (figures)', f'bench/snapshot_table.py {name}'))
    print(f'bench/README.md: its figures are not those of {name}: '
          'run bench/snapshot_table.py --update', file=sys.stderr)
    return 1


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
