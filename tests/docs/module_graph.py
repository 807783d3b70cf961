#!/usr/bin/env python3
"""docs/architecture.md's module graph is the build's: a test (suite docs).

Reads the partitions in build order from modules/meson.build, the `import :x;` lines of each
partition's unit, and the fenced graph under "## The module graph" in docs/architecture.md, and
checks that the three agree: the same partitions in the same order, each in the layer of its
folder (core/, features/), each importing exactly the partitions the page lists, and only
partitions built before it. The same for the internal partitions (modules/meson.build's
internal_units, listed under `internal` on the page): each is a `module compcntr:X;` unit (no
`export module`), imports only public partitions and internal ones listed before it, a core one
(src/core/) no feature partition; and no public unit (modules/**.cppm, the primary included)
imports an internal partition. Prints every difference; exit 1 if there is one.

    tests/docs/module_graph.py SOURCE_ROOT
"""
import pathlib
import re
import sys


def build_order(root):
    text = (root / 'modules/meson.build').read_text()
    return re.findall(r"\[\s*'(\w+)',\s*'((?:core|features)/\w+\.cppm)'\s*\]", text)


def internal_order(root):
    text = (root / 'modules/meson.build').read_text()
    block = re.search(r"^internal_units\s*=\s*\[(.*?)^\]", text, re.M | re.S)
    if not block:
        return []
    return re.findall(r"\[\s*'(\w+)',\s*'(src/[\w/]+\.cppm)'\s*\]", block.group(1))


def imports_of(path):
    return [m.group(1) for m in re.finditer(r'^\s*import\s+:(\w+)\s*;', path.read_text(), re.M)]


def documented(root):
    text = (root / 'docs/architecture.md').read_text()
    section = text.split('## The module graph', 1)[1]
    block = section.split('```', 2)[1]
    rows, layer = [], None
    for line in block.splitlines():
        if not line.strip():
            continue
        head = line[:10].strip()
        if head:
            layer = head
        words = line[10:].split()
        if not words:
            continue
        name, deps = words[0], words[1:]
        rows.append((layer, name, [] if deps == ['-'] else deps))
    return rows


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else '.')
    order = build_order(root)
    rows = documented(root)
    doc = [r for r in rows if r[0] not in ('primary', 'internal')]
    problems = []
    if not order:
        problems.append('modules/meson.build: no partition list found')
    built = [n for n, _ in order]
    if [n for _, n, _ in doc] != built:
        problems.append('partition order: docs/architecture.md lists %s, modules/meson.build builds %s'
                        % ([n for _, n, _ in doc], built))
    docmap = {n: (layer, deps) for layer, n, deps in doc}
    seen = []
    for name, rel in order:
        unit = root / 'modules' / rel
        real = imports_of(unit)
        folder = rel.split('/')[0]
        layer, deps = docmap.get(name, (None, None))
        if layer is None:
            problems.append('%s: built but not in docs/architecture.md' % name)
        else:
            if layer != folder:
                problems.append('%s: in modules/%s/ but listed under %s' % (name, folder, layer))
            if sorted(deps) != sorted(real):
                problems.append('%s: docs/architecture.md says it imports %s, %s imports %s'
                                % (name, ' '.join(deps) or '-', rel, ' '.join(real) or '-'))
        later = [d for d in real if d not in seen]
        if later:
            problems.append('%s imports %s, built after it (modules/meson.build order)'
                            % (name, ' '.join(later)))
        if folder == 'core':
            up = [d for d in real if dict(order).get(d, '').startswith('features/')]
            if up:
                problems.append('core partition %s imports feature partition(s) %s' % (name, ' '.join(up)))
        seen.append(name)
    internal = internal_order(root)
    inames = [n for n, _ in internal]
    idoc = [r for r in rows if r[0] == 'internal']
    if [n for _, n, _ in idoc] != inames:
        problems.append('internal partitions: docs/architecture.md lists %s, modules/meson.build '
                        'builds %s' % ([n for _, n, _ in idoc], inames))
    idocmap = {n: deps for _, n, deps in idoc}
    iseen = []
    for name, rel in internal:
        unit = root / rel
        text = unit.read_text()
        real = imports_of(unit)
        if not re.search(r'^module\s+compcntr:%s\s*;' % name, text, re.M):
            problems.append('%s: %s does not declare `module compcntr:%s;`' % (name, rel, name))
        if re.search(r'^\s*export\s+module\b', text, re.M):
            problems.append('%s: %s is an interface unit (`export module`); internal partitions '
                            'are not' % (name, rel))
        deps = idocmap.get(name)
        if deps is not None and sorted(deps) != sorted(real):
            problems.append('%s: docs/architecture.md says it imports %s, %s imports %s'
                            % (name, ' '.join(deps) or '-', rel, ' '.join(real) or '-'))
        unknown = [d for d in real if d not in built and d not in iseen]
        if unknown:
            problems.append('%s imports %s: neither a public partition nor an internal one built '
                            'before it' % (name, ' '.join(unknown)))
        if rel.startswith('src/core/'):
            up = [d for d in real if dict(order).get(d, '').startswith('features/')]
            if up:
                problems.append('core internal partition %s imports feature partition(s) %s'
                                % (name, ' '.join(up)))
        iseen.append(name)
    for rel in ['compcntr.cppm'] + [r for _, r in order]:
        text = (root / 'modules' / rel).read_text()
        used = re.findall(r'^\s*(?:export\s+)?import\s+:(\w+)\s*;', text, re.M)
        leak = [d for d in used if d in inames]
        if leak:
            problems.append('modules/%s imports internal partition(s) %s (installed units must '
                            'not need them)' % (rel, ' '.join(leak)))
    for p in problems:
        print('module_graph: ' + p)
    print('module_graph: %d partitions, %d internal, %d imports checked, %d differences'
          % (len(order), len(internal),
             sum(len(imports_of(root / 'modules' / r)) for _, r in order)
             + sum(len(imports_of(root / r)) for _, r in internal), len(problems)))
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
