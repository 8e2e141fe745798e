#!/bin/sh
# compare_builds.sh OLD_BUILD NEW_BUILD [PAIRS] - the three performance
# figures of two builds side by side, in one run:
#   1. fragmentation: peak reserved / peak live of the `pool` allocator on
#      every built-in workload and trace (mpbench, default config, no
#      capacity search), old and new per row, and rows that got worse;
#      then with streams that run behind the host (mpbench --stream-work
#      STREAM_WORK_US, default 20; three runs per build): the spread of each
#      row whose figure moved with the timing in either build;
#   2. instructions per free+alloc pair at 100 and 10 000 live blocks
#      (bench/micro/count_pairs.sh: callgrind, the same on a busy machine);
#   3. threads: bench_pool_threads' speed-ups at 2, 4 and 8 threads, the two
#      builds run alternately twice, each run the median of five paired
#      repeats (a build older than the repeats argument runs once; wall-clock
#      figures: meaningful only on a quiet machine, which the script cannot
#      check; it prints the load).
# Both builds must be Release builds of the same tree layout (cmake
# -DCMAKE_BUILD_TYPE=Release); an old one comes from `git worktree add`.
# results.csv is read as CSV by tools/pool_ratios.py (python3), so that a
# trace named "a,b.csv" is one row.
set -eu
old=${1:?usage: compare_builds.sh OLD_BUILD NEW_BUILD [PAIRS]}
new=${2:?usage: compare_builds.sh OLD_BUILD NEW_BUILD [PAIRS]}
pairs=${3:-200000}
here=$(cd "$(dirname "$0")" && pwd)
for b in "$old" "$new"; do
  for x in mpbench bench_pool_pairs bench_pool_threads; do
    [ -x "$b/bench/$x" ] || {
      echo "compare_builds: no $b/bench/$x (build it first)" >&2
      exit 2
    }
  done
done
command -v python3 >/dev/null || {
  echo "compare_builds: needs python3 (results.csv is read with its csv module)" >&2
  exit 2
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "## 1. Fragmentation: peak reserved / peak live, allocator pool"
for side in old new; do
  eval b=\$$side
  "$b/bench/mpbench" run --allocator pool --no-capacity --out "$work/$side" \
    >"$work/$side.log" 2>&1 || {
    echo "compare_builds: mpbench failed in $b:" >&2
    tail -5 "$work/$side.log" >&2
    exit 1
  }
done
# results.csv read as CSV: a trace named "a,b.csv" is one quoted field.
python3 "$here/tools/pool_ratios.py" worse "$work/old/results.csv" \
  "$work/new/results.csv"

echo
us=${STREAM_WORK_US:-20}
echo "## 1b. With streams $us us behind the host (mpbench --stream-work $us), three runs each"
for side in old new; do
  eval b=\$$side
  for run in 1 2 3; do
    "$b/bench/mpbench" run --allocator pool --no-capacity --stream-work "$us" \
      --out "$work/$side.sw$run" >"$work/$side.sw$run.log" 2>&1 || {
      echo "compare_builds: mpbench --stream-work failed in $b:" >&2
      tail -5 "$work/$side.sw$run.log" >&2
      exit 1
    }
  done
done
# Per row and build: the caught-up figure (section 1) and the lowest and
# highest of the three runs; rows whose figure never moved are left out.
python3 "$here/tools/pool_ratios.py" spread "$work/old/results.csv" \
  "$work/old.sw1/results.csv" "$work/old.sw2/results.csv" \
  "$work/old.sw3/results.csv" "$work/new/results.csv" \
  "$work/new.sw1/results.csv" "$work/new.sw2/results.csv" \
  "$work/new.sw3/results.csv"

echo
echo "## 2. Instructions per pair (callgrind)"
for side in old new; do
  eval b=\$$side
  "$here/micro/count_pairs.sh" "$b" "$pairs" | awk -v s="$side" \
    '$1 == "pool" { printf "%-4s live %6s: %8s instr/pair, %8s ns/pair\n", s, $2, $3, $4 }'
done

echo
echo "## 3. Threads: speed-up over one thread (load: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo ?))"
for run in 1 2; do
  for side in old new; do
    eval b=\$$side
    "$b/bench/bench_pool_threads" $((pairs + pairs / 2)) 100 8 5 |
      awk -v s="$side" -v r="$run" '
        $1 == "pool" && $2 == "shared" { sh[$3] = $5 }
        $1 == "pool" && $2 == "arenas" { ar[$3] = $5 }
        $1 == "pool" && $2 == "shared" && $3 == 1 { one = $4 }
        END { printf "run %s %-4s shared 2/4/8: %s %s %s  arenas 2/4/8: %s %s %s  one thread %s pairs/s\n",
              r, s, sh[2], sh[4], sh[8], ar[2], ar[4], ar[8], one }'
  done
done
