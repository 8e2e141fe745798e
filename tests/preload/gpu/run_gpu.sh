#!/bin/sh
# run_gpu.sh - the preload checks that need a GPU (registered with ctest as
# gpu_preload_nvcc; skipped with 77 where there is no driver or nvcc).
#
#   run_gpu.sh BUILD_DIR
#
# 1. gpu_prog.cu built with nvcc's default static runtime and with
#    -cudart shared; each runs without the shim (baseline), then under
#    libmempool_preload.so with a CSV trace and a report: both succeed, and
#    their traces have the same numbers of allocate and free rows, at least
#    as many as the program made (the runtime's own allocations are there
#    too). The .json trace and the reports parse; passthrough mode records
#    the same counts; mpbench replays the traces where the build has it.
# 2. torch_smoke.py (run last): a small PyTorch model on mp_torch_malloc / mp_torch_free
#    from libmempool.so (skipped when torch is not installed).
# Exit 0: pass; 1: a check failed (it says which); 77: no GPU or no nvcc.
set -u
build=$(cd "${1:?usage: run_gpu.sh BUILD_DIR}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
shim=$build/src/preload/libmempool_preload.so
# What LD_PRELOAD gets: ctest passes the sanitizer's runtime before the shim
# in sanitizer builds (tests/preload/CMakeLists.txt).
preload=${MEMPOOL_TEST_PRELOAD:-$shim}
lib=$build/src/libmempool.so
nvcc=${NVCC:-}
[ -n "$nvcc" ] || nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)

skip() { echo "skip: $*"; exit 77; }
fail() { echo "FAILED: $*"; exit 1; }

[ -x "$nvcc" ] || skip "no nvcc"
[ -f "$shim" ] || fail "no $shim (build first)"
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1' &&
   [ ! -e /usr/lib/x86_64-linux-gnu/libcuda.so.1 ] &&
   [ ! -e /usr/lib64/libcuda.so.1 ]; then
  skip "no CUDA driver (libcuda.so.1)"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$nvcc" -O2 -o "$work/prog_static" "$here/gpu_prog.cu" -lcuda ||
  fail "nvcc (static runtime)"
"$nvcc" -O2 -cudart shared -o "$work/prog_shared" "$here/gpu_prog.cu" -lcuda ||
  fail "nvcc (shared runtime)"

# The value of word KEY= in file FILE.
word() { tr ' ' '\n' <"$2" | sed -n "s/^$1=//p" | head -n 1; }
rows() { grep -c ",$1," "$2" || true; }

if ! "$work/prog_static" >"$work/baseline.out" 2>&1; then
  grep -qi "no CUDA-capable device\|insufficient" "$work/baseline.out" &&
    skip "no usable GPU: $(cat "$work/baseline.out")"
  fail "baseline without the shim: $(cat "$work/baseline.out")"
fi

for kind in static shared; do
  LD_PRELOAD=$preload MEMPOOL_TRACE=$work/$kind.csv \
    MEMPOOL_REPORT=$work/$kind.report.json \
    "$work/prog_$kind" >"$work/$kind.out" 2>"$work/$kind.err" ||
    fail "$kind under the shim: $(cat "$work/$kind.out" "$work/$kind.err")"
  grep -q '"mode": "pool"' "$work/$kind.report.json" ||
    fail "$kind: the pool did not serve: $(cat "$work/$kind.err")"
  python3 -m json.tool "$work/$kind.report.json" >/dev/null ||
    fail "$kind: report does not parse"
  a=$(word allocs "$work/$kind.out"); f=$(word frees "$work/$kind.out")
  ra=$(rows allocate "$work/$kind.csv"); rf=$(rows free "$work/$kind.csv")
  echo "$kind: program allocs=$a frees=$f, trace allocate=$ra free=$rf"
  if [ "$ra" -lt "$a" ] || [ "$rf" -lt "$f" ]; then
    fail "$kind: trace has fewer rows than the program's calls"
  fi
  eval "ra_$kind=$ra rf_$kind=$rf"
  if [ -x "$build/bench/mpbench" ]; then
    "$build/bench/mpbench" replay "$work/$kind.csv" >/dev/null ||
      fail "$kind: mpbench replay rejected the trace"
  fi
done
# shellcheck disable=SC2154
if [ "$ra_static" != "$ra_shared" ] || [ "$rf_static" != "$rf_shared" ]; then
  fail "static and shared runtime traces differ in counts"
fi

LD_PRELOAD=$preload MEMPOOL_TRACE=$work/run.json "$work/prog_static" \
  >/dev/null || fail "static runtime with a .json trace"
python3 -m json.tool "$work/run.json" >/dev/null ||
  fail ".json trace does not parse"

LD_PRELOAD=$preload MEMPOOL_PRELOAD=passthrough MEMPOOL_TRACE=$work/pass.csv \
  "$work/prog_shared" >/dev/null || fail "passthrough mode"
[ "$(rows allocate "$work/pass.csv")" = "$ra_shared" ] ||
  fail "passthrough trace counts differ from the pool's"

# A sticky error (a kernel's illegal access), then a cudaMalloc the pool
# must ask the driver for: the driver's code, as without the shim
# (sticky_prog.cu, the twin of unit_preload_driver_error).
for kind in static shared; do
  if [ "$kind" = static ]; then cudart=""; else cudart="-cudart shared"; fi
  # shellcheck disable=SC2086
  "$nvcc" -O2 $cudart -o "$work/sticky_$kind" "$here/sticky_prog.cu" ||
    fail "nvcc sticky_prog ($kind)"
  "$work/sticky_$kind" >"$work/sticky.none" 2>&1
  LD_PRELOAD=$preload "$work/sticky_$kind" >"$work/sticky.shim" 2>/dev/null
  cmp -s "$work/sticky.none" "$work/sticky.shim" ||
    fail "sticky_prog ($kind) differs: $(cat "$work/sticky.none") vs $(cat "$work/sticky.shim")"
done

# 3. CUDA's rules under the shim on the real driver: rules_prog (built
#    against the fake, run here with the real libcuda.so.1 first on the
#    path): cuMemFree's ordering, streams made and destroyed past the
#    pool's table size, a freed block's range and pointer attributes
#    (those of memory the driver does not know), and the memory and stream
#    of a context the program made and destroyed (the driver's), and
#    cuMemAlloc / cuMemFree refused during a global capture, begun with
#    cuStreamBeginCapture or into the program's graph with
#    cuStreamBeginCaptureToGraph (called, or found by cuGetProcAddress),
#    or with CUDA 10.0's cuStreamBeginCapture (no mode), and a
#    cuMemFreeAsync on a stream that may have a destroyed stream's handle,
#    and cuMemFree's ordering on a stream whose cuStreamDestroy was refused
#    (asked while another context is current; a driver that destroys it
#    leaves nothing to check, and the program says so).
rules=$build/tests/preload/preload_rules_prog
if [ -x "$rules" ]; then
  real=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF; exit}')
  for arg in "" streams freed_range own_context calls_in_capture \
    "calls_in_capture per_thread" "calls_in_capture to_graph" \
    "calls_in_capture to_graph_proc" "calls_in_capture to_graph_per_thread" \
    "calls_in_capture v1" reused_handle refused_destroy; do
    LD_LIBRARY_PATH="$(dirname "$real")" LD_PRELOAD=$preload \
      MEMPOOL_DEVICE=cuda "$rules" $arg >"$work/rules.out" 2>&1 ||
      fail "rules_prog $arg under the shim: $(cat "$work/rules.out")"
  done
  # A kernel on the per-thread stream of a thread the shim never met,
  # still reading a block cuMemFree freed: waited for through the legacy
  # stream (a pool of two blocks, so the allocation gets that block).
  LD_LIBRARY_PATH="$(dirname "$real")" LD_PRELOAD=$preload \
    MEMPOOL_DEVICE=cuda MEMPOOL_CONF=max_bytes=2M \
    "$rules" unseen_per_thread same >"$work/rules.out" 2>&1 ||
    fail "rules_prog unseen_per_thread under the shim: $(cat "$work/rules.out")"
  # cuMemFree during a capture, every capture mode x the freeing thread's
  # mode x the thread that began it or another: the shim's answers are
  # the driver's.
  LD_LIBRARY_PATH="$(dirname "$real")" MEMPOOL_DEVICE=cuda "$rules" \
    free_modes >"$work/modes.none" 2>&1 ||
    fail "rules_prog free_modes: $(cat "$work/modes.none")"
  LD_LIBRARY_PATH="$(dirname "$real")" LD_PRELOAD=$preload \
    MEMPOOL_DEVICE=cuda "$rules" free_modes >"$work/modes.shim" 2>&1 ||
    fail "rules_prog free_modes under the shim: $(cat "$work/modes.shim")"
  cmp -s "$work/modes.none" "$work/modes.shim" ||
    fail "free_modes differ: $(diff "$work/modes.none" "$work/modes.shim")"
  # The same for cuMemAlloc, and for the runtime's cudaFree and cudaMalloc
  # (the toolkit's libcudart.so, loaded by rules_prog), which the shim
  # serves itself for pool blocks; and cuMemAllocAsync on a stream of a
  # context the program made, with the primary context current (the
  # driver's answer with the shim too, no pool made for that context).
  cudart=$(dirname "$nvcc")/../lib64/libcudart.so
  # And frees and range queries from a host function (cuLaunchHostFunc):
  # the driver's refusal (CUDA_ERROR_NOT_PERMITTED) for a pool block too,
  # the block still the program's, with the driver's and the runtime's
  # frees. And the runtime's last error after a cudaFree it refuses (a
  # double free, an interior pointer), which the shim answers itself for
  # its pool's memory. And a second free (cuMemFree, cudaFree,
  # cuMemFreeHost) during a capture: the capture's refusal where its mode
  # prohibits the call, as for a live block.
  for m in "alloc_modes" "free_modes rt $cudart" "alloc_modes rt $cudart" \
    "other_context 0" host_fn "host_fn rt $cudart" "last_error rt $cudart" \
    double_free_modes "double_free_modes rt $cudart" double_free_host_modes; do
    LD_LIBRARY_PATH="$(dirname "$real")" MEMPOOL_DEVICE=cuda "$rules" \
      $m >"$work/modes.none" 2>&1 ||
      fail "rules_prog $m: $(cat "$work/modes.none")"
    LD_LIBRARY_PATH="$(dirname "$real")" LD_PRELOAD=$preload \
      MEMPOOL_DEVICE=cuda "$rules" $m >"$work/modes.shim" 2>&1 ||
      fail "rules_prog $m under the shim: $(cat "$work/modes.shim")"
    cmp -s "$work/modes.none" "$work/modes.shim" ||
      fail "$m differ: $(diff "$work/modes.none" "$work/modes.shim")"
  done
  # A cudaMallocAsync the capped pool refuses in thread B leaves thread
  # A's global capture valid (the shim sets the runtime's last error in
  # relaxed mode).
  LD_LIBRARY_PATH="$(dirname "$real")" LD_PRELOAD=$preload \
    MEMPOOL_DEVICE=cuda MEMPOOL_CONF=max_bytes=64M "$rules" oom_in_capture \
    rt "$cudart" >"$work/rules.out" 2>&1 ||
    fail "rules_prog oom_in_capture under the shim: $(cat "$work/rules.out")"
fi
# graph_prog (issue 10): a capture with cuMemAllocAsync/cuMemFreeAsync in
# it, served by a graph-private pool, replayed on the real driver; then
# the same capture allocating through the _ptsz entry points; then two
# captures into one graph (cuStreamBeginCaptureToGraph); then 300
# executables of one graph, the last alone holding its memory; "auto"
# instantiates with AUTO_FREE_ON_LAUNCH; refused_end (ends the driver
# refuses while the capture goes on), side_stream (only a forked
# stream allocates) and invalidated_side (the same capture invalidated by
# cuCtxSynchronize before its end); clone, child and update (a clone of
# the graph, a graph with a child graph node made from it, an executable
# updated from it: each holds its graph pool; without the shim the driver
# must refuse the first two, cuda.h forbidding them for memory nodes);
# add_node and add_node_move (a child graph node by cuGraphAddNode, the
# graph cloned or moved in: the parent holds its graph pool; without the
# shim the clone must be refused, the move is the driver's to answer),
# and, under the shim only, exec_child_set and exec_node_set (an
# executable given another graph in its child graph node holds that
# graph's pool) and embedded (a clone and an executable of the graph
# cuGraphChildGraphNodeGetGraph gives hold the parent's pools),
# refused_destroy and refused_destroy_many (a cuStreamDestroy of the
# capturing stream refused, asked while another context is current: the
# pool keeps the stream; a driver that destroys it fails the mode, saying
# so) and conditional_body (a capture into a conditional node's body graph
# is held by the parent's executable), destroyed_body (the same body's
# node destroyed: the executable made before keeps the memory, its
# destruction gives it back with the parent still alive); destroyed_capture
# (a capturing stream destroyed ends its capture: later cuMemAlloc/cuMemFree served, the
# memory back) under the shim with the pool capped at 24 MiB, uncapped
# (the memory back without a device sync), and without the shim. Every mode frees the graph's output
# after each launch, as cuda.h's graph allocations ask; "", "auto",
# refused_end, side_stream and invalidated_side also run without the
# shim, the real driver's own graph memory nodes keeping the rules the
# fake keeps.
graph=$build/tests/preload/preload_graph_prog
if [ -x "$graph" ]; then
  real=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF; exit}')
  for how in "" ptsz auto to_graph_twice many_execs refused_end side_stream \
    invalidated_side clone child update add_node add_node_move \
    exec_child_set exec_node_set embedded refused_destroy \
    refused_destroy_many conditional_body destroyed_body destroyed_capture \
    prior_work; do
    LD_LIBRARY_PATH="$(dirname "$real")" LD_PRELOAD=$preload \
      MEMPOOL_DEVICE=cuda "$graph" pool $how >"$work/graph.out" 2>&1 ||
      fail "graph_prog $how under the shim: $(cat "$work/graph.out")"
  done
  LD_LIBRARY_PATH="$(dirname "$real")" LD_PRELOAD=$preload \
    MEMPOOL_DEVICE=cuda MEMPOOL_CONF=max_bytes=24M \
    "$graph" pool destroyed_capture >"$work/graph.out" 2>&1 ||
    fail "graph_prog destroyed_capture under the shim: $(cat "$work/graph.out")"
  for how in "" auto refused_end side_stream invalidated_side clone child \
    update add_node add_node_move destroyed_capture; do
    LD_LIBRARY_PATH="$(dirname "$real")" "$graph" plain $how \
      >"$work/graph.out" 2>&1 ||
      fail "graph_prog $how without the shim: $(cat "$work/graph.out")"
  done
fi

# reset_prog (the twin of integration_preload_reset): cuDevicePrimaryCtxReset
# (called, and found by cuGetProcAddress as cudaDeviceReset finds it) with
# live pool blocks: a destroyed block's free is refused, and what is
# allocated after the reset holds what is written to it; "pinned": the same
# for page-locked memory of the host pool (what is pinned after the reset
# carries data to the device and back; the refused free of a destroyed
# page-locked block is checked on the fake only, the real driver's answer
# for it being unknown); "pinned_wc" and "real_dev": write-combined
# page-locked memory and device memory the driver hands out itself, across
# a reset (real_dev also under MEMPOOL_PRELOAD=passthrough, where every
# cuMemAlloc is the driver's). The "many" modes are not here: the heap the
# real driver keeps across resets is unknown.
reset=$build/tests/preload/preload_reset_prog
if [ -x "$reset" ]; then
  real=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF; exit}')
  for conf in virtual=0 virtual=1; do
    for how in "" proc pinned pinned_wc real_dev; do
      LD_LIBRARY_PATH="$(dirname "$real")" LD_PRELOAD=$preload \
        MEMPOOL_DEVICE=cuda MEMPOOL_CONF=$conf "$reset" $how \
        >"$work/reset.out" 2>&1 ||
        fail "reset_prog $how $conf under the shim: $(cat "$work/reset.out")"
    done
  done
  LD_LIBRARY_PATH="$(dirname "$real")" LD_PRELOAD=$preload \
    MEMPOOL_DEVICE=cuda MEMPOOL_PRELOAD=passthrough "$reset" real_dev \
    >"$work/reset.out" 2>&1 ||
    fail "reset_prog real_dev passthrough under the shim: $(cat "$work/reset.out")"
fi

# 4. Page-locked memory of a driver-API program on the real driver (the
#    twin of integration_preload_pinned_driver): the host pool serves
#    cuMemHostAlloc / cuMemAllocHost, the report counts them, the .json
#    trace marks each allocation and free, and a cuMemHostRegister'd
#    buffer is neither counted nor traced.
pinned=$build/tests/preload/preload_pinned_drv_prog
if [ -x "$pinned" ]; then
  real=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF; exit}')
  LD_LIBRARY_PATH="$(dirname "$real")" LD_PRELOAD=$preload \
    MEMPOOL_DEVICE=cuda MEMPOOL_REPORT=$work/pinned.report.json \
    MEMPOOL_TRACE=$work/pinned.json "$pinned" 40 >"$work/pinned.out" 2>&1 ||
    fail "pinned_drv_prog under the shim: $(cat "$work/pinned.out")"
  reg=$(word registered "$work/pinned.out")
  python3 - "$work/pinned.report.json" "$work/pinned.json" "$reg" <<'PY' ||
import json, sys
rep = json.load(open(sys.argv[1]))
ev = json.load(open(sys.argv[2]))["traceEvents"]
reg = int(sys.argv[3])
h = rep["host_pool"]
a = [e["args"] for e in ev if e.get("name") == "pinned"]
f = [e["args"] for e in ev if e.get("name") == "pinned_free"]
ok = (rep["calls"]["pinned"] == 81 and h["alloc_count"] == 80 and
      h["free_count"] == 80 and len(a) == 81 and len(f) == 81 and
      all(int(x["ptr"], 16) != reg for x in a + f))
sys.exit(0 if ok else 1)
PY
    fail "pinned_drv_prog: report or trace: $(cat "$work/pinned.report.json")"
  # Blocks from the page-locked entry points cuGetProcAddress answers and
  # from the called ones, freed crosswise: every free succeeds.
  LD_LIBRARY_PATH="$(dirname "$real")" LD_PRELOAD=$preload \
    MEMPOOL_DEVICE=cuda "$pinned" 1 proc >"$work/pinned.out" 2>&1 ||
    fail "pinned_drv_prog proc under the shim: $(cat "$work/pinned.out")"
  # Mapped blocks (CU_MEMHOSTALLOC_DEVICEMAP) have a device pointer (mapped);
  # cuMemHostGetFlags gives each block the flags it was asked for, and a
  # freed block CUDA_ERROR_INVALID_VALUE (flags); a block's range
  # (cuPointerGetAttribute RANGE_START_ADDR, RANGE_SIZE) is its allocation
  # (range); a freed block has no device pointer
  # (cuMemHostGetDevicePointer, called and looked up: devptr); a live
  # block's cuMemGetAddressRange is the block, a freed one's
  # CUDA_ERROR_NOT_FOUND (addr_range); with and without the shim (the run
  # without it checks the fake's model of cuda.h's rules).
  for mode in mapped flags range devptr addr_range; do
    LD_LIBRARY_PATH="$(dirname "$real")" "$pinned" 1 $mode \
      >"$work/pinned.out" 2>&1 ||
      fail "pinned_drv_prog $mode: $(cat "$work/pinned.out")"
    LD_LIBRARY_PATH="$(dirname "$real")" LD_PRELOAD=$preload \
      MEMPOOL_DEVICE=cuda "$pinned" 1 $mode >"$work/pinned.out" 2>&1 ||
      fail "pinned_drv_prog $mode under the shim: $(cat "$work/pinned.out")"
  done
  # Page-locked calls during a capture answer as the driver does (relaxed:
  # allowed, the capture stays valid; global: refused, invalidated); the
  # run without the shim checks the fake's model of the rule.
  for mode in relaxed global; do
    LD_LIBRARY_PATH="$(dirname "$real")" "$pinned" 1 capture $mode \
      >"$work/pinned.out" 2>&1 ||
      fail "pinned_drv_prog capture $mode: $(cat "$work/pinned.out")"
    LD_LIBRARY_PATH="$(dirname "$real")" LD_PRELOAD=$preload \
      MEMPOOL_DEVICE=cuda "$pinned" 1 capture $mode >"$work/pinned.out" 2>&1 ||
      fail "pinned_drv_prog capture $mode under the shim: $(cat "$work/pinned.out")"
  done
fi

# 5. IPC on the real driver (the twin of integration_preload_ipc): a
#    CUipcMemHandle of the range start the shim answers plus the offset
#    from it, opened by a second process that writes there. Without the
#    shim both buffers are shared; under it (virtual=0) the block that
#    starts its plain segment is shared and the one inside it refused
#    (801, CUDA_ERROR_NOT_SUPPORTED) instead of shared at the wrong
#    address; a block of the virtual range is refused. Each run also checks
#    that cuPointerGetAttribute(IS_LEGACY_CUDA_IPC_CAPABLE) of the range
#    start agrees with cuIpcGetMemHandle; "ipc_prog capable" prints that
#    attribute of the range start and of an address inside the buffer: 1
#    without the shim, 0 for the block the shim refuses and for the
#    virtual range (cuMemCreate memory), the driver's 1 for the block that
#    starts its segment; cuPointerGetAttributes must say what
#    cuPointerGetAttribute says.
ipc=$build/tests/preload/preload_ipc_prog
if [ -x "$ipc" ]; then
  real=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF; exit}')
  for which in first second; do
    LD_LIBRARY_PATH="$(dirname "$real")" "$ipc" $which >"$work/ipc.out" 2>&1
    [ "$(cat "$work/ipc.out")" = shared ] ||
      fail "ipc_prog $which without the shim: $(cat "$work/ipc.out")"
  done
  for want in "first virtual=0 shared" "second virtual=0 refused 801" \
    "first virtual=1 refused" "second virtual=1 refused 801"; do
    which=${want%% *} rest=${want#* }
    conf=${rest%% *} expect=${rest#* }
    LD_LIBRARY_PATH="$(dirname "$real")" LD_PRELOAD=$preload \
      MEMPOOL_DEVICE=cuda MEMPOOL_CONF=$conf "$ipc" "$which" \
      >"$work/ipc.out" 2>"$work/ipc.err" ||
      fail "ipc_prog $which $conf: $(cat "$work/ipc.out" "$work/ipc.err")"
    case "$(cat "$work/ipc.out")" in
    "$expect"*) ;;
    *) fail "ipc_prog $which $conf: want '$expect': $(cat "$work/ipc.out" "$work/ipc.err")" ;;
    esac
  done
  for which in first second; do
    LD_LIBRARY_PATH="$(dirname "$real")" "$ipc" capable $which \
      >"$work/ipc.out" 2>&1
    [ "$(cat "$work/ipc.out")" = "capable 1 1" ] ||
      fail "ipc_prog capable $which without the shim: $(cat "$work/ipc.out")"
  done
  for want in "first virtual=0 1" "second virtual=0 0" \
    "first virtual=1 0" "second virtual=1 0"; do
    which=${want%% *} rest=${want#* }
    conf=${rest%% *} cap=${rest#* }
    LD_LIBRARY_PATH="$(dirname "$real")" LD_PRELOAD=$preload \
      MEMPOOL_DEVICE=cuda MEMPOOL_CONF=$conf "$ipc" capable "$which" \
      >"$work/ipc.out" 2>"$work/ipc.err" ||
      fail "ipc_prog capable $which $conf: $(cat "$work/ipc.out" "$work/ipc.err")"
    [ "$(cat "$work/ipc.out")" = "capable $cap $cap" ] ||
      fail "ipc_prog capable $which $conf: want 'capable $cap $cap': $(cat "$work/ipc.out" "$work/ipc.err")"
  done
fi

# 6. Stream-ordered calls on another device's stream (the twin of
#    preload_driver stream_ordered_calls_follow_the_streams_device), and
#    page-locked memory across another device's reset: needs two GPUs;
#    the driver alone, then the shim.
drv=$build/tests/preload/preload_drv_prog
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ -x "$drv" ] && [ "${ngpu:-0}" -ge 2 ]; then
  real=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF; exit}')
  LD_LIBRARY_PATH="$(dirname "$real")" "$drv" plain - cross \
    >"$work/cross.out" 2>&1 ||
    fail "drv_prog cross without the shim: $(cat "$work/cross.out")"
  LD_LIBRARY_PATH="$(dirname "$real")" LD_PRELOAD=$preload \
    MEMPOOL_DEVICE=cuda "$drv" preloaded cuda cross >"$work/cross.out" 2>&1 ||
    fail "drv_prog cross under the shim: $(cat "$work/cross.out")"
  # A reset of device 0 leaves page-locked memory asked for while device
  # 1 was current (the twin of preload_pinned_driver
  # under_the_shim_a_reset_leaves_other_devices_pinned_memory).
  if [ -x "$pinned" ]; then
    LD_LIBRARY_PATH="$(dirname "$real")" "$pinned" 1 other_reset \
      >"$work/pinned.out" 2>&1 ||
      fail "pinned_drv_prog other_reset: $(cat "$work/pinned.out")"
    LD_LIBRARY_PATH="$(dirname "$real")" LD_PRELOAD=$preload \
      MEMPOOL_DEVICE=cuda "$pinned" 1 other_reset >"$work/pinned.out" 2>&1 ||
      fail "pinned_drv_prog other_reset under the shim: $(cat "$work/pinned.out")"
  fi
fi

if [ -f "$lib" ]; then
  python3 "$here/torch_smoke.py" "$lib"
  rc=$?
  [ $rc -eq 0 ] || [ $rc -eq 77 ] || fail "torch_smoke.py"
  # torch.cuda.graph with the pluggable allocator (issue 10), a process of
  # its own: PyTorch takes an allocator only before its first tensor.
  python3 "$here/torch_graph.py" "$lib"
  rc=$?
  [ $rc -eq 0 ] || [ $rc -eq 77 ] || fail "torch_graph.py"
fi
echo "ok"
