#!/usr/bin/env bash
# check.sh CMAKE BUILD_DIR SCRATCH PROJECT_DIR CC [CFLAGS]
# Installs BUILD_DIR into SCRATCH/prefix and checks what lands there: the
# headers, libmempool.so with its SONAME and version links, libmempool.a,
# libmempool_preload.so, the CMake package and mempool.pc; that the
# libraries define no global symbol outside mp_/MP_ (and libmempool.so
# exports none of the internal mp__ ones). Then it builds and runs the
# consumer in PROJECT_DIR: find_package with the shared and the static
# library, pkg-config, pkg-config --static against libmempool.a, and, with
# $MEMPOOL_CONSUMER_CXX (a C++ compiler), main.cpp, which includes every
# installed header; and once more from the prefix moved elsewhere
# (relocatable). Any failure fails the test.
set -euo pipefail
cmake=$1 build=$2 scratch=$3 project=$4 cc=$5 flags=${6:-}
cxx=${MEMPOOL_CONSUMER_CXX:-}
fail() { echo "consumer: $*" >&2; exit 1; }
rm -rf "$scratch" && mkdir -p "$scratch"
prefix="$scratch/prefix"
"$cmake" --install "$build" --prefix "$prefix" >"$scratch/install.log"

# ---- what lands where ---------------------------------------------------
pc=$(find "$prefix" -name mempool.pc)
[ -n "$pc" ] || fail "no mempool.pc installed"
libdir=$(dirname "$(dirname "$pc")")
rel_libdir=${libdir#"$prefix"/}
export PKG_CONFIG_PATH="$libdir/pkgconfig"
version=$(pkg-config --modversion mempool)
major=${version%%.*}
for f in include/mempool/mempool.h include/mempool/torch_hooks.hpp \
  "$rel_libdir/libmempool.a" "$rel_libdir/libmempool_preload.so" \
  "$rel_libdir/libmempool.so.$version" \
  "$rel_libdir/cmake/mempool/mempoolConfig.cmake" \
  "$rel_libdir/cmake/mempool/mempoolConfigVersion.cmake"; do
  [ -f "$prefix/$f" ] && [ ! -L "$prefix/$f" ] || fail "not installed as a file: $f"
done
[ "$(readlink "$libdir/libmempool.so")" = "libmempool.so.$major" ] ||
  fail "libmempool.so does not link to libmempool.so.$major"
[ "$(readlink "$libdir/libmempool.so.$major")" = "libmempool.so.$version" ] ||
  fail "libmempool.so.$major does not link to libmempool.so.$version"
soname=$(readelf -d "$libdir/libmempool.so.$version" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libmempool.so.$major" ] || fail "SONAME is '$soname', not libmempool.so.$major"
if readelf -d "$libdir/libmempool.so.$version" "$libdir/libmempool_preload.so" |
  grep -E '\((RPATH|RUNPATH)\)'; then
  fail "an installed library keeps a run path"
fi
hdr=$(sed -n 's/^#define MEMPOOL_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' \
  "$prefix/include/mempool/mempool.h" | paste -sd.)
[ "$hdr" = "$version" ] || fail "mempool.h says $hdr, mempool.pc $version"

# ---- exported symbols: mp_ and MP_ only ---------------------------------
# (__odr_asan.NAME: ASan's companion of the global NAME, in sanitized builds)
ok='^(__odr_asan\.)?(mp_|MP_)'
bad=$(nm -D --defined-only "$libdir/libmempool.so.$version" | awk '{print $NF}' |
  grep -Ev "$ok" || true)
[ -z "$bad" ] || fail "libmempool.so exports names outside mp_/MP_: $bad"
bad=$(nm -D --defined-only "$libdir/libmempool.so.$version" | awk '{print $NF}' |
  grep '^mp__' || true)
[ -z "$bad" ] || fail "libmempool.so exports internal names: $bad"
bad=$(nm -g --defined-only "$libdir/libmempool.a" | awk 'NF == 3 {print $3}' |
  grep -Ev "$ok" || true)
[ -z "$bad" ] || fail "libmempool.a defines global names outside mp_/MP_: $bad"

# ---- the consumers ------------------------------------------------------
have_cxx=OFF
if [ -n "$cxx" ]; then
  have_cxx=ON
  # The C++ consumer includes every installed header.
  for h in "$prefix"/include/mempool/*; do
    grep -q "^#include <mempool/${h##*/}>" "$project/main.cpp" ||
      fail "main.cpp does not include mempool/${h##*/}"
  done
fi

# consumers PREFIX TAG: builds and runs every consumer against PREFIX.
consumers() {
  local p=$1 tag=$2 kind b
  local ld="$p/$rel_libdir"
  for kind in shared static; do
    b="$scratch/cmake-$kind-$tag"
    "$cmake" -S "$project" -B "$b" -DCMAKE_PREFIX_PATH="$p" \
      -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="$flags" \
      -DCMAKE_CXX_COMPILER="${cxx:-c++}" -DCMAKE_CXX_FLAGS="$flags" \
      -DCONSUMER_CXX=$have_cxx \
      -DCONSUMER_STATIC=$([ $kind = static ] && echo ON || echo OFF) >"$b.cfg.log"
    # The package found is the one in PREFIX, not one installed elsewhere.
    grep -qx "mempool_DIR:PATH=$ld/cmake/mempool" "$b/CMakeCache.txt" ||
      fail "$tag: find_package took $(grep mempool_DIR "$b/CMakeCache.txt")"
    "$cmake" --build "$b" >"$b.build.log" || { cat "$b.build.log"; fail "$tag: $kind build"; }
    for exe in consumer consumer_cxx; do
      [ -x "$b/$exe" ] || continue
      if [ $kind = static ]; then
        ! readelf -d "$b/$exe" | grep -q 'libmempool' || fail "$tag: static $exe needs libmempool.so"
      fi
      env -u LD_LIBRARY_PATH "$b/$exe"
    done
  done
  [ -x "$scratch/cmake-shared-$tag/consumer_cxx" ] || [ $have_cxx = OFF ] ||
    fail "$tag: no C++ consumer built"

  export PKG_CONFIG_PATH="$ld/pkgconfig"
  [ "$(pkg-config --variable=libdir mempool)" -ef "$ld" ] ||
    fail "$tag: mempool.pc's libdir is not $ld"
  local cflags libs
  cflags=$(pkg-config --cflags mempool) && libs=$(pkg-config --libs mempool) ||
    fail "$tag: pkg-config"
  # shellcheck disable=SC2086
  "$cc" $flags -std=c11 "$project/main.c" -o "$scratch/consumer-pc-$tag" $cflags $libs
  LD_LIBRARY_PATH="$ld" "$scratch/consumer-pc-$tag"
  # Static: libmempool.a and its Libs.private, nothing else.
  libs=$(pkg-config --static --libs mempool) || fail "$tag: pkg-config --static"
  libs=${libs//-lmempool/-l:libmempool.a}
  # shellcheck disable=SC2086
  "$cc" $flags -std=c11 "$project/main.c" -o "$scratch/consumer-pc-static-$tag" $cflags $libs
  ! readelf -d "$scratch/consumer-pc-static-$tag" | grep -q libmempool ||
    fail "$tag: pkg-config --static consumer needs libmempool.so"
  env -u LD_LIBRARY_PATH "$scratch/consumer-pc-static-$tag"
}

consumers "$prefix" installed
# Relocatable: the same prefix moved elsewhere, the old place gone.
mv "$prefix" "$scratch/moved"
consumers "$scratch/moved" moved
echo "consumer: installed layout, symbols, find_package (shared, static, C++ $have_cxx)," \
  "pkg-config (shared, static), and from a moved prefix: all ran"
