#!/bin/sh
# gpu_twin.sh TEST [ARGS...] - runs a rule test of tests/fakecuda (built
# against the fake libcuda.so.1) against the machine's real CUDA driver:
# the real library's directory goes first on LD_LIBRARY_PATH, ahead of the
# fake's (the test's RUNPATH). Exits 77 (ctest: skipped) where there is no
# driver or no GPU.
lib=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF; exit}')
if [ -z "$lib" ] || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_twin: skipped: no CUDA driver or no GPU"
  exit 77
fi
LD_LIBRARY_PATH="$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
exec "$@"
