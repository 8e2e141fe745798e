#!/usr/bin/env bash
# stream_table_replay_streams_check.sh BIN_DIR - bench_stream_table's
# replay (its part 2) takes only as many streams as mpbench replays: the
# default one and MPB_MAX_TRACE_STREAMS (4096) others. 4097 replay to the
# end; 4098 are refused with exit 2 before any work. Its default was 30 000,
# which mpbench's loader refused with exit 1 once parts 1 and 3 had run.
set -u
bin=$1
fails=0
# STREAMS RC WANTED UNWANTED: exits RC, its output has WANTED and no
# UNWANTED (grep patterns).
expect() {
  local out rc
  out=$(timeout 120 "$bin/bench_stream_table" 1 host:capacity=1G "$1" 1 2>&1)
  rc=$?
  if [ "$rc" -eq "$2" ] && grep -q -- "$3" <<<"$out" &&
    ! grep -q -- "$4" <<<"$out"; then
    return
  fi
  echo "stream_table_replay_streams_check: FAIL: $1 streams: exit $rc" \
    "(wanted $2), '$3' wanted, '$4' not:"
  printf '%s\n' "$out"
  fails=$((fails + 1))
}
expect 4097 0 'completed: yes' 'bad replay streams'
expect 4098 2 "bad replay streams '4098'" '^device '
if [ "$fails" -ne 0 ]; then
  exit 1
fi
echo "stream_table_replay_streams_check: ok"
