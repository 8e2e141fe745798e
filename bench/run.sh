#!/usr/bin/env bash
# bench/run.sh - the README's main command: the fragmentation benchmark.
#   bench/run.sh [OUT_DIR] [mpbench run options...]
# Installs what is missing (Debian packages: cmake gcc make pkg-config
# libjemalloc-dev gnuplot-nox libcriterion-dev; through sudo when not root),
# configures a Release build in build-bench/, builds mpbench, and runs the
# full suite (every built-in workload and every trace in ../shared/traces,
# through every allocator) with `mpbench run --out OUT_DIR` (default: out/
# in the repository). Without a GPU it runs on the emulated host device.
# Options after OUT_DIR go to `mpbench run` (see build-bench/bench/mpbench
# --help), e.g. bench/run.sh out --allocator pool --no-capacity; --out DIR
# among them is taken as OUT_DIR.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

out="$root/out"
if [ $# -gt 0 ]; then
  case "$1" in
  -h | --help)
    sed -n '2,12p' "$0"
    exit 0
    ;;
  -*) ;;
  *) out="$1"; outs=1; shift ;;
  esac
fi
# An --out among the options names the folder too (passed on as well, it
# made mpbench refuse "--out given twice"); a second folder is refused.
args=()
outs=${outs:-0}
while [ $# -gt 0 ]; do
  case "$1" in
  --out)
    [ $# -gt 1 ] || { echo "bench/run.sh: --out needs a folder" >&2; exit 2; }
    out="$2"; outs=$((outs + 1)); shift 2 ;;
  --out=*) out="${1#--out=}"; outs=$((outs + 1)); shift ;;
  *) args+=("$1"); shift ;;
  esac
done
if [ "$outs" -gt 1 ]; then
  echo "bench/run.sh: the output folder is given twice" >&2
  exit 2
fi
set -- ${args[@]+"${args[@]}"}

# shellcheck source=../cmake/deps.sh
. "$root/cmake/deps.sh"
mempool_deps gnuplot-nox

build="$root/build-bench"
jobs=$(nproc 2>/dev/null || echo 2)
start=$(date +%s)
# Warnings are not errors here: this builds a tool to run, and a newer
# compiler's new warning must not stop the benchmark (CI builds with -Werror).
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release \
  -DMEMPOOL_BUILD_TESTS=OFF -DMEMPOOL_BUILD_BENCH=ON -DMEMPOOL_WERROR=OFF \
  >/dev/null
cmake --build "$build" -j "$jobs" --target mpbench >/dev/null
"$build/bench/mpbench" run --out "$out" "$@"
echo "bench/run.sh: done in $(($(date +%s) - start)) s; results in $out" \
  "(results.md, results.json, results.csv, *.png)"
