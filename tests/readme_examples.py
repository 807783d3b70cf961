#!/usr/bin/env python3
"""README.md quotes examples/hello.c and examples/hello.cpp: the quotes must equal the files,
which are compiled and run by the build and the install test."""
import re, sys, pathlib
root = pathlib.Path(sys.argv[1])
readme = (root / 'README.md').read_text()
blocks = re.findall(r'From \[`(examples/[^`]+)`\].*?```\w+\n(.*?)```', readme, re.S)
if not blocks:
    sys.exit('README.md quotes no example')
bad = 0
for path, text in blocks:
    if (root / path).read_text() != text:
        print(f'README.md quote of {path} differs from the file'); bad += 1
    else:
        print(f'{path}: README quote matches')
sys.exit(1 if bad else 0)
