#!/usr/bin/env bash
# The Debian packages ./dev package built, checked the way a user meets them: each .deb is
# unpacked (dpkg -x) into one scratch root, then
#   1. every package holds exactly the files it should (no file in two packages, nothing
#      missing: the headers of include/compcntr/, the module units of modules.list, a man page for
#      every function of the installed headers, the hook when the tree has it);
#   2. the control fields say what a user needs (the -dev package pulls the exact runtime
#      versions and the -dev packages pkg-config resolves; shlibs give the libraries' deps);
#   3. the README examples are built against the unpacked packages only (pkg-config with the
#      scratch root as sysroot; C++: BMIs built from the packaged module units) and run; the
#      libfabric example, and a CMake consumer through the packaged CMake package.
#
#   package_test.sh DEB_DIR SRC CC CXX VERSION
set -euo pipefail
debs=$1 src=$2 cc=$3 cxx=$4 version=$5
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "package: $*" >&2; exit 1; }
root=$tmp/root
mkdir -p "$root"
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
lib=usr/lib/$arch

want_pkgs=(libcompcntr0 libcompcntr-fabric0 libcompcntr-dev)
have_hook=no
[ -f "$src/fabric_integration/hook/meson.build" ] && { have_hook=yes; want_pkgs+=(compcntr-fi-hook); }

# ---- 1. contents --------------------------------------------------------------------------
declare -A owner
for p in "${want_pkgs[@]}"; do
  deb=$(ls "$debs/${p}_${version}_"*.deb 2>/dev/null | head -1)
  [ -n "$deb" ] || fail "no ${p}_${version}_*.deb in $debs (run ./dev package)"
  dpkg-deb -x "$deb" "$root"
  dpkg-deb --fsys-tarfile "$deb" | tar -t | sed 's|^\./||; s|/$||' | grep -v '^$' >"$tmp/$p.files"
  while read -r f; do
    [ -d "$root/$f" ] && [ ! -L "$root/$f" ] && continue
    [ -z "${owner[$f]:-}" ] || fail "$f is in both ${owner[$f]} and $p"
    owner[$f]=$p
  done <"$tmp/$p.files"
  dpkg-deb -f "$deb" Depends >"$tmp/$p.depends" || true
done
files_of() { # package: its non-directory files, sorted
  local p=$1
  while read -r f; do [ -d "$root/$f" ] && [ ! -L "$root/$f" ] || echo "$f"; done <"$tmp/$p.files" | sort
}
expect() {  # package, expected file list on stdin: must be equal
  local p=$1
  sort >"$tmp/$p.want"
  files_of "$p" >"$tmp/$p.got"
  if ! diff -u "$tmp/$p.want" "$tmp/$p.got" >"$tmp/$p.diff"; then
    cat "$tmp/$p.diff"
    fail "$p: contents differ from what it should hold (- expected, + packaged)"
  fi
  echo "  $p: $(wc -l <"$tmp/$p.got") files as expected"
}
docs() { printf '%s\n' "usr/share/doc/$1/changelog.gz" "usr/share/doc/$1/copyright"; }

{ printf '%s\n' "$lib/libcompcntr.so.0" "$lib/libcompcntr.so.$version"; docs libcompcntr0; } | expect libcompcntr0
{ printf '%s\n' "$lib/libcompcntr-fabric.so.0" "$lib/libcompcntr-fabric.so.$version"; docs libcompcntr-fabric0; } |
  expect libcompcntr-fabric0

# The development package: derived from the source tree, so a new header, module unit or call
# without its file in the package fails here.
{
  for h in "$src"/include/compcntr/*.h "$src"/include/compcntr/*.hpp; do
    echo "usr/include/compcntr/$(basename "$h")"
  done
  echo usr/include/compcntr/version.h
  for l in libcompcntr libcompcntr-fabric; do
    printf '%s\n' "$lib/$l.so" "$lib/$l.a" "$lib/pkgconfig/${l#lib}.pc"
  done
  printf '%s\n' "$lib/cmake/compcntr/compcntrConfig.cmake" "$lib/cmake/compcntr/compcntrConfigVersion.cmake"
  echo usr/share/compcntr/modules/modules.list
  sed -n 's/^compcntr[:a-z_]* \(.*\)$/usr\/share\/compcntr\/modules\/\1/p' \
    "$root/usr/share/compcntr/modules/modules.list"
  # One man page (or link) per exported function of the packaged C headers, and the overview.
  for h in "$root"/usr/include/compcntr/*.h; do
    "$cc" -x c -std=c11 -fsyntax-only -Xclang -ast-dump=json -I "$root/usr/include" "$h" |
      python3 -c '
import json, os, sys
cur = None
for n in json.load(sys.stdin).get("inner", []):
    loc = n.get("loc", {}); loc = loc.get("expansionLoc", loc)
    if "file" in loc: cur = loc["file"]
    # static inline fast paths have no page of their own (their exported twins do); neither
    # have compcntr_priv_* (internal slow paths the inline ones call), nor the builtins they use
    # (implicit declarations): as in suite man.
    if (n.get("kind") == "FunctionDecl" and cur and "/compcntr/" in cur
            and not n.get("isImplicit") and n.get("storageClass") != "static"
            and not n["name"].startswith("compcntr_priv_")):
        print(n["name"])'
  done | sort -u | sed 's|^\(.*\)$|usr/share/man/man3/\1.3.gz|'
  echo usr/share/man/man7/compcntr.7.gz
  docs libcompcntr-dev
} | sort -u | expect libcompcntr-dev
if [ "$have_hook" = yes ]; then
  { printf '%s\n' "$lib/libfabric/libcompcntr-fi.so" "$lib/libfabric/libofi_compcntr-fi.so" usr/bin/compcntr-fi-run
    ls "$root"/usr/share/man/man7/compcntr_fi_hook.7.gz "$root"/usr/share/man/man1/compcntr-fi-run.1.gz 2>/dev/null |
      sed "s|^$root/||"
    docs compcntr-fi-hook; } | expect compcntr-fi-hook
  [ -e "$root/usr/share/man/man7/compcntr_fi_hook.7.gz" ] || fail "compcntr-fi-hook: no compcntr_fi_hook(7) page"
fi

# ---- 2. control fields --------------------------------------------------------------------
need_dep() { grep -Eq "(^|, )$2( |,|$)" "$tmp/$1.depends" || fail "$1 does not depend on $2: $(cat "$tmp/$1.depends")"; }
need_dep libcompcntr-dev "libcompcntr0 \(= $version\)"
need_dep libcompcntr-dev "libcompcntr-fabric0 \(= $version\)"
# pkg-config resolves Requires(.private) for --cflags: these must come with the -dev package.
need_dep libcompcntr-dev "libhwloc-dev"
need_dep libcompcntr-dev "libfabric-dev"
need_dep libcompcntr-dev "libibverbs-dev"
need_dep libcompcntr0 "libhwloc15"
need_dep libcompcntr-fabric0 "libfabric1"
need_dep libcompcntr-fabric0 "libcompcntr0 \(>= $version\)"
# shlibs bounds (debian/rules): while the major is 0, the next minor may break the ABI.
IFS=. read -r maj min _ <<<"$version"
if [ "$maj" -eq 0 ]; then next="0.$((min + 1))~"; else next="$((maj + 1))~"; fi
need_dep libcompcntr-fabric0 "libcompcntr0 \(<< $next\)"
echo "  control fields: -dev pulls the runtime packages (= $version) and the -dev packages pkg-config needs"

# ---- 3. the README examples against the unpacked packages ---------------------------------
export PKG_CONFIG_PATH=$root/$lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$root
export PKG_CONFIG_LIBDIR=/usr/lib/$arch/pkgconfig:/usr/share/pkgconfig   # system .pc files only besides
in_root() { case "$1" in "$root"/*) echo "$1" ;; *) echo "$root$1" ;; esac; }
libdir=$(in_root "$(pkg-config --variable=libdir compcntr)")
[ "$libdir" = "$root/$lib" ] || fail "compcntr.pc libdir is $libdir"
[ "$(pkg-config --modversion compcntr)" = "$version" ] || fail "compcntr.pc version"
# shellcheck disable=SC2046
"$cc" -std=c11 -Wall -Werror $(pkg-config --cflags compcntr) "$src/examples/hello.c" -o "$tmp/hello_c" \
  $(pkg-config --libs compcntr)
LD_LIBRARY_PATH=$libdir "$tmp/hello_c"
mods=$(in_root "$(pkg-config --variable=modules_dir compcntr)")
flags=(-std=c++20 -O2)
imports=()
while read -r name file; do
  case "$name" in ''|'#'*) continue ;; esac
  out=$tmp/$(echo "$name" | tr ':' '-').pcm
  "$cxx" "${flags[@]}" "${imports[@]}" -x c++-module --precompile "$mods/$file" -o "$out"
  imports+=("-fmodule-file=$name=$out")
done <"$mods/modules.list"
# shellcheck disable=SC2046
"$cxx" "${flags[@]}" "${imports[@]}" $(pkg-config --cflags compcntr) "$src/examples/hello.cpp" \
  -o "$tmp/hello_cpp" $(pkg-config --libs compcntr)
LD_LIBRARY_PATH=$libdir "$tmp/hello_cpp"
# shellcheck disable=SC2046
"$cc" -std=c11 -Wall -Werror $(pkg-config --cflags compcntr-fabric) "$src/examples/fabric_bridge.c" \
  -o "$tmp/fabric_bridge" $(pkg-config --libs compcntr-fabric)
rc=0
LD_LIBRARY_PATH=$libdir "$tmp/fabric_bridge" >"$tmp/fabric.out" 2>&1 || rc=$?
[ $rc -eq 0 ] || [ $rc -eq 77 ] || { cat "$tmp/fabric.out"; fail "fabric_bridge exited $rc"; }
echo "  README examples built against the packages and run: hello.c, hello.cpp (import compcntr;), fabric_bridge.c ($rc)"
if command -v cmake >/dev/null; then
  p=$tmp/cmake
  mkdir -p "$p"
  cp "$src/tests/consumers/cmake/CMakeLists.txt" "$src"/tests/consumers/src/*.c "$p/"
  env -u PKG_CONFIG_SYSROOT_DIR -u PKG_CONFIG_PATH -u PKG_CONFIG_LIBDIR cmake -S "$p" -B "$p/build" \
    -DCMAKE_PREFIX_PATH="$root/usr" -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
    >"$tmp/cmake.log" 2>&1 || { cat "$tmp/cmake.log"; fail "cmake against the packages failed"; }
  cmake --build "$p/build" >"$tmp/cmake-build.log" 2>&1 || { tail -30 "$tmp/cmake-build.log"; fail "cmake build failed"; }
  LD_LIBRARY_PATH=$libdir "$p/build/consumer_c" >/dev/null
  "$p/build/consumer_c_static" >/dev/null
  LD_LIBRARY_PATH=$libdir "$p/build/consumer_fabric" >/dev/null
  echo "  CMake consumer (find_package(compcntr) from the packages): shared, static, fabric run"
fi
echo "package: OK (${#want_pkgs[@]} packages, version $version, hook: $have_hook)"
