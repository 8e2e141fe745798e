#!/usr/bin/env bash
# pool_traces_reads_as_mpbench_check.sh BIN - bench_pool_traces reads its
# traces as mpbench does (mpb_trace_load), not with a parser of its own:
#  - a malformed row is refused with the file and line, exit 1, before any
#    table row (its sscanf took "-8" as a size of 2^64 - 8 and went on);
#  - a free of size 0 (a log that does not know the size) frees the
#    allocation's bytes (it freed 0: peak live was overstated);
#  - an allocation of a live address frees the block there first (the map
#    entry was overwritten: the block leaked and its bytes stayed live).
# Under a sanitizer build a leak on the error path fails the exit status.
set -u
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fails=0
fail() {
  echo "pool_traces_reads_as_mpbench_check: FAIL: $*"
  fails=$((fails + 1))
}
header='Thread,Time,Action,Pointer,Size,Stream'
row() { # ACTION POINTER SIZE
  printf '1,00:00:00.000001,%s,%s,%s,0\n' "$1" "$2" "$3"
}
# A trace alone in a folder of its own: NAME, then its rows on stdin.
trace() {
  mkdir -p "$dir/$1"
  { echo "$header" && cat; } >"$dir/$1/$1.csv"
}
# The peak live bytes bench_pool_traces prints for the trace NAME.
peak_live() {
  local out rc
  out=$(timeout 60 "$bin" "$dir/$1" 2>&1)
  rc=$?
  if [ "$rc" -ne 0 ]; then
    fail "$1 exited $rc: $out"
    return
  fi
  printf '%s\n' "$out" | awk -v n="$1.csv" '$1 == n { print $3 }'
}

# A malformed row: its file and line, exit 1, no table row.
{ row allocate 0x1000 4096 && row allocate 0x2000 -8; } | trace bad
out=$(timeout 60 "$bin" "$dir/bad" 2>&1)
rc=$?
[ "$rc" -eq 1 ] || fail "a size of -8 exited $rc, not 1: $out"
printf '%s\n' "$out" | grep -q "bad.csv:3: bad size '-8'" ||
  fail "a size of -8 is not refused naming bad.csv:3: $out"
printf '%s\n' "$out" | grep -q '^bad\.csv ' &&
  fail "a malformed trace has a table row: $out"

# A free of size 0 frees its allocation's 4096 bytes: peak 8192.
{
  row allocate 0x1000 4096 && row allocate 0x2000 4096 &&
    row free 0x1000 0 && row allocate 0x3000 4096
} | trace zero_free
got=$(peak_live zero_free)
[ "$got" = 8192 ] || fail "size-0 free: peak live '$got', not 8192"

# An allocation of a live address: the block there is freed first.
{
  row allocate 0x1000 4096 && row allocate 0x1000 4096 &&
    row free 0x1000 4096
} | trace realloc
got=$(peak_live realloc)
[ "$got" = 4096 ] || fail "live address again: peak live '$got', not 4096"

if [ "$fails" -ne 0 ]; then
  exit 1
fi
echo "pool_traces_reads_as_mpbench_check: ok"
