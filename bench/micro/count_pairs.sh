#!/bin/sh
# count_pairs.sh [BUILD_DIR] [PAIRS] [DEVICE] - instructions per free+alloc pair
# (valgrind's callgrind: the same count on a busy machine as on an idle
# one) beside ns per pair (a plain run), for the pool and the jemalloc
# arena of bench_pool_pairs, and for the host (page-locked) pool of
# bench_host_pairs on the same plan (rows "hostpool"), at 100 and 10 000
# live blocks. Only the timed phase is counted (both mark it with
# callgrind's client requests); the plan and the set-up are not. The host
# pool's counts move between runs by a few hundred instructions a pair:
# each free records a marker on its stream, which the device's stream
# thread reaches at its own pace, and a request reuses a block only once
# it has (mempool/host_pool.h); callgrind counts that thread too.
#
# DEVICE (default host:capacity=28G) must be one whose virtual range
# valgrind can reserve: the pool reserves twice its cap, and valgrind 3.19
# reserves at most about 60 GiB, so host:capacity=32G (a 64 GiB range, the
# default until 2026-11-30 night; the range doubled on 2026-11-29) and the
# 4 TiB of bench_pool_pairs' own default fell back to plain segments, a
# different path from a native run's (every free on plain segments looks
# its pointer's arena up under a lock). 28 GiB (a 56 GiB range) holds the
# 10 000-block live set (about 17 GiB). bench_pool_pairs names the pool's
# segments ("range": virtual or plain); a count on plain segments is
# refused (exit 3), as it would not be the native path's.
#
# Then the remote frees (bench_pool_pairs' mode "remote"): thread A
# allocates PAIRS blocks of 4 to 7 KiB, thread B, with an arena of its own,
# frees them (the pool with arenas=2: each free misses B's arena and is
# forwarded to A's); instructions and ns per free, in rows that start with
# "remote", after the pairs' rows (which are unchanged), on the same
# DEVICE; a count on plain segments is refused (exit 3) here too. A build
# whose bench_pool_pairs has no mode "remote" (exit 2) prints no remote rows.
set -eu
build=${1:-build-release}
pairs=${2:-200000}
dev=${3:-host:capacity=28G}
bin=$build/bench/bench_pool_pairs
[ -x "$bin" ] || { echo "count_pairs: no $bin (build it first)" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "count_pairs: needs valgrind" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$bin" "$pairs" "$dev" >"$work/ns.txt"
valgrind --tool=callgrind --instr-atstart=no \
  --callgrind-out-file="$work/cg.%p" "$bin" "$pairs" "$dev" >"$work/vg.out" 2>"$work/vg.txt"
# A build that names the segments (a "range" column): the pool's rows under
# valgrind must be on the virtual range. Older builds print no such column.
if grep -q ' range$' "$work/vg.out" && grep -q '^pool .* plain$' "$work/vg.out"; then
  echo "count_pairs: under valgrind the pool ran on plain segments (its virtual range" >&2
  echo "could not be reserved on $dev): not a native run's path; use a smaller capacity" >&2
  exit 3
fi
# The host (page-locked) pool on the same plan: bench_host_pairs' rows
# ("hostpool", on plain segments, its native path) after the pool's and
# the jemalloc arena's, its counts as cg.host.* and its ns in ns.txt, so
# the loop below prints them. A build without it prints none.
hbin=$build/bench/bench_host_pairs
if [ -x "$hbin" ]; then
  "$hbin" "$pairs" "$dev" >>"$work/ns.txt"
  valgrind --tool=callgrind --instr-atstart=no \
    --callgrind-out-file="$work/cg.host.%p" "$hbin" "$pairs" "$dev" \
    >"$work/hvg.out" 2>"$work/hvg.txt"
else
  echo "count_pairs: no $hbin: no hostpool rows" >&2
fi
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

rc=0
"$bin" "$pairs" "$dev" remote >"$work/rns.txt" 2>"$work/rns.err" || rc=$?
if [ "$rc" -eq 2 ]; then
  echo "count_pairs: $bin has no mode remote: no remote rows" >&2
  exit 0
elif [ "$rc" -ne 0 ]; then
  cat "$work/rns.err" >&2
  exit 1
fi
valgrind --tool=callgrind --instr-atstart=no \
  --callgrind-out-file="$work/rcg.%p" "$bin" "$pairs" "$dev" remote \
  >"$work/rvg.out" 2>"$work/rvg.txt"
if grep -q '^remote  *pool .* plain ' "$work/rvg.out"; then
  echo "count_pairs: under valgrind the remote frees' pool ran on plain segments" >&2
  echo "(its arenas' ranges could not be reserved on $dev): use a smaller capacity" >&2
  exit 3
fi
printf '%-10s %-10s %8s %14s %10s\n' remote allocator blocks instr/free ns/free
for f in "$work"/rcg.*; do
  what=$(sed -n 's/^desc: Trigger: Client Request: //p' "$f")
  [ -n "$what" ] || continue
  total=$(sed -n 's/^totals: //p' "$f")
  set -- $what
  ns=$(awk -v a="$1" '$1 == "remote" && $2 == a { print $4; exit }' "$work/rns.txt")
  awk -v a="$1" -v l="$2" -v t="${total%% *}" -v ns="${ns:--}" \
    'BEGIN { printf "%-10s %-10s %8s %14.1f %10s\n", "remote", a, l, t / l, ns }'
done
