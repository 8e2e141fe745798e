#!/usr/bin/env bash
# compare_builds_quoted_names_check.sh COMPARE_BUILDS - bench/compare_builds.sh
# reads results.csv as CSV: a workload or trace name with a comma or a
# quote in it is one quoted field ("a,b"), which a split on commas cut into
# several, so that its row was lost from both tables (its allocator column
# read "b") or another column was read as its ratio. Two fake builds whose
# mpbench writes such names (their other benchmarks do nothing) must give
# each row whole, with its figures, in sections 1 and 1b.
set -u
script=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# fake_build DIR BASE_RATIO RUN_RATIOS...: a build whose mpbench writes
# BASE_RATIO for the row "trace,with,commas" without --stream-work and the
# next of RUN_RATIOS with it.
fake_build() {
  local dir=$1 base=$2
  shift 2
  mkdir -p "$dir/bench"
  printf '%s\n' "$@" >"$dir/runs"
  cat >"$dir/bench/mpbench" <<SH
#!/bin/sh
out= ratio=$base
while [ \$# -gt 0 ]; do
  case "\$1" in
  --out) out=\$2; shift ;;
  --stream-work) ratio=\$(head -1 "$dir/runs"); sed -i 1d "$dir/runs" ;;
  esac
  shift
done
mkdir -p "\$out"
cat >"\$out/results.csv" <<CSV
workload,allocator,device,completed,events,peak_live_bytes,peak_reserved_bytes,ratio,error
cnn,pool,host,1,10,100,104,1.039,
"trace,with,commas",pool,host,1,10,100,110,\$ratio,"a message, with a comma"
"trace,with,commas",direct,host,1,10,100,200,2.5,
"say ""hi""|x",pool,host,1,10,100,130,1.3,
CSV
SH
  printf '#!/bin/sh\nexit 0\n' >"$dir/bench/bench_pool_pairs"
  cp "$dir/bench/bench_pool_pairs" "$dir/bench/bench_pool_threads"
  chmod +x "$dir/bench/mpbench" "$dir/bench/bench_pool_pairs" \
    "$dir/bench/bench_pool_threads"
}
fake_build "$work/old" 1.1 1.1 1.15 1.1
fake_build "$work/new" 1.2 1.2 1.25 1.3
# No callgrind: section 2 (count_pairs.sh) has nothing to count.
mkdir "$work/path"
printf '#!/bin/sh\nexit 1\n' >"$work/path/valgrind"
chmod +x "$work/path/valgrind"
PATH="$work/path:$PATH" timeout 120 "$script" "$work/old" "$work/new" 10 \
  >"$work/out.txt" 2>"$work/err.txt"
rc=$?
fails=0
if [ "$rc" -ne 0 ]; then
  echo "compare_builds_quoted_names_check: FAIL: exit $rc"
  cat "$work/err.txt"
  fails=1
fi
while IFS= read -r line; do
  if ! grep -qxF -- "$line" "$work/out.txt"; then
    echo "compare_builds_quoted_names_check: FAIL: no line '$line'"
    fails=1
  fi
done <<'WANT'
| cnn | 1.039 | 1.039 |
| trace,with,commas | 1.1 | 1.2 (worse) |
| say "hi"\|x | 1.3 | 1.3 |
1 of 3 rows worse
| trace,with,commas | 1.100, 1.100 to 1.150 | 1.200, 1.200 to 1.300 |
1 of 3 rows moved with the stream timing
WANT
if [ "$fails" -ne 0 ]; then
  echo "--- its output:"
  cat "$work/out.txt"
  exit 1
fi
echo "compare_builds_quoted_names_check: ok"
