#!/usr/bin/env bash
# micro_args_check.sh BIN_DIR - the micro benchmarks (bench/micro/) refuse
# counts that are no plain decimal in their range, and modes they do not
# have, with exit 2 before any work: strtoull/atoi took "-5" (2^64 - 5: a
# plan no malloc holds, or whose size wrapped, and a crash), "5x" (5) and
# "abc" (0) without a word, and an unknown mode ran every allocator.
set -u
bin=$1
fails=0
check() { # CMD...: must exit 2, within 20 s
  timeout 20 "$@" >/dev/null 2>&1
  local rc=$?
  if [ "$rc" -ne 2 ]; then
    echo "micro_args_check: FAIL: '$*' exited $rc, not 2"
    fails=$((fails + 1))
  fi
}
for a in -5 abc 5x 0 " 5" +5; do
  check "$bin/bench_pool_pairs" "$a"
  check "$bin/bench_pool_pairs" "$a" host:capacity=1G remote
  check "$bin/bench_pool_threads" "$a"
  check "$bin/bench_pool_threads" 1000 100 "$a"
  check "$bin/bench_pool_handoff" "$a" 2
  check "$bin/bench_stream_table" "$a"
  check "$bin/bench_pause_resume" "$a"
  check "$bin/bench_pause_resume" 1 "$a"
  check "$bin/bench_host_pairs" "$a"
  # Built only with the fake driver (bench/CMakeLists.txt).
  if [ -x "$bin/bench_preload_pairs" ]; then
    check "$bin/bench_preload_pairs" "$a"
  fi
done
if [ -x "$bin/bench_preload_pairs" ]; then
  check "$bin/bench_preload_pairs" 10 bogus
fi
check "$bin/bench_pool_pairs" 1000 host:capacity=64T bogus
check "$bin/bench_pool_pairs" 1000 host:capacity=64T remotes
check "$bin/bench_pool_threads" 1000 100 2 1x
check "$bin/bench_pool_handoff" 1 -2
for a in 32M 100M 2T 1x 0G; do
  check "$bin/bench_pause_resume" "$a"
done
check "$bin/bench_stream_table" 10 host:capacity=1G 5 -1
# An option with no value after it was dropped; a count past 32 bits cut.
check "$bin/bench_defrag_kv" --steps 10 --seqs
check "$bin/bench_defrag_kv" --steps 10 --seqs 4294967297
# A token size whose largest cache (1024 tokens) is no size_t: it wrapped.
check "$bin/bench_defrag_kv" --steps 1 --seqs 1 --token-bytes 18014398509481984
check "$bin/bench_defrag_kv" --steps 1 --seqs 1 --token-bytes 1152921504606846977
# Mode remote runs (a pool row on the virtual range, as count_pairs.sh
# needs, and the jemalloc row where built with it) and exits 0.
out=$(timeout 20 "$bin/bench_pool_pairs" 100 host:capacity=1G remote 2>&1)
rc=$?
if [ "$rc" -ne 0 ] ||
  ! printf '%s\n' "$out" | grep -q '^remote  *pool  *100 .* virtual '; then
  echo "micro_args_check: FAIL: bench_pool_pairs 100 host:capacity=1G remote" \
    "exited $rc:"
  printf '%s\n' "$out"
  fails=$((fails + 1))
fi
if [ "$fails" -ne 0 ]; then
  exit 1
fi
echo "micro_args_check: ok"
