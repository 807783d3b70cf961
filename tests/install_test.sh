#!/usr/bin/env bash
# Installs the build into a temporary DESTDIR and builds two outside programs against it, the way
# a user would: a C program with `pkg-config --cflags --libs compcntr`, and a C++ program that
# precompiles its own BMIs from the installed module units (pkg-config variable modules_dir)
# and does `import compcntr;`. Both must run and succeed.
set -euo pipefail
build=$1 src=$2 cxx=$3 cc=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dest=$tmp/root
meson install -C "$build" --no-rebuild --destdir "$dest" --quiet >/dev/null

pc=$(find "$dest" -name compcntr.pc -print -quit)
[ -n "$pc" ] || { echo "install: no compcntr.pc installed"; exit 1; }
export PKG_CONFIG_PATH=$(dirname "$pc") PKG_CONFIG_SYSROOT_DIR=$dest
# pkgconf prefixes variables with the sysroot, pkg-config does not: accept both.
in_dest() { case "$1" in "$dest"/*) echo "$1" ;; *) echo "$dest$1" ;; esac; }
libdir=$(in_dest "$(pkg-config --variable=libdir compcntr)")
for f in "$libdir/libcompcntr.so" "$libdir/libcompcntr.a"; do
  [ -e "$f" ] || { echo "install: $f missing"; exit 1; }
done
[ -n "$(find "$dest" -path '*include/compcntr/compcntr.h')" ] || { echo "install: compcntr/compcntr.h missing"; exit 1; }

echo "== C: pkg-config --cflags --libs compcntr"
# shellcheck disable=SC2046
"$cc" -std=c11 -Wall -Werror $(pkg-config --cflags compcntr) "$src/examples/hello.c" \
  -o "$tmp/hello_c" $(pkg-config --libs compcntr)
LD_LIBRARY_PATH=$libdir "$tmp/hello_c"

echo "== C++: BMIs built from modules_dir, import compcntr;"
mods=$(in_dest "$(pkg-config --variable=modules_dir compcntr)")
[ -f "$mods/modules.list" ] || { echo "install: $mods/modules.list missing"; exit 1; }
flags=(-std=c++20 -O2)
imports=()
while read -r name file; do
  case "$name" in ''|'#'*) continue ;; esac
  out=$tmp/$(echo "$name" | tr ':' '-').pcm
  "$cxx" "${flags[@]}" "${imports[@]}" -x c++-module --precompile "$mods/$file" -o "$out"
  imports+=("-fmodule-file=$name=$out")
done < "$mods/modules.list"
# shellcheck disable=SC2046
"$cxx" "${flags[@]}" "${imports[@]}" $(pkg-config --cflags compcntr) "$src/examples/hello.cpp" \
  -o "$tmp/hello_cpp" $(pkg-config --libs compcntr)
LD_LIBRARY_PATH=$libdir "$tmp/hello_cpp"
echo "install: OK"
