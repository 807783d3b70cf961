#!/usr/bin/env python3
"""Suite `man`: the installed man pages, checked the way a user meets them.

Installs the build into a temporary DESTDIR, then:
1. derives the list of public functions from the *installed* headers (clang's AST of every
   include/compcntr/*.h: each FunctionDecl whose location is in an installed header; a call
   added later without a page fails here), and the C++ functions of the installed .hpp headers;
2. every C function has man3/<function>.3 (a page or a .so link to one), and `man -M <mandir>
   <function>` finds and renders it;
3. every page renders with `MANWIDTH=80 man --warnings -l` without a single warning, has
   NAME/SYNOPSIS (section 3) /DESCRIPTION/SEE ALSO sections, a whatis entry lexgrog can parse,
   and the project version in its footer;
4. every compcntr page a page refers to (SEE ALSO and text: `name(N)`) is installed; .so links
   point at installed pages;
5. every C++ function of an installed .hpp header is named on some page.

  man_test.py BUILD_DIR PREFIX MANDIR INCLUDEDIR VERSION CC
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

failures = []


def fail(msg):
    failures.append(msg)
    print('FAIL: ' + msg)


def header_functions(cc, incdir, headers):
    """Names of the functions declared in `headers` (installed C headers), from clang's AST."""
    names = {}
    hdr_real = {os.path.realpath(h) for h in headers}
    for h in headers:
        r = subprocess.run([cc, '-x', 'c', '-std=c11', '-fsyntax-only', '-Xclang', '-ast-dump=json',
                            '-I', incdir, h], capture_output=True, text=True)
        if r.returncode != 0:
            fail(f'{h} does not compile alone: {r.stderr.strip()[:500]}')
            continue
        ast = json.loads(r.stdout)
        cur = None   # clang's JSON names a node's file only when it differs from the previous one
        for node in ast.get('inner', []):
            loc = node.get('loc', {})
            loc = loc.get('expansionLoc', loc)
            if 'file' in loc:
                cur = os.path.realpath(loc['file'])
            elif 'includedFrom' in loc and 'file' in loc['includedFrom']:
                pass
            if node.get('kind') != 'FunctionDecl' or node.get('isImplicit'):
                continue
            # Not API: the static inline fast paths behind the data-path macros of compcntr.h
            # (their public names are the exported functions' pages), and compcntr_priv_* (an
            # exported helper of those fast paths, documented as private in the header).
            if node.get('storageClass') == 'static' or node['name'].startswith('compcntr_priv_'):
                continue
            if cur in hdr_real:
                names.setdefault(node['name'], os.path.basename(cur))
    return names


def cxx_functions(hpp):
    """`ns::name` of every function declared at namespace scope in a C++ header (a plain scan:
    a declaration line `... name(` inside `namespace ns {`)."""
    out = []
    ns = None
    for line in open(hpp, encoding='utf-8'):
        m = re.match(r'^namespace ([\w:]+) \{', line)
        if m:
            ns = m.group(1)
            continue
        if re.match(r'^\}\s*//\s*namespace', line):
            ns = None
            continue
        if ns is None or line.startswith((' ', '\t', '/', '#')):
            continue
        m = re.search(r'\b([a-z_][a-z0-9_]*)\s*\(', line)
        if m and not line.lstrip().startswith(('return', 'using', 'static_assert')):
            out.append(f'{ns}::{m.group(1)}')
    return out


def render(page, cwd):
    env = dict(os.environ, MANWIDTH='80', LC_ALL='C.UTF-8', MAN_KEEP_FORMATTING='')
    r = subprocess.run(['man', '--warnings', '-l', page], cwd=cwd, env=env, capture_output=True,
                       text=True)
    return r.returncode, r.stdout, r.stderr


def main():
    build, prefix, mandir, includedir, version, cc = sys.argv[1:7]
    tmp = tempfile.mkdtemp()
    try:
        dest = os.path.join(tmp, 'root')
        subprocess.run(['meson', 'install', '-C', build, '--no-rebuild', '--destdir', dest,
                        '--quiet'], check=True, stdout=subprocess.DEVNULL)
        man_root = dest + os.path.join(prefix, mandir)
        inc_root = dest + os.path.join(prefix, includedir)
        headers = sorted(glob.glob(os.path.join(inc_root, 'compcntr', '*.h')))
        hpps = sorted(glob.glob(os.path.join(inc_root, 'compcntr', '*.hpp')))
        if not headers:
            fail(f'no headers installed in {inc_root}/compcntr')
        funcs = header_functions(cc, inc_root, headers)
        print(f'{len(funcs)} C functions in {len(headers)} installed headers')
        if len(funcs) < 10:
            fail(f'only {len(funcs)} functions found in the installed headers: the scan is broken')

        pages = sorted(glob.glob(os.path.join(man_root, 'man*', '*.*')))
        installed = {os.path.relpath(p, man_root) for p in pages}
        print(f'{len(pages)} man files installed under {os.path.relpath(man_root, dest)}')

        # 2. every function has its page, and man finds it by name.
        for fn, hdr in sorted(funcs.items()):
            if f'man3/{fn}.3' not in installed:
                fail(f'{fn} (declared in compcntr/{hdr}) has no man page man3/{fn}.3')
        env = dict(os.environ, MANWIDTH='80', LC_ALL='C.UTF-8', MANPAGER='cat', PAGER='cat')
        for fn in ('compcntr_create_comp_cntr', 'compcntr_destroy_comp_cntr'):
            r = subprocess.run(['man', '-M', man_root, '3', fn], env=env, capture_output=True,
                               text=True)
            if r.returncode != 0 or 'COMPCNTR_CREATE_COMP_CNTR(3)' not in r.stdout:
                fail(f'`man -M <mandir> 3 {fn}` does not show the counters page: rc {r.returncode}'
                     f' {r.stderr.strip()[:200]}')

        # 3./4. render every page and link; check sections, whatis, version, references.
        all_text = ''
        for p in pages:
            rel = os.path.relpath(p, man_root)
            src = open(p, encoding='utf-8').read()
            m = re.match(r'^\.so (man\d/\S+)\s*$', src)
            if m:
                if m.group(1) not in installed:
                    fail(f'{rel}: .so link to {m.group(1)}, which is not installed')
                rc, out, err = render(rel, man_root)
                if rc != 0 or err.strip() or 'NAME' not in out:
                    fail(f'{rel}: link does not render ({rc}): {err.strip()[:300]}')
                continue
            rc, out, err = render(rel, man_root)
            if rc != 0 or err.strip():
                fail(f'{rel}: man --warnings: rc {rc}: {err.strip()[:500]}')
            all_text += out
            sec = rel.split('/')[0][3:]
            want = ['NAME', 'DESCRIPTION', 'SEE ALSO'] + (['SYNOPSIS'] if sec == '3' else [])
            heads = set(re.findall(r'^([A-Z][A-Z ]+[A-Z])$', out, re.M))
            for h in want:
                if h not in heads:
                    fail(f'{rel}: no {h} section')
            th = re.search(r'^\.TH "([^"]*)" "([^"]*)" "[^"]*" "([^"]*)"', src, re.M)
            if not th or th.group(3) != f'compcntr {version}':
                fail(f'{rel}: .TH footer is not "compcntr {version}": '
                     f'{th.group(0) if th else "no .TH line"}')
            lg = subprocess.run(['lexgrog', p], capture_output=True, text=True)
            if lg.returncode != 0 or 'parse failed' in lg.stdout:
                fail(f'{rel}: lexgrog cannot parse the NAME section: {lg.stdout.strip()[:200]}')
            see = out.split('SEE ALSO', 1)[-1]
            if sec == '3' and not re.search(r'compcntr\w*\(\d\)', see):
                fail(f'{rel}: SEE ALSO names no other compcntr page')
            for name, s in set(re.findall(r'\b(compcntr\w*)\((\d)\)', out)):
                if f'man{s}/{name}.{s}' not in installed:
                    fail(f'{rel}: refers to {name}({s}), which is not installed')

        # 5. the C++ functions of the installed .hpp headers are named on some page.
        for h in hpps:
            for fn in cxx_functions(h):
                if fn not in all_text:
                    fail(f'{fn} (declared in compcntr/{os.path.basename(h)}) is named on no man page')
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print(f'man: {len(failures)} problem(s)')
        return 1
    print('man: OK')
    return 0


if __name__ == '__main__':
    sys.exit(main())
