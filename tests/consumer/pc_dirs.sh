#!/usr/bin/env bash
# pc_dirs.sh CMAKE SOURCE_DIR SCRATCH CC
# mempool.pc as configured for install directories other than lib and
# include: a relative one a level deeper (Debian's lib/x86_64-linux-gnu)
# keeps the prefix found from the file's place, and absolute ones (as some
# packagers pass) are written as they are. Configures SOURCE_DIR only (no
# build) and reads the mempool.pc it makes with pkg-config.
set -euo pipefail
cmake=$1 src=$2 scratch=$3 cc=$4
fail() { echo "pc_dirs: $*" >&2; exit 1; }
rm -rf "$scratch" && mkdir -p "$scratch"

# configure NAME ARGS...: configures SOURCE_DIR into SCRATCH/NAME.
configure() {
  local name=$1
  shift
  "$cmake" -S "$src" -B "$scratch/$name" -DCMAKE_C_COMPILER="$cc" -DMEMPOOL_CUDA=OFF \
    -DMEMPOOL_BUILD_TESTS=OFF -DMEMPOOL_BUILD_BENCH=OFF "$@" >"$scratch/$name.log" ||
    fail "$name: configure failed (see $scratch/$name.log)"
}
# expect PC_DIR VARIABLE VALUE
expect() {
  local got
  got=$(PKG_CONFIG_PATH=$1 pkg-config --variable="$2" mempool) || fail "pkg-config in $1"
  [ "$got" = "$3" ] || fail "$1: $2 is '$got', not '$3'"
}

configure multiarch -DCMAKE_INSTALL_LIBDIR=lib/x86_64-linux-gnu
p="$scratch/p"
mkdir -p "$p/lib/x86_64-linux-gnu/pkgconfig" "$p/include"
cp "$scratch/multiarch/mempool.pc" "$p/lib/x86_64-linux-gnu/pkgconfig/"
pcdir="$p/lib/x86_64-linux-gnu/pkgconfig"
[ "$(PKG_CONFIG_PATH=$pcdir pkg-config --variable=prefix mempool)" -ef "$p" ] ||
  fail "multiarch: prefix is not $p"
[ "$(PKG_CONFIG_PATH=$pcdir pkg-config --variable=libdir mempool)" -ef "$p/lib/x86_64-linux-gnu" ] ||
  fail "multiarch: libdir is not $p/lib/x86_64-linux-gnu"

configure absolute -DCMAKE_INSTALL_PREFIX=/opt/mp \
  -DCMAKE_INSTALL_LIBDIR=/opt/mp-lib/lib -DCMAKE_INSTALL_INCLUDEDIR=/opt/mp-dev/include
expect "$scratch/absolute" libdir /opt/mp-lib/lib
expect "$scratch/absolute" includedir /opt/mp-dev/include
cflags=$(PKG_CONFIG_PATH="$scratch/absolute" pkg-config --cflags mempool | xargs)
[ "$cflags" = "-I/opt/mp-dev/include" ] || fail "absolute: Cflags are '$cflags'"

configure absinclude -DCMAKE_INSTALL_INCLUDEDIR=/opt/mp-dev/include
mkdir -p "$scratch/q/lib/pkgconfig"
cp "$scratch/absinclude/mempool.pc" "$scratch/q/lib/pkgconfig/"
expect "$scratch/q/lib/pkgconfig" includedir /opt/mp-dev/include
[ "$(PKG_CONFIG_PATH=$scratch/q/lib/pkgconfig pkg-config --variable=libdir mempool)" -ef "$scratch/q/lib" ] ||
  fail "absinclude: libdir is not $scratch/q/lib"
echo "pc_dirs: mempool.pc right for lib/x86_64-linux-gnu and for absolute directories"
