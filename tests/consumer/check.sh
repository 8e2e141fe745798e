#!/usr/bin/env bash
# check.sh CMAKE BUILD_DIR SCRATCH PROJECT_DIR CC [CFLAGS]
# Installs BUILD_DIR into SCRATCH/prefix, then builds and runs the consumer in
# PROJECT_DIR three ways: find_package + shared, find_package + static, and
# pkg-config. Any failure fails the test.
set -euo pipefail
cmake=$1 build=$2 scratch=$3 project=$4 cc=$5 flags=${6:-}
rm -rf "$scratch" && mkdir -p "$scratch"
prefix="$scratch/prefix"
"$cmake" --install "$build" --prefix "$prefix" >"$scratch/install.log"

for kind in shared static; do
  "$cmake" -S "$project" -B "$scratch/cmake-$kind" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="$flags" \
    -DCONSUMER_STATIC=$([ $kind = static ] && echo ON || echo OFF) >"$scratch/cfg-$kind.log"
  "$cmake" --build "$scratch/cmake-$kind" >"$scratch/build-$kind.log"
  LD_LIBRARY_PATH="$prefix/lib:${LD_LIBRARY_PATH:-}" "$scratch/cmake-$kind/consumer"
done

libdir=$(dirname "$(find "$prefix" -name mempool.pc | head -n1)")
export PKG_CONFIG_PATH="$libdir"
# shellcheck disable=SC2046
"$cc" $flags -std=c11 "$project/main.c" -o "$scratch/consumer-pc" \
  $(pkg-config --cflags --libs mempool)
LD_LIBRARY_PATH="$prefix/lib:${LD_LIBRARY_PATH:-}" "$scratch/consumer-pc"
echo "consumer: find_package (shared, static) and pkg-config builds all ran"
