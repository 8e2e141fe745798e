#!/usr/bin/env bash
# pool_handoff_failed_rows_check.sh BIN_DIR - a bench_pool_handoff row whose
# run could not allocate its plan is marked FAILED (it showed the partial
# run's figures as the row's, or -nan where nothing was allocated), and the
# command exits 1; a run that fits has no such mark and exits 0.
set -u
run=$1/bench_pool_handoff
status=0
# 1 MiB: the first rows' activations do not fit; 64 KiB: none does.
for cap in 1M 64K; do
  rows=$(timeout 60 "$run" 1 2 "host:capacity=$cap" 2>/dev/null)
  rc=$?
  marked=$(grep -c '^[(a].* FAILED$' <<<"$rows")
  if [ "$rc" -ne 1 ] || [ "$marked" -ne 3 ] || grep -qi 'nan' <<<"$rows"; then
    printf 'pool_handoff_failed_rows_check: FAIL: capacity %s, exit %s, %s' \
      "$cap" "$rc" "$marked"
    printf ' of 3 rows FAILED:\n%s\n' "$rows"
    status=1
  fi
done
rows=$(timeout 60 "$run" 1 2 host:capacity=1G 2>&1)
rc=$?
if [ "$rc" -ne 0 ] || grep -q 'FAILED' <<<"$rows"; then
  printf 'pool_handoff_failed_rows_check: FAIL: capacity 1G, exit %s:\n%s\n' \
    "$rc" "$rows"
  status=1
fi
[ "$status" -eq 0 ] && echo "pool_handoff_failed_rows_check: ok"
exit "$status"
