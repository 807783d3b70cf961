#!/usr/bin/env bash
# Suite `consumers`: compcntr consumed by projects of their own, the ways docs/consuming.md
# describes. Each mode builds in a temporary directory and runs what it built.
#
#   consumers_test.sh meson   SRC CC CXX VERSION FABRIC
#       tests/consumers/meson as a project whose subprojects/compcntr is this checkout:
#       dependency('compcntr', fallback: ...) for a C program and an `import compcntr;` C++
#       program (and compcntr-fabric when FABRIC=yes); all run.
#   consumers_test.sh cmake   SRC CC CXX VERSION FABRIC BUILD
#       meson install of BUILD into a temporary DESTDIR; tests/consumers/cmake configured by
#       Debian's cmake with CMAKE_PREFIX_PATH=<that prefix>: find_package(compcntr), the imported
#       targets (shared, static, fabric), the version file's rules; the programs run.
#   consumers_test.sh version SRC CC CXX VERSION FABRIC BUILD
#       every place that carries the version agrees with meson.build's: <compcntr/version.h>,
#       compcntr_version(), pkg-config files, soname and file names, CMake version file, man page
#       footers, debian/changelog, CHANGELOG.md.
#   consumers_test.sh doctest_wrap SRC CC CXX
#       subprojects/doctest.wrap's overlay: a project falling back to it (forced) builds and runs
#       a doctest case, with the archive's directory made from the system's doctest header (no
#       network here); without that directory and downloads disabled, configuring fails and
#       names the wrap.
set -euo pipefail
mode=$1 src=$2 cc=$3 cxx=$4 version=${5:-} fabric=${6:-no} build=${7:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "consumers($mode): $*" >&2; exit 1; }

install_build() {   # install BUILD into $tmp/root; sets dest prefix libdir
  dest=$tmp/root
  meson install -C "$build" --no-rebuild --destdir "$dest" --quiet >/dev/null
  local pc
  pc=$(find "$dest" -name compcntr.pc -print -quit)
  [ -n "$pc" ] || fail "no compcntr.pc installed"
  export PKG_CONFIG_PATH=$(dirname "$pc") PKG_CONFIG_SYSROOT_DIR=$dest
  prefix=$dest$(PKG_CONFIG_SYSROOT_DIR= pkg-config --variable=prefix compcntr)
  libdir=$dest$(PKG_CONFIG_SYSROOT_DIR= pkg-config --variable=libdir compcntr)
}

case "$mode" in
meson)
  p=$tmp/project
  mkdir -p "$p/subprojects"
  cp "$src/tests/consumers/meson/meson.build" "$src"/tests/consumers/src/* "$p/"
  ln -s "$src" "$p/subprojects/compcntr"
  # buildtype plain (no optimisation, no debug information): what is checked is that the
  # subproject fallback builds and links, not its code generation; ~15% less compile time in
  # the longest test of CI's normal build (its project's default stays debugoptimized).
  CC=$cc CXX=$cxx meson setup "$p/build" "$p" -Dbuildtype=plain >"$tmp/setup.log" 2>&1 ||
    { cat "$tmp/setup.log"; fail "meson setup of the consumer failed"; }
  grep -Eq "^ *compcntr *: YES" "$tmp/setup.log" || { cat "$tmp/setup.log"; fail "compcntr did not come from the subproject"; }
  # The consumer's programs and what they link, not the subproject's DL providers (the hook,
  # ofi_compcntr: nothing of the consumer's loads them).
  targets=(consumer_c consumer_cpp)
  [ "$fabric" = yes ] && targets+=(consumer_fabric)
  ninja -C "$p/build" "${targets[@]}" >"$tmp/build.log" 2>&1 || { tail -40 "$tmp/build.log"; fail "build failed"; }
  for prog in consumer_c consumer_cpp; do
    [ -x "$p/build/$prog" ] || fail "$prog was not built"
  done
  if [ "$fabric" = yes ] && [ ! -x "$p/build/consumer_fabric" ]; then
    fail "compcntr has libfabric but the consumer got no compcntr-fabric dependency"
  fi
  meson test -C "$p/build" --no-rebuild --print-errorlogs >"$tmp/test.log" 2>&1 || { cat "$tmp/test.log"; fail "consumer programs failed"; }
  grep -h '^consumer_' "$p/build/meson-logs/testlog.txt"
  n=$(grep -c ' OK ' "$tmp/test.log" || true)
  want=2; [ "$fabric" = yes ] && want=3
  [ "$n" -eq "$want" ] || { cat "$tmp/test.log"; fail "$n of $want consumer programs passed"; }
  ;;

cmake)
  install_build
  command -v cmake >/dev/null || fail "cmake is not installed"
  p=$tmp/project
  mkdir -p "$p"
  cp "$src/tests/consumers/cmake/CMakeLists.txt" "$src"/tests/consumers/src/*.c "$p/"
  env -u PKG_CONFIG_SYSROOT_DIR -u PKG_CONFIG_PATH cmake -S "$p" -B "$p/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" \
    -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$tmp/cmake.log" 2>&1 ||
    { cat "$tmp/cmake.log"; fail "cmake configure failed"; }
  grep -E 'compcntr' "$tmp/cmake.log" | sed 's/^/  /'
  grep -qx "version=$version" "$p/build/found.txt" || fail "find_package gave version $(grep version= "$p/build/found.txt"), want $version"
  if [ "$fabric" = yes ]; then
    grep -qx "fabric=TRUE" "$p/build/found.txt" || fail "component fabric not found although libcompcntr-fabric is installed"
  fi
  hook_installed=no
  [ -e "$libdir/libfabric/libcompcntr-fi.so" ] && hook_installed=yes
  want_hook=FALSE; [ $hook_installed = yes ] && want_hook=TRUE
  grep -qx "fi_hook=$want_hook" "$p/build/found.txt" || fail "component fi_hook: $(grep fi_hook= "$p/build/found.txt"), hook installed: $hook_installed"
  cmake --build "$p/build" >"$tmp/build.log" 2>&1 || { tail -40 "$tmp/build.log"; fail "cmake build failed"; }
  LD_LIBRARY_PATH=$libdir "$p/build/consumer_c"
  # The static program must not need libcompcntr.so at run time.
  ! readelf -d "$p/build/consumer_c_static" | grep -q 'libcompcntr\.so' || fail "consumer_c_static links libcompcntr.so"
  "$p/build/consumer_c_static"
  if [ "$fabric" = yes ]; then
    LD_LIBRARY_PATH=$libdir "$p/build/consumer_fabric"
  fi
  # The version file's rules (read by find_package): same major, and while major is 0 the
  # same minor, requested <= installed.
  vfile=$(find "$dest" -name compcntrConfigVersion.cmake -print -quit)
  IFS=. read -r maj min pat <<<"$version"
  printf 'include("${VFILE}")\nmessage("${PACKAGE_VERSION_COMPATIBLE}")\n' >"$tmp/vcheck.cmake"
  check_version() {   # requested expected(TRUE/FALSE)
    local got
    got=$(cmake -DPACKAGE_FIND_VERSION="$1" -DPACKAGE_FIND_VERSION_MAJOR="${1%%.*}" \
            -DPACKAGE_FIND_VERSION_MINOR="$(echo "$1" | cut -d. -f2)" -DCMAKE_SIZEOF_VOID_P=8 \
            -DVFILE="$vfile" -P "$tmp/vcheck.cmake" 2>&1)
    [ "$got" = "$2" ] || fail "version file: request $1 -> compatible=$got, want $2"
  }
  check_version "$version" TRUE
  check_version "$maj.$min" TRUE
  check_version "$maj.$min.$((pat + 1))" FALSE
  check_version "$((maj + 1)).0" FALSE
  if [ "$maj" -eq 0 ]; then check_version "0.$((min + 1))" FALSE; fi
  [ "$min" -gt 0 ] && [ "$maj" -eq 0 ] && check_version "0.$((min - 1))" FALSE
  if [ $hook_installed = no ]; then
    # The fi_hook logic without the hook (not in this tree): an (empty) file where the hook
    # installs must give the target, with that file as its location.
    mkdir -p "$libdir/libfabric"
    : >"$libdir/libfabric/libcompcntr-fi.so"
    env -u PKG_CONFIG_SYSROOT_DIR -u PKG_CONFIG_PATH cmake "$p/build" >"$tmp/cmake2.log" 2>&1 ||
      { cat "$tmp/cmake2.log"; fail "cmake reconfigure failed"; }
    grep -qx "fi_hook=TRUE" "$p/build/found.txt" || fail "compcntr::fi_hook missing with $libdir/libfabric/libcompcntr-fi.so present"
    grep -q "compcntr fi_hook: $libdir/libfabric/libcompcntr-fi.so" "$tmp/cmake2.log" || fail "compcntr::fi_hook location: $(grep 'fi_hook' "$tmp/cmake2.log")"
    rm "$libdir/libfabric/libcompcntr-fi.so"
    echo "  fi_hook: no hook in this tree; with a file at its place the target appears (checked)"
  fi
  echo "cmake: OK (fabric=$fabric, fi_hook installed=$hook_installed)"
  ;;

version)
  install_build
  check() { [ "$2" = "$version" ] || fail "$1 says '$2', meson.build says '$version'"; echo "  $1: $2"; }
  check "pkg-config compcntr" "$(pkg-config --modversion compcntr)"
  if [ "$fabric" = yes ]; then check "pkg-config compcntr-fabric" "$(pkg-config --modversion compcntr-fabric)"; fi
  [ -e "$libdir/libcompcntr.so.$version" ] || fail "$libdir/libcompcntr.so.$version missing"
  soname=$(readelf -d "$libdir/libcompcntr.so.$version" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
  [ "$soname" = "libcompcntr.so.${version%%.*}" ] || fail "soname of libcompcntr.so.$version is '$soname', want libcompcntr.so.${version%%.*}"
  echo "  libcompcntr.so.$version: soname $soname"
  hdr=$(find "$dest" -path '*include/compcntr/version.h' -print -quit)
  check "COMPCNTR_VERSION_STRING" "$(sed -n 's/^#define COMPCNTR_VERSION_STRING "\(.*\)"/\1/p' "$hdr")"
  cat >"$tmp/v.c" <<'C'
#include <compcntr/compcntr.h>
#include <stdio.h>
int main(void) { printf("%s %d\n", compcntr_version(), COMPCNTR_VERSION_NUMBER); return 0; }
C
  # shellcheck disable=SC2046
  "$cc" -std=c11 -Wall -Werror $(pkg-config --cflags compcntr) "$tmp/v.c" -o "$tmp/v" $(pkg-config --libs compcntr)
  read -r runtime number < <(LD_LIBRARY_PATH=$libdir "$tmp/v")
  check "compcntr_version()" "$runtime"
  IFS=. read -r maj min pat <<<"$version"
  [ "$number" -eq $((maj * 10000 + min * 100 + pat)) ] || fail "COMPCNTR_VERSION_NUMBER $number"
  vfile=$(find "$dest" -name compcntrConfigVersion.cmake -print -quit)
  [ -n "$vfile" ] || fail "no compcntrConfigVersion.cmake installed"
  check "CMake package" "$(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")/\1/p' "$vfile")"
  pages=$(find "$dest" -path '*man/man*' -type f -name '*.[0-9]' | xargs grep -l '^\.TH' || true)
  if [ -n "$pages" ]; then
    bad=$(echo "$pages" | xargs grep -L "^\.TH .* \"compcntr $version\"" || true)
    [ -z "$bad" ] || fail "man pages without \"compcntr $version\" in .TH: $bad"
    echo "  man pages: $(echo "$pages" | wc -l) with compcntr $version"
  else
    echo "  man pages: none installed (no pandoc): not checked"
  fi
  check "debian/changelog" "$(sed -n '1s/^[^ ]* (\([^)-]*\)\(-[^)]*\)\{0,1\}).*/\1/p' "$src/debian/changelog")"
  check "CHANGELOG.md" "$(sed -n 's/^## \[\{0,1\}\([0-9][0-9.]*\)\]\{0,1\}.*/\1/p' "$src/CHANGELOG.md" | head -1)"
  echo "version: OK ($version everywhere)"
  ;;

doctest_wrap)
  p=$tmp/project
  mkdir -p "$p/subprojects"
  cp "$src/subprojects/doctest.wrap" "$p/subprojects/"
  cp -r "$src/subprojects/packagefiles" "$p/subprojects/"
  cat >"$p/meson.build" <<'M'
project('wrap_user', 'cpp', default_options: ['cpp_std=c++20'])
doctest = dependency('doctest', fallback: ['doctest', 'doctest_dep'])
test('t', executable('t', 't.cpp', dependencies: doctest))
M
  cat >"$p/t.cpp" <<'CPP'
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
TEST_CASE("the wrap's doctest works") { CHECK(6 * 7 == 42); }
CPP
  # Offline and nothing unpacked: configuring must fail, naming the wrap's archive.
  if CXX=$cxx meson setup "$p/nodl" "$p" --force-fallback-for=doctest --wrap-mode=nodownload \
       >"$tmp/nodl.log" 2>&1; then
    fail "configuring with --wrap-mode=nodownload and no archive succeeded"
  fi
  grep -qi 'doctest' "$tmp/nodl.log" || { cat "$tmp/nodl.log"; fail "the failure does not name doctest"; }
  echo "  offline, nothing unpacked: configure fails: $(grep -i 'error' "$tmp/nodl.log" | head -1)"
  # What Meson makes of the wrap once the archive is unpacked: the archive's tree (here the
  # system's header in the same place) plus our overlay build file.
  dir=$(sed -n 's/^directory = //p' "$src/subprojects/doctest.wrap")
  mkdir -p "$p/subprojects/$dir/doctest"
  cp /usr/include/doctest/doctest.h "$p/subprojects/$dir/doctest/"
  cp "$src/subprojects/packagefiles/doctest/meson.build" "$p/subprojects/$dir/"
  CXX=$cxx meson setup "$p/build" "$p" --force-fallback-for=doctest --wrap-mode=nodownload \
    >"$tmp/setup.log" 2>&1 || { cat "$tmp/setup.log"; fail "configure with the unpacked wrap failed"; }
  grep -q "doctest.*YES" "$tmp/setup.log" || { cat "$tmp/setup.log"; fail "doctest did not come from the subproject"; }
  meson test -C "$p/build" >"$tmp/test.log" 2>&1 || { cat "$tmp/test.log"; fail "the doctest case failed"; }
  echo "doctest_wrap: OK (fallback subproject $dir, overlay from subprojects/packagefiles/doctest)"
  ;;
*)
  fail "unknown mode $mode"
  ;;
esac
