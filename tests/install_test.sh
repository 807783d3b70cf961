#!/usr/bin/env bash
# Installs the build into a temporary DESTDIR and builds two outside programs against it, the way
# a user would: a C program with `pkg-config --cflags --libs compcntr`, and a C++ program that
# precompiles its own BMIs from the installed module units (pkg-config variable modules_dir)
# and does `import compcntr;`. Both must run and succeed. With libfabric (5th argument "yes"),
# also the libfabric integration: a C program built with `pkg-config --cflags --libs
# compcntr-fabric` (examples/fabric_bridge.c, real traffic; exit 77 = no provider here) and a C++
# program using <compcntr/fabric.hpp> with the outside BMIs.
set -euo pipefail
build=$1 src=$2 cxx=$3 cc=$4 fabric=${5:-no}
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

if [ "$fabric" = yes ]; then
  echo "== libfabric integration: pkg-config --cflags --libs compcntr-fabric"
  [ -n "$(find "$dest" -name compcntr-fabric.pc)" ] || { echo "install: no compcntr-fabric.pc installed"; exit 1; }
  for f in "$libdir/libcompcntr-fabric.so" "$libdir/libcompcntr-fabric.a"; do
    [ -e "$f" ] || { echo "install: $f missing"; exit 1; }
  done
  for h in fabric.h fabric.hpp; do
    [ -n "$(find "$dest" -path "*include/compcntr/$h")" ] || { echo "install: compcntr/$h missing"; exit 1; }
  done
  pkg-config --print-requires compcntr-fabric | grep -q '^compcntr' || { echo "install: compcntr-fabric.pc does not require compcntr"; exit 1; }
  pkg-config --print-requires compcntr-fabric | grep -q '^libfabric' || { echo "install: compcntr-fabric.pc does not require libfabric"; exit 1; }
  # shellcheck disable=SC2046
  "$cc" -std=c11 -Wall -Werror $(pkg-config --cflags compcntr-fabric) "$src/examples/fabric_bridge.c" \
    -o "$tmp/fabric_bridge" $(pkg-config --libs compcntr-fabric)
  rc=0
  LD_LIBRARY_PATH=$libdir "$tmp/fabric_bridge" || rc=$?
  [ $rc -eq 0 ] || [ $rc -eq 77 ] || { echo "install: fabric_bridge exited $rc"; exit 1; }
  cat > "$tmp/fabric_cpp.cpp" <<'CPP'
#include <compcntr/fabric.hpp>
#include <cstdio>
int main() {
  compcntr::wait_options o = compcntr::fabric::progress_options(nullptr);
  // Refusals only: no provider is needed to check that the C++ half links and runs.
  const bool ok = o.drive == compcntr_fi_bridge_progress_fn &&
                  compcntr::fabric::bind(nullptr, compcntr::counter_ref{}, FI_SEND) == EINVAL &&
                  compcntr_fi_bridge_open(nullptr) == nullptr;
  std::printf("fabric.hpp: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
CPP
  # shellcheck disable=SC2046
  "$cxx" "${flags[@]}" "${imports[@]}" $(pkg-config --cflags compcntr-fabric) "$tmp/fabric_cpp.cpp" \
    -o "$tmp/fabric_cpp" $(pkg-config --libs compcntr-fabric)
  LD_LIBRARY_PATH=$libdir "$tmp/fabric_cpp"
fi
echo "install: OK"
