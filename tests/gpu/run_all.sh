#!/bin/sh
# run_all.sh BUILD_DIR OUT_DIR [MPBENCH] - every check that needs a GPU, in
# one go, for a machine that has one only for a while: what the GPU is, the
# gpu-labelled tests (`ctest -L gpu`: the real-driver twins of the fake-driver
# tests, gpu_cuda_gpu, gpu_spin_rules and the preload checks with nvcc and
# PyTorch), then mpbench's suite on the cuda device (the cuda-async and
# cuda-malloc rows come only there). Logs and results go to OUT_DIR:
#   gpu.txt         nvidia-smi
#   ctest_gpu.log   each test's ctest output; summary.txt each one's exit code
#   bench.log       mpbench run --device cuda (results.* under bench/)
# Each step is bounded (MEMPOOL_GPU_TEST_TIMEOUT per test, default 150 s,
# MEMPOOL_GPU_JOBS tests at a time, default 3; MEMPOOL_GPU_BENCH_TIMEOUT for
# mpbench, default 240 s), so a hang costs a bounded share of the lease.
# The tests named in MEMPOOL_GPU_ALONE (default: gpu_cuda_pause, whose other
# pool takes all the device's memory, and the direct allocator's two twins,
# which take 60% of what is free; ctest runs them RUN_SERIAL) run after the
# others, one at a time, so that no other test meets a full device and none
# gives memory back under theirs.
# Each test runs under timeout(1): ctest's own --timeout does not apply to
# tests with a TIMEOUT property (the gpu tests have 600 s), and in the first
# GPU run (2026-11-28) one hung test used up the whole call that way.
# Exit status: 0 when every gpu test passed or skipped, else 1.
set -u
build=$(cd "${1:?usage: run_all.sh BUILD_DIR OUT_DIR [MPBENCH]}" && pwd)
out=${2:?usage: run_all.sh BUILD_DIR OUT_DIR [MPBENCH]}
mpbench=${3:-$build/bench/mpbench}
mkdir -p "$out"
out=$(cd "$out" && pwd)
start=$(date +%s)
{
  nvidia-smi 2>&1
  nvidia-smi -L 2>&1
  nvcc --version 2>&1 | tail -n 2
} >"$out/gpu.txt"
t=${MEMPOOL_GPU_TEST_TIMEOUT:-150}
alone=" ${MEMPOOL_GPU_ALONE-gpu_cuda_pause gpu_cuda_direct_full_device_during_capture gpu_cuda_direct_beside_capture} "
(cd "$build" && ctest -L gpu -N | sed -n 's/^ *Test *#[0-9]*: //p') \
  >"$out/tests.txt"
: >"$out/together.txt"
: >"$out/alone.txt"
while read -r name; do
  case "$alone" in
  *" $name "*) echo "$name" >>"$out/alone.txt" ;;
  *) echo "$name" >>"$out/together.txt" ;;
  esac
done <"$out/tests.txt"
# One ctest per test, each bounded; its output is kept per test.
run_tests() { # run_tests JOBS LIST
  (cd "$build" && xargs -P "$1" -I{} sh -c \
    'timeout -k 5 '"$t"' ctest -R "^{}\$" --output-on-failure >"$0/{}.log" 2>&1;
     echo "{} rc=$?"' "$out" <"$2")
}
{
  run_tests "${MEMPOOL_GPU_JOBS:-3}" "$out/together.txt"
  run_tests 1 "$out/alone.txt"
} >"$out/summary.txt"
rc=0
for f in "$out"/gpu_*.log; do
  grep -q "100% tests passed" "$f" || rc=1
done
cat "$out"/gpu_*.log >"$out/ctest_gpu.log"
rm -f "$out"/gpu_*.log
echo "run_all: ctest -L gpu rc=$rc after $(($(date +%s) - start)) s"
grep -h "Test *#\|rc=" "$out/ctest_gpu.log" "$out/summary.txt"
if [ -x "$mpbench" ]; then
  timeout "${MEMPOOL_GPU_BENCH_TIMEOUT:-240}" "$mpbench" run --device cuda \
    --no-capacity --no-plots --out "$out/bench" >"$out/bench.log" 2>&1
  echo "run_all: mpbench rc=$? after $(($(date +%s) - start)) s"
fi
exit $rc
