#!/bin/sh
# run_all.sh BUILD_DIR OUT_DIR [MPBENCH] - every check that needs a GPU, in
# one go, for a machine that has one only for a while: what the GPU is, the
# gpu-labelled tests (`ctest -L gpu`: the real-driver twins of the fake-driver
# tests, gpu_cuda_gpu, gpu_spin_rules and the preload checks with nvcc and
# PyTorch), then mpbench's suite on the cuda device (the cuda-async and
# cuda-malloc rows come only there). Logs and results go to OUT_DIR:
#   gpu.txt         nvidia-smi
#   ctest_gpu.log   ctest's output; LastTest.log its full log
#   bench.log       mpbench run --device cuda (results.* under bench/)
# Each step is bounded (MEMPOOL_GPU_TEST_TIMEOUT per test, default 150 s;
# MEMPOOL_GPU_BENCH_TIMEOUT for mpbench, default 240 s), so a hang costs a
# bounded share of the lease. Exit status: ctest's.
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
(cd "$build" && ctest -L gpu --output-on-failure \
  --timeout "${MEMPOOL_GPU_TEST_TIMEOUT:-150}" -j "${MEMPOOL_GPU_JOBS:-3}") \
  >"$out/ctest_gpu.log" 2>&1
rc=$?
cp "$build/Testing/Temporary/LastTest.log" "$out/" 2>/dev/null
echo "run_all: ctest -L gpu rc=$rc after $(($(date +%s) - start)) s"
tail -n 25 "$out/ctest_gpu.log"
if [ -x "$mpbench" ]; then
  timeout "${MEMPOOL_GPU_BENCH_TIMEOUT:-240}" "$mpbench" run --device cuda \
    --no-capacity --no-plots --out "$out/bench" >"$out/bench.log" 2>&1
  echo "run_all: mpbench rc=$? after $(($(date +%s) - start)) s"
fi
exit $rc
