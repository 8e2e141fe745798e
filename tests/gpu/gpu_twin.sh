#!/bin/sh
# gpu_twin.sh TEST [ARGS...] - runs a rule test of tests/fakecuda (built
# against the fake libcuda.so.1) against the machine's real CUDA driver:
# the real library's directory goes first on LD_LIBRARY_PATH, ahead of the
# fake's (the test's RUNPATH). Exits 77 (ctest: skipped) where there is no
# driver or no GPU the driver may use; anything else is the test's own
# answer, so a twin that would run on the fake fails instead of passing.
#
# The driver: ldconfig's 64-bit libcuda.so.1 (a machine with the 32-bit
# driver too lists both, in no promised order, and a 32-bit directory
# first on the path would make the loader skip it and fall back to the
# fake's RUNPATH), else one in a directory of LD_LIBRARY_PATH (containers
# that mount the driver there without telling ldconfig).
#
# MEMPOOL_TWIN_DRIVER=DIR/libcuda.so.1 names the driver instead, and no GPU
# is looked for (nor CUDA_VISIBLE_DEVICES read): ctest -L standin runs every
# twin so on the fake's stand-in of a real driver (tests/fakecuda, target
# fakecuda_standin: no cuFake* hooks, every FAKECUDA_* variable unread), so
# that a twin that asks the fake for what only the fake has fails without a
# GPU.
if [ -n "${MEMPOOL_TWIN_DRIVER-}" ]; then
  lib=$MEMPOOL_TWIN_DRIVER
  # The loader finds it by name, in its directory, first on the path.
  if [ "$(basename "$lib")" != libcuda.so.1 ] || [ ! -e "$lib" ]; then
    echo "gpu_twin: MEMPOOL_TWIN_DRIVER=$lib is no libcuda.so.1" >&2
    exit 1
  fi
else
  lib=$(ldconfig -p 2>/dev/null |
    awk '/libcuda\.so\.1 \(libc6,(x86-64|AArch64|64bit)/ {print $NF; exit}')
  if [ -z "$lib" ]; then
    IFS_=$IFS
    IFS=:
    for d in ${LD_LIBRARY_PATH-}; do
      case "$d" in */tests/fakecuda/lib) continue ;; esac
      if [ -n "$d" ] && [ -e "$d/libcuda.so.1" ]; then
        lib="$d/libcuda.so.1"
        break
      fi
    done
    IFS=$IFS_
  fi
  # A GPU: one nvidia-smi lists, else one the kernel driver shows.
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  if [ "${gpus:-0}" -eq 0 ] && [ -d /proc/driver/nvidia/gpus ]; then
    gpus=$(find /proc/driver/nvidia/gpus -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
  fi
  if [ -z "$lib" ] || [ "${gpus:-0}" -eq 0 ]; then
    echo "gpu_twin: skipped: no CUDA driver or no GPU"
    exit 77
  fi
  # CUDA_VISIBLE_DEVICES empty or starting with an invalid index hides every
  # GPU from the driver (cuInit then fails, CUDA_ERROR_NO_DEVICE).
  case "${CUDA_VISIBLE_DEVICES-all}" in
  "" | -*)
    echo "gpu_twin: skipped: CUDA_VISIBLE_DEVICES='$CUDA_VISIBLE_DEVICES' hides every GPU"
    exit 77
    ;;
  esac
fi
LD_LIBRARY_PATH="$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
# A test that links libcuda.so.1 must get the real one: were it the fake
# (an RPATH, which comes before LD_LIBRARY_PATH, or a library of the wrong
# class), the twin would pass on the fake and look like a GPU run.
got=$(LD_TRACE_LOADED_OBJECTS=1 "$1" 2>/dev/null |
  awk '$1 == "libcuda.so.1" {print $3; exit}')
if [ -n "$got" ] && [ "$(readlink -f "$got")" != "$(readlink -f "$lib")" ]; then
  echo "gpu_twin: $1 loads $got, not the driver's $lib" >&2
  exit 1
fi
exec "$@"
