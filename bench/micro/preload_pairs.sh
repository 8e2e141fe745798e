#!/bin/sh
# preload_pairs.sh [BUILD_DIR] [PAIRS] - the free+alloc pairs of an
# unmodified CUDA program (bench_preload_pairs: cuMemFree / cuMemAlloc and
# cudaFree / cudaMalloc, 100 live blocks of bench_pool_pairs' plan), run
# without the shim (the fake driver, tests/fakecuda, and the stand-in
# runtime serve them) and with LD_PRELOAD=libmempool_preload.so
# (MEMPOOL_DEVICE, default cuda: the shim's pool on the fake driver):
# instructions per pair (valgrind's callgrind, the timed phase only) beside
# ns per pair (a plain run), both ways in one table.
#
#   cmake --build build-release --target bench_preload_pairs
#   bench/micro/preload_pairs.sh build-release 200000
set -eu
build=${1:-build-release}
pairs=${2:-200000}
bin=$build/bench/bench_preload_pairs
shim=$build/src/preload/libmempool_preload.so
[ -x "$bin" ] || { echo "preload_pairs: no $bin (build it first)" >&2; exit 2; }
[ -f "$shim" ] || { echo "preload_pairs: no $shim (build it first)" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "preload_pairs: needs valgrind" >&2; exit 2; }
shim=$(cd "$(dirname "$shim")" && pwd)/$(basename "$shim")
device=${MEMPOOL_DEVICE:-cuda}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# run TAG: the plain run's rows in $work/TAG.ns, the counted run's
# dumps as $work/TAG.cg.*; "on" runs under the shim.
run() {
  tag=$1
  set --
  if [ "$tag" = on ]; then
    set -- env LD_PRELOAD="$shim" MEMPOOL_DEVICE="$device" \
      FAKECUDA_CALL_REPORT=1 "$@"
  else
    set -- env LD_PRELOAD= "$@"
  fi
  "$@" "$bin" "$pairs" >"$work/$tag.ns" 2>"$work/$tag.err" ||
    { cat "$work/$tag.err" >&2; exit 1; }
  # env runs under valgrind too (--trace-children: the program it starts).
  valgrind --tool=callgrind --instr-atstart=no --trace-children=yes \
    --callgrind-out-file="$work/$tag.cg.%p" "$@" "$bin" "$pairs" \
    >"$work/$tag.vg.out" 2>"$work/$tag.vg.txt" ||
    { cat "$work/$tag.vg.txt" >&2; exit 1; }
}
run off
run on
# The shim's pool on the fake driver grows in its virtual range (one
# cuMemAddressReserve) natively; one that could not reserve it under
# valgrind would run another path (plain segments): refused, as
# count_pairs.sh refuses it. The host device (MEMPOOL_DEVICE=host) asks the
# driver nothing.
if [ "$device" != host ] &&
  ! grep -q '^fakecuda: calls cuMemAddressReserve [1-9]' "$work/on.vg.txt"; then
  echo "preload_pairs: under valgrind the shim's pool reserved no virtual range," >&2
  echo "not a native run's path; the fake driver's memory calls:" >&2
  grep '^fakecuda: calls cuMem' "$work/on.vg.txt" >&2 || true
  exit 3
fi
printf '%-8s %-8s %-28s %14s %10s\n' api preload "served by" instr/pair ns/pair
for tag in off on; do
  for f in "$work/$tag".cg.*; do
    what=$(sed -n 's/^desc: Trigger: Client Request: //p' "$f")
    [ -n "$what" ] || continue
    total=$(sed -n 's/^totals: //p' "$f")
    set -- $what
    awk -v a="$1" -v tag="$tag" -v t="${total%% *}" -v n="$pairs" '
      $1 == a { by = $2; ns = $3 }
      END { printf "%-8s %-8s %-28s %14.1f %10s\n", a, tag, by, t / n, ns }' \
      "$work/$tag.ns"
  done
done
