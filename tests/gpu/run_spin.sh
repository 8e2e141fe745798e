#!/bin/sh
# run_spin.sh SOURCE_DIR BUILD_DIR - builds tests/gpu/spin_rules.cu with
# nvcc against the build's libmempool.so and runs it (ctest gpu_spin_rules):
# the pool's CUDA rules with spinning kernels on a real GPU. Exits 77
# (skipped) without nvcc, a driver or a GPU.
set -u
src=$(cd "${1:?usage: run_spin.sh SOURCE_DIR BUILD_DIR}" && pwd)
build=$(cd "${2:?usage: run_spin.sh SOURCE_DIR BUILD_DIR}" && pwd)
nvcc=${NVCC:-}
[ -n "$nvcc" ] || nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$nvcc" ] || { echo "skip: no nvcc"; exit 77; }
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "skip: no CUDA driver or no GPU"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$nvcc" -O2 -I"$src/include" -o "$work/spin_rules" "$src/tests/gpu/spin_rules.cu" \
  -L"$build/src" -lmempool -Xlinker -rpath="$build/src" || {
  echo "FAILED: nvcc"
  exit 1
}
exec "$work/spin_rules"
