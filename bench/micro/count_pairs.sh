#!/bin/sh
# count_pairs.sh [BUILD_DIR] [PAIRS] [DEVICE] - instructions per free+alloc pair
# (valgrind's callgrind: the same count on a busy machine as on an idle
# one) beside ns per pair (a plain run), for the pool and the jemalloc
# arena of bench_pool_pairs, at 100 and 10 000 live blocks. Only the timed
# phase is counted (bench_pool_pairs marks it with callgrind's client
# requests); the plan and the set-up are not.
#
# DEVICE (default host:capacity=32G) must be one whose virtual range
# valgrind can reserve: under valgrind the 4 TiB range of bench_pool_pairs'
# own default (host:capacity=64T) cannot be reserved, so the pool fell back
# to plain segments and the count was not that of a native run (which has
# the range). 32 GiB holds the 10 000-block live set (about 17 GiB).
set -eu
build=${1:-build-release}
pairs=${2:-200000}
dev=${3:-host:capacity=32G}
bin=$build/bench/bench_pool_pairs
[ -x "$bin" ] || { echo "count_pairs: no $bin (build it first)" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "count_pairs: needs valgrind" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$bin" "$pairs" "$dev" >"$work/ns.txt"
valgrind --tool=callgrind --instr-atstart=no \
  --callgrind-out-file="$work/cg.%p" "$bin" "$pairs" "$dev" >/dev/null 2>"$work/vg.txt"
printf '%-10s %8s %14s %10s\n' allocator live instr/pair ns/pair
for f in "$work"/cg.*; do
  what=$(sed -n 's/^desc: Trigger: Client Request: //p' "$f")
  [ -n "$what" ] || continue
  # "totals" is what was counted between the zero and the dump ("summary"
  # stays 0 when instrumentation starts off).
  total=$(sed -n 's/^totals: //p' "$f")
  set -- $what
  ns=$(awk -v a="$1" -v l="$2" '$1 == a && $2 == l { print $3; exit }' "$work/ns.txt")
  awk -v a="$1" -v l="$2" -v t="${total%% *}" -v n="$pairs" -v ns="${ns:--}" \
    'BEGIN { printf "%-10s %8s %14.1f %10s\n", a, l, t / n, ns }'
done
