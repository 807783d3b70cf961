#!/usr/bin/env python3
"""Turn a docs/ reference page into its man page (and .so links), with pandoc.

The docs/ page *is* the man source: nothing is written twice, so the two cannot drift.
Format of a page (docs/consuming.md, section "Man pages", says it too):

    # <page>(<section>) — <one-line summary>
    ## NAME
    `compcntr_a`, `compcntr_b` — what they do ...
    ## SYNOPSIS / DESCRIPTION / RETURN VALUE / ERRORS / ... / SEE ALSO

What the conversion does, beyond pandoc's own GitHub-Markdown-to-roff:
- the man NAME section becomes one whatis line "page, b, c - summary" (every `compcntr_*` name
  in the NAME section gets a man page: the page itself or a ".so" link to it); the NAME
  section's own text moves to the top of DESCRIPTION;
- `##` headings become .SH (upper case), `###` .SS;
- tables become definition lists (.TP), the way rdma-core and libfabric man pages list errors:
  a pipe table does not fit an 80-column terminal;
- links to other docs pages become man references ("name(3)"), code spans such as `fi_cntr(3)`
  become bold references.

  mkman.py --list DOC.md                      print the files DOC.md produces (page, links)
  mkman.py --outdir DIR --version V DOC.md    write them into DIR
"""
import argparse
import json
import os
import re
import subprocess
import sys

H1 = re.compile(r'^# ([A-Za-z_][\w.-]*)\((\d)\)\s+(?:—|-)\s+(.+?)\s*$')
REF = re.compile(r'^([A-Za-z_][\w.:-]*)\((\d[a-z]*)\)$')
DOCS_REF = re.compile(r'^(.*?)docs/([\w-]+)\.md(.*)$')
NAME_WORD = re.compile(r'`(compcntr_[a-z0-9_]+)`')


class FormatError(Exception):
    pass


def parse_page(path):
    """(page, section, summary, names, body markdown) of a docs page, or None if it is not a
    man page (its first line is not `# name(N) — summary`)."""
    with open(path, encoding='utf-8') as f:
        text = f.read()
    lines = text.split('\n')
    m = H1.match(lines[0])
    if not m:
        return None
    page, section, summary = m.group(1), m.group(2), m.group(3)
    body = lines[1:]
    # The NAME section: from "## NAME" to the next "## ".
    start = next((i for i, l in enumerate(body) if l.strip().upper() == '## NAME'), None)
    if start is None:
        raise FormatError(f'{path}: no "## NAME" section')
    end = next((i for i in range(start + 1, len(body)) if body[i].startswith('## ')), len(body))
    name_text = '\n'.join(body[start + 1:end]).strip()
    first_par = name_text.split('\n\n')[0]
    names = []
    for n in NAME_WORD.findall(first_par):
        if n not in names and n != page:
            names.append(n)
    rest = body[:start] + body[end:]
    return {
        'page': page, 'section': section, 'summary': summary, 'links': names,
        'name_text': name_text, 'body': '\n'.join(rest),
    }


def outputs(info):
    sec = info['section']
    return [f"{info['page']}.{sec}"] + [f'{n}.{sec}' for n in info['links']]


# ---- pandoc AST helpers (pandoc API 1.22, pandoc 2.17 as in Debian 12) ------------------------

def Str(s):
    return {'t': 'Str', 'c': s}


SPACE = {'t': 'Space'}


def text_inlines(s):
    out = []
    for i, w in enumerate(s.split(' ')):
        if i:
            out.append(SPACE)
        if w:
            out.append(Str(w))
    return out


def stringify(x):
    if isinstance(x, list):
        return ''.join(stringify(e) for e in x)
    if isinstance(x, dict):
        t = x.get('t')
        if t == 'Str':
            return x['c']
        if t in ('Space', 'SoftBreak', 'LineBreak'):
            return ' '
        if t == 'Code':
            return x['c'][1]
        if t in ('Link', 'Image'):
            return stringify(x['c'][1])
        if t in ('Emph', 'Strong', 'Strikeout', 'Superscript', 'Subscript', 'SmallCaps',
                 'Plain', 'Para'):
            return stringify(x['c'])
        if t == 'Quoted':
            return stringify(x['c'][1])
        if t == 'Span':
            return stringify(x['c'][1])
        return ''
    return ''


def man_ref(name, sec):
    return [{'t': 'Strong', 'c': [Str(name)]}, Str(f'({sec})')]


def upper_inlines(inls):
    out = []
    for e in inls:
        if e.get('t') == 'Str':
            out.append(Str(e['c'].upper()))
        elif e.get('t') in ('Emph', 'Strong'):
            out.extend(upper_inlines(e['c']))
        else:
            out.append(e)
    return out


class Converter:
    def __init__(self, docs_dir, pages):
        self.docs_dir = docs_dir
        self.pages = pages          # docs file name -> (page, section) or None

    def page_of(self, url):
        path = url.split('#', 1)[0]
        if not path.endswith('.md') or '://' in path:
            return False, None
        full = os.path.normpath(os.path.join(self.docs_dir, path))
        key = os.path.basename(full)
        if os.path.dirname(full) != os.path.normpath(self.docs_dir):
            return True, None
        if key not in self.pages:
            info = None
            if os.path.exists(full):
                try:
                    info = parse_page(full)
                except FormatError:
                    info = None
            self.pages[key] = (info['page'], info['section']) if info else None
        return True, self.pages[key]

    def inline(self, e):
        t = e.get('t')
        if t == 'Link':
            label, (url, _title) = e['c'][1], e['c'][2]
            local, ref = self.page_of(url)
            text = stringify(label).strip()
            m = REF.match(text)
            if m and local:
                # The text names the man page: that is the reference (even while the target
                # docs page is missing, e.g. a page another part of the tree provides).
                return man_ref(m.group(1), m.group(2))
            if ref:
                m = REF.match(text)
                if m or text.endswith('.md'):
                    return man_ref(*ref)
                return self.inlines(label) + [SPACE, Str('(')] + man_ref(*ref) + [Str(')')]
            if local or not re.match(r'^[a-z]+:', url):
                # Another file of the repository (architecture.md, ../examples/hello.c): name it.
                path = os.path.normpath(os.path.join('docs', url.split('#', 1)[0]))
                if text in (url, os.path.basename(url)) or text.endswith('.md'):
                    return [{'t': 'Code', 'c': [['', [], []], path]}]
                return self.inlines(label) + [SPACE, Str('('),
                                              {'t': 'Code', 'c': [['', [], []], path]}, Str(')')]
            return [e]
        if t == 'Code':
            m = REF.match(e['c'][1])
            if m:
                return man_ref(m.group(1), m.group(2))
            m = DOCS_REF.match(e['c'][1])
            if m and not m.group(1) and not m.group(3):
                _local, ref = self.page_of(m.group(2) + '.md')
                if ref:
                    return man_ref(*ref)
            return [e]
        if t in ('Emph', 'Strong', 'Strikeout', 'Superscript', 'Subscript', 'SmallCaps'):
            return [{'t': t, 'c': self.inlines(e['c'])}]
        if t == 'Quoted':
            return [{'t': t, 'c': [e['c'][0], self.inlines(e['c'][1])]}]
        if t == 'Span':
            return [{'t': t, 'c': [e['c'][0], self.inlines(e['c'][1])]}]
        if t == 'Str':
            # "docs/wait.md" in prose names the page's man reference when it is one.
            m = DOCS_REF.match(e['c'])
            if m:
                _local, ref = self.page_of(m.group(2) + '.md')
                if ref:
                    return ([Str(m.group(1))] if m.group(1) else []) + man_ref(*ref) + (
                        [Str(m.group(3))] if m.group(3) else [])
            return [e]
        if t == 'RawInline':
            return []       # HTML comments and tags: nothing in a man page
        return [e]

    def inlines(self, inls):
        out = []
        for e in inls:
            out.extend(self.inline(e))
        return out

    def table(self, c):
        _attr, _caption, colspecs, head, bodies, _foot = c
        ncols = len(colspecs)
        headers = []
        for row in head[1]:
            headers = [stringify(cell[4]).strip() for cell in row[1]]
        rows = []
        for body in bodies:
            rows.extend(body[2])
            rows.extend(body[3])
        nested = ncols == 3 and len(headers) == 3 and headers[1].lower() in ('errno', 'value', 'error')
        items = []
        for row in rows:
            cells = row[1]
            term = self.blocks_to_inlines(cells[0][4]) if cells else []
            defs = []
            if nested:
                # call | errno | when: the errno values as a list inside the call's entry.
                key = self.blocks_to_inlines(cells[1][4])
                val = self.blocks_to_inlines(cells[2][4])
                if not defs:
                    # An empty first block: pandoc then indents the nested list under the call.
                    defs.append({'t': 'RawBlock', 'c': ['man', '']})
                defs.append({'t': 'DefinitionList', 'c': [[key or [Str('—')], [[{'t': 'Para', 'c': val}]]]]})
            else:
                for i, cell in enumerate(cells[1:], start=1):
                    inl = self.blocks_to_inlines(cell[4])
                    if not inl:
                        continue
                    if ncols > 2 and i < len(headers) and headers[i]:
                        inl = [{'t': 'Emph', 'c': text_inlines(headers[i] + ':')}, SPACE] + inl
                    defs.append({'t': 'Para', 'c': inl})
            if items and (not term or stringify(term) == stringify(items[-1][0])):
                prev = items[-1][1][0]
                if nested and prev and prev[-1]['t'] == 'DefinitionList':
                    prev[-1]['c'].extend(defs[-1]['c'])
                else:
                    prev.extend(defs)   # a row continuing the previous one
            else:
                items.append([term or [Str('—')], [defs]])
        return {'t': 'DefinitionList', 'c': items}

    def blocks_to_inlines(self, blocks):
        out = []
        for b in blocks:
            if b['t'] in ('Plain', 'Para'):
                if out:
                    out.append(SPACE)
                out.extend(self.inlines(b['c']))
        return out

    def block(self, b):
        t = b['t']
        if t == 'Header':
            level, attr, inls = b['c']
            level = max(1, level - 1)
            inls = self.inlines(inls)
            if level == 1:
                inls = upper_inlines(inls)
            return [{'t': 'Header', 'c': [level, attr, inls]}]
        if t in ('Para', 'Plain'):
            return [{'t': t, 'c': self.inlines(b['c'])}]
        if t == 'Table':
            return [self.table(b['c'])]
        if t in ('BulletList',):
            return [{'t': t, 'c': [self.blocks(item) for item in b['c']]}]
        if t == 'OrderedList':
            return [{'t': t, 'c': [b['c'][0], [self.blocks(item) for item in b['c'][1]]]}]
        if t == 'BlockQuote':
            return [{'t': t, 'c': self.blocks(b['c'])}]
        if t == 'DefinitionList':
            return [{'t': t, 'c': [[self.inlines(term), [self.blocks(d) for d in defs]]
                                   for term, defs in b['c']]}]
        if t == 'RawBlock':
            return []
        if t == 'CodeBlock':
            return [{'t': t, 'c': [['', [], []], b['c'][1].rstrip('\n')]}]
        return [b]

    def blocks(self, bl):
        out = []
        for b in bl:
            out.extend(self.block(b))
        return out


def run_pandoc(args, text):
    r = subprocess.run(['pandoc'] + args, input=text.encode(), capture_output=True)
    if r.returncode != 0:
        raise FormatError('pandoc ' + ' '.join(args) + ' failed: ' + r.stderr.decode().strip())
    return r.stdout.decode()


def pandoc_json(markdown):
    return json.loads(run_pandoc(['-f', 'gfm', '-t', 'json'], markdown))


def render(path, info, version):
    docs_dir = os.path.dirname(os.path.abspath(path))
    conv = Converter(docs_dir, {})
    doc = pandoc_json(info['body'])
    name_doc = pandoc_json(info['name_text'])
    blocks = conv.blocks(doc['blocks'])
    intro = conv.blocks(name_doc['blocks'])
    names = [info['page']] + info['links']
    whatis = {'t': 'Para', 'c': text_inlines(', '.join(names) + ' - ' + info['summary'])}
    # No hyphenation, ragged right: identifiers such as compcntr_create_comp_cntr stay whole.
    out = [{'t': 'RawBlock', 'c': ['man', '.nh\n.ad l']},
           {'t': 'Header', 'c': [1, ['name', [], []], [Str('NAME')]]}, whatis]
    # The NAME section's own prose opens DESCRIPTION (or follows NAME when there is none).
    desc = next((i for i, b in enumerate(blocks)
                 if b['t'] == 'Header' and b['c'][0] == 1 and stringify(b['c'][2]) == 'DESCRIPTION'),
                None)
    if desc is None:
        syn = next((i for i, b in enumerate(blocks)
                    if b['t'] == 'Header' and b['c'][0] == 1 and stringify(b['c'][2]) == 'SYNOPSIS'),
                   None)
        if syn is None:
            blocks = [{'t': 'Header', 'c': [1, ['', [], []], [Str('DESCRIPTION')]]}] + intro + blocks
        else:
            nxt = next((i for i in range(syn + 1, len(blocks))
                        if blocks[i]['t'] == 'Header' and blocks[i]['c'][0] == 1), len(blocks))
            blocks = (blocks[:nxt] + [{'t': 'Header', 'c': [1, ['', [], []], [Str('DESCRIPTION')]]}]
                      + intro + blocks[nxt:])
    else:
        blocks = blocks[:desc + 1] + intro + blocks[desc + 1:]
    doc['blocks'] = out + blocks
    meta = {
        'title': {'t': 'MetaInlines', 'c': [Str(info['page'].upper())]},
        'section': {'t': 'MetaInlines', 'c': [Str(info['section'])]},
        'footer': {'t': 'MetaInlines', 'c': text_inlines(f'compcntr {version}')},
        'header': {'t': 'MetaInlines', 'c': text_inlines('compcntr manual')},
    }
    doc['meta'] = meta
    return run_pandoc(['-f', 'json', '-t', 'man', '-s'], json.dumps(doc))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--list', action='store_true')
    ap.add_argument('--outdir')
    ap.add_argument('--version', default='unknown')
    ap.add_argument('docs', nargs='+')
    a = ap.parse_args()
    status = 0
    for path in a.docs:
        try:
            info = parse_page(path)
        except FormatError as e:
            print(f'mkman: {e}', file=sys.stderr)
            status = 1
            continue
        if info is None:
            print(f'mkman: {path}: line 1 is not "# <page>(<section>) — <summary>"', file=sys.stderr)
            status = 1
            continue
        files = outputs(info)
        if a.list:
            print('\n'.join(files))
            continue
        try:
            page = render(path, info, a.version)
        except FormatError as e:
            print(f'mkman: {path}: {e}', file=sys.stderr)
            status = 1
            continue
        os.makedirs(a.outdir, exist_ok=True)
        with open(os.path.join(a.outdir, files[0]), 'w', encoding='utf-8') as f:
            f.write(page)
        for link in files[1:]:
            with open(os.path.join(a.outdir, link), 'w', encoding='utf-8') as f:
                f.write(f'.so man{info["section"]}/{files[0]}\n')
    return status


if __name__ == '__main__':
    sys.exit(main())
