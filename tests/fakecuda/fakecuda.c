/* fakecuda.c - a test double of the CUDA driver, built as libcuda.so.1.
 *
 * It lets the cuda backend (and the LD_PRELOAD shim) run their driver code
 * paths on machines without a GPU: each fake device is a mempool "host"
 * device, opened lazily, so memory, streams, events and virtual memory
 * behave as the host backend's do (device memory is host memory, streams
 * run in order on worker threads). Only cu* symbols are exported (see
 * fakecuda.map), so the copy of mempool linked in here never collides with
 * libmempool.so.
 *
 * Like the real driver it keeps a context stack per thread, and every call
 * that needs a context uses the one on top (CUDA_ERROR_INVALID_CONTEXT when
 * there is none), so a caller that forgets to make its context current
 * fails here as it would on a GPU. A device's primary context holds the host
 * device open; releasing the last reference closes it, freeing everything
 * it held, as a real primary context's destruction does.
 *
 * Entry points are counted (cuFakeGetCallCount) and found by base name and
 * version through cuGetProcAddress, as the real driver does. Knobs, read at
 * cuInit: FAKECUDA_NO_DEVICE=1, FAKECUDA_INIT_ERROR=<CUresult>,
 * FAKECUDA_DEVICE_COUNT=N (1..8), FAKECUDA_DEVICE=<host options>,
 * FAKECUDA_DEVICE_<N>=<host options> (device N's instead: machines mix
 * GPUs), FAKECUDA_NO_VMM=1, FAKECUDA_NO_SHAREABLE=1 (no POSIX-fd handles and no
 * GPUDirect RDMA on VMM memory: cuMemCreate refuses a prop asking for them,
 * as a driver that lacks them does), FAKECUDA_NAME=<name>;
 * FAKECUDA_DRIVER_VERSION=N is read
 * by cuDriverGetVersion and cuGetProcAddress; FAKECUDA_CALL_REPORT=1 prints
 * the call counts at exit; FAKECUDA_DEAD_STREAMS=refuse answers a destroyed
 * stream's handle with CUDA_ERROR_INVALID_HANDLE instead of stopping the
 * process (fk_dead_or_bad); FAKECUDA_UNMAP_IN_USE=refuse likewise answers
 * an unmap of memory queued work still uses (fk_flight_t);
 * FAKECUDA_FREE_IN_USE=stop (any value) has cuMemFree of cuMemAlloc memory
 * that queued work still uses stop the process instead of waiting, and
 * =refuse answers it CUDA_ERROR_INVALID_VALUE (fk_free_in_use);
 * FAKECUDA_IPC_INTERIOR=1 lets cuIpcGetMemHandle take a pointer inside an
 * allocation (see IPC below); FAKECUDA_REUSE_STREAMS=1 gives a new stream
 * the handle of the stream released last, as a driver may (fk_unbury).
 * Errors a test may
 * count: cuFakeGetErrorCount.
 *
 * CUDA's rules it keeps strictly (each with a test in
 * test_fakecuda_rules.c, the source cited where it is modelled):
 *  - the legacy NULL stream and blocking streams wait for each other;
 *    CU_STREAM_NON_BLOCKING streams wait for nothing implicitly;
 *  - CU_STREAM_PER_THREAD, and NULL for the _ptsz/_ptds entry points, is
 *    a different (blocking) stream in every thread;
 *  - cuMemFree and cuCtxSynchronize wait for all work of the context, the
 *    application's streams included;
 *  - cuStreamDestroy returns at once, queued work still runs; the handle is
 *    then invalid: CUDA_ERROR_INVALID_HANDLE, counted
 *    (cuFakeGetErrorCount), never a crash;
 *  - a host function's CUDA calls get CUDA_ERROR_NOT_PERMITTED (counted);
 *  - cuMemUnmap does not wait for queued work: unmapping memory a queued
 *    copy or memset still uses stops the process (fk_flight_t); nor does
 *    cuMemFree of cuMemAllocAsync memory (fk_free_in_use);
 *  - a mapping starts with no access: a copy or memset of it runs only on
 *    a device cuMemSetAccess gave access to (read: PROT_READ or
 *    PROT_READWRITE; write: PROT_READWRITE), else it is refused with
 *    CUDA_ERROR_ILLEGAL_ADDRESS, counted (fk_access_ok); so is a device
 *    write (a memset, a copy into it) to host memory registered
 *    CU_MEMHOSTREGISTER_READ_ONLY, "considered read-only by the device"
 *    (fk_read_only_touched);
 *  - virtual memory (test_fakecuda_vmm_rules.c, cuda.h's text cited there):
 *    cuMemCreate allocates the device's memory, so it fails with
 *    CUDA_ERROR_OUT_OF_MEMORY where the handle does not fit, and memory a
 *    handle keeps unmapped is used for cuMemGetInfo and cuMemAlloc until
 *    the handle is released and unmapped (fk_phys_count); a released
 *    handle is refused by cuMemMap, cuMemRelease and
 *    cuMemExportToShareableHandle (CUDA_ERROR_INVALID_VALUE) while its
 *    mappings keep the memory (fk_phys_valid); cuMemMap takes offset 0,
 *    flags 0, granularity-aligned addresses and sizes inside one
 *    reservation, never over a mapping; cuMemUnmap and cuMemSetAccess take
 *    whole mappings only; cuMemAddressFree takes exactly a reservation with
 *    nothing mapped in it (else CUDA_ERROR_INVALID_VALUE);
 *  - a user object's destructor runs on the fake's own thread, never on
 *    the one that dropped the last reference, and nothing waits for it
 *    (fk_dtor_queue);
 *  - stream capture (test_fakecuda_capture.c): work on a capturing stream
 *    is recorded into an opaque graph (host functions, memsets, copies,
 *    cuMemAllocAsync/cuMemFreeAsync as allocation and free nodes), not
 *    run; cuGraphInstantiate/cuGraphLaunch replay it; potentially unsafe
 *    calls (cuMemAlloc, cuMemFree, host allocations, cuCtxSynchronize,
 *    synchronous copies, waiting on the legacy stream, the virtual memory
 *    and IPC calls that make, map or give back memory: FK_UNSAFE_VMM)
 *    are refused with
 *    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED as the calling thread's mode
 *    (cuThreadExchangeStreamCaptureMode) and the captures' modes say, and
 *    invalidate those captures (cuStreamEndCapture then says
 *    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED); waiting on a capturing stream
 *    or on an event recorded in a capture is refused in every mode, and
 *    legacy-stream work while a blocking stream captures is
 *    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT (the capture invalidated);
 *    cuStreamGetCaptureInfo gives a capture's id and graph only while it
 *    is active, never once it is invalidated; cuGraphDestroy of a graph a
 *    capture is building (until its end) is CUDA_ERROR_INVALID_VALUE; a
 *    stream that waits on an event recorded in a capture joins it (same
 *    id, graph, mode and thread; what is refused on the origin is refused
 *    on it, and a conflict on either invalidates both), a capturing
 *    stream's wait on an event recorded outside any capture is refused
 *    unless external (CUDA_ERROR_STREAM_CAPTURE_ISOLATION), and an
 *    external wait outside any capture (or with flags beyond
 *    CU_EVENT_WAIT_EXTERNAL) is CUDA_ERROR_INVALID_VALUE;
 *    cuStreamEndCapture ends it on the origin only
 *    (CUDA_ERROR_STREAM_CAPTURE_UNMATCHED elsewhere) and with
 *    CUDA_ERROR_STREAM_CAPTURE_UNJOINED when a joined stream's work was
 *    not joined back, taking every joined stream out of capture;
 *    cuGraphClone and cuGraphAddChildGraphNode copy a graph but refuse
 *    one with memory nodes or conditional nodes (CUDA_ERROR_INVALID_VALUE),
 *    cuGraphDestroyNode removes a node with what it owns (a child graph
 *    node's graph, a conditional node's bodies) but not from a graph with
 *    memory nodes or one a capture builds, cuGraphNodeFindInClone
 *    gives a clone's copy of a node, and
 *    cuGraphExecUpdate takes a graph with as many nodes of the same types
 *    (else CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE); cuGraphAddNode (both
 *    forms) makes child graph nodes, cloning or moving the child
 *    (CUDA_CHILD_GRAPH_NODE_PARAMS.ownership; a moved graph is neither
 *    destroyed nor instantiated on its own), and conditional nodes with
 *    handles of cuGraphConditionalHandleCreate, their body graphs the
 *    node's (not run by a launch), cuGraphChildGraphNodeGetGraph
 *    gives the graph a child graph node embeds, and
 *    cuGraphExecChildGraphNodeSetParams and cuGraphExecNodeSetParams
 *    (child graph nodes only) replace an executable's copy of it, and
 *    cuGraphNodeSetParams (child graph nodes only, cloned in) a graph's;
 *  - contexts (test_fakecuda_contexts.c): a context made by cuCtxCreate,
 *    and each device's primary context (FAKECUDA_DEVICE_COUNT devices),
 *    has its own memory, streams and work: cuCtxSynchronize waits for the
 *    current context only, a stream of another context is an invalid
 *    handle (but to the queries of its flags, context and capture, and to
 *    cuMemAllocAsync / cuMemFreeAsync, which run in another device's
 *    stream's context: the memory is that device's; cuMemFree frees memory
 *    on the device it came from, whatever context is current);
 *    cuDevicePrimaryCtxReset destroys everything the primary
 *    context held; a destroyed context is CUDA_ERROR_INVALID_CONTEXT;
 *    page-locked memory (cuMemHostAlloc, cuMemAllocHost) is freed by
 *    cuMemFreeHost whatever context is current, and cuMemHostGetFlags and
 *    cuMemHostGetDevicePointer (only for CU_MEMHOSTALLOC_DEVICEMAP
 *    memory, and CU_MEMHOSTREGISTER_DEVICEMAP registrations, those not
 *    PORTABLE in the registering context only) answer for any address
 *    inside it; memory registered without PORTABLE is pageable memory to
 *    other contexts: their memsets of it are CUDA_ERROR_INVALID_VALUE,
 *    their copies take it (fk_registered_foreign).
 * Limits (rules it cannot or does not model): no kernels, so nothing runs
 * on the device but copies, memsets and host functions, and a race a GPU
 * would show appears only as far as host threads interleave; memory is
 * host memory, so a use after free reads stale data instead of faulting;
 * cuMemFreeAsync waits for its stream; a thread's per-thread stream lives
 * until its context is destroyed (16 contexts per thread keep theirs); cuMemMap
 * maps whole handles only (offset 0), and charges the current context's
 * device, so a handle mapped twice is charged twice; cuMemAddressReserve
 * refuses an alignment above the granularity (cuda.h allows any power of
 * two) and a size that is not a multiple of it (cuda.h asks for the host
 * page size); cuMemUnmap takes one mapping a call, where cuda.h's "the
 * entire contiguous address range that was mapped" may take several
 * adjacent ones; event flags (timing, blocking sync) are ignored. Capture: a
 * graph is a chain of nodes in the order they were captured, whatever stream of
 * the capture made them (an order the graph's edges allow); at most
 * FK_CAP_STREAMS streams take part in one capture; the legacy stream never
 * joins one; an end on a joined stream invalidates nothing; memory of an
 * allocation node is allocated once, at capture, and freed with the graph if a
 * free node releases it; the VMM and IPC calls are treated as unsafe where
 * an H200 allowed them (FK_UNSAFE_VMM); cuStreamGetCaptureInfo gives no
 * dependencies; a captured event record or wait makes no node; a child
 * graph node is its graph's nodes copied into the chain, then a node
 * standing for them (embedding the graph, whose later changes the parent
 * does not see); a graph with memory nodes is not moved into a child graph
 * node (CUDA_ERROR_NOT_SUPPORTED); cuGraphAddNode and
 * cuGraphExecNodeSetParams take no other node type (the same error);
 * cuGraphExecUpdate refuses graphs with memory nodes
 * and keeps the executable's user object references. Events are plain
 * host-device events: one of another context is CUDA_ERROR_INVALID_VALUE,
 * not an invalid handle. There is no runtime (libcudart) over it, so the
 * runtime's own state after the shim serves a cudaMalloc (the primary
 * context current, the shim's failures in cudaGetLastError) is checked only
 * on a GPU
 * (tests/preload/gpu/gpu_prog.cu); the preload tests' stand-in runtime
 * (tests/preload/stand_runtime.c) keeps a last error, for the shim's
 * refused frees. */
#include <cuda.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "device/backend.h"

/* Symbols the real driver exports that cuda.h renames or hides. */
#undef cuGetProcAddress
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                          cuuint64_t flags);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream s);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s);
CUresult cuStreamSynchronize_ptsz(CUstream s);
CUresult cuStreamQuery_ptsz(CUstream s);
CUresult cuStreamGetFlags_ptsz(CUstream s, unsigned int *flags);
CUresult cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void *arg);
CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n,
                            CUstream s);
CUresult cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char v, size_t n,
                              CUstream s);
CUresult cuEventRecord_ptsz(CUevent e, CUstream s);
CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent e, unsigned flags);
#undef cuCtxCreate
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
#undef cuStreamBeginCapture
#undef cuStreamGetCaptureInfo
CUresult cuStreamBeginCapture(CUstream s);
/* The original, before CUDA 11.0's _v2 (cudaTypedefs.h:
 * PFN_cuDevicePrimaryCtxReset_v7000), which old binaries still call. */
#undef cuDevicePrimaryCtxReset
CUresult cuDevicePrimaryCtxReset(CUdevice dev);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode);
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g,
                                          const CUgraphNode *deps,
                                          const CUgraphEdgeData *edges,
                                          size_t n, CUstreamCaptureMode mode);
CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g);
CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus *st);
CUresult cuStreamGetCaptureInfo_v2(CUstream s, CUstreamCaptureStatus *st,
                                   cuuint64_t *id, CUgraph *g,
                                   const CUgraphNode **deps, size_t *n);
CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream s, CUstreamCaptureStatus *st,
                                        cuuint64_t *id, CUgraph *g,
                                        const CUgraphNode **deps, size_t *n);
CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream s, CUstreamCaptureStatus *st,
                                        cuuint64_t *id, CUgraph *g,
                                        const CUgraphNode **deps,
                                        const CUgraphEdgeData **edges,
                                        size_t *n);
CUresult cuGraphLaunch_ptsz(CUgraphExec x, CUstream s);
CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *out, CUgraph g,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS *p);
/* The forms before CUDA 12.0's, which binaries built with older headers
 * still call: cuda.h (under __CUDA_API_VERSION_INTERNAL) declares both with
 * an error node and a log buffer, cudaTypedefs.h names them
 * PFN_cuGraphInstantiate_v10000 and _v11000; since 12.0 the name
 * cuGraphInstantiate is cuGraphInstantiateWithFlags. */
#undef cuGraphInstantiate
/* And PFN_cuGraphAddNode_v12020, before CUDA 12.3's edge data. */
#undef cuGraphAddNode
CUresult cuGraphAddNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                        size_t ndeps, CUgraphNodeParams *p);
/* And PFN_cuGraphExecUpdate_v10020, before CUDA 12.0's result info. */
#undef cuGraphExecUpdate
CUresult cuGraphExecUpdate(CUgraphExec x, CUgraph g, CUgraphNode *err,
                           CUgraphExecUpdateResult *result);
CUresult cuGraphInstantiate(CUgraphExec *out, CUgraph g, CUgraphNode *err,
                            char *log, size_t logsize);
CUresult cuGraphInstantiate_v2(CUgraphExec *out, CUgraph g, CUgraphNode *err,
                               char *log, size_t logsize);
CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n);
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n);
CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n);
CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n);
CUresult cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char v, size_t n);
/* Test hooks. */
long long cuFakeGetCallCount(const char *name);
void cuFakeResetCallCounts(void);

/* ---- call counts --------------------------------------------------------- */

/* Every exported entry point, by its exported name. */
#define FK_ENTRY_POINTS(X)                                                     \
  X(cuInit)                                                                    \
  X(cuDriverGetVersion)                                                        \
  X(cuDeviceGet)                                                               \
  X(cuDeviceGetCount)                                                          \
  X(cuDeviceGetName)                                                           \
  X(cuDeviceGetAttribute)                                                      \
  X(cuDeviceTotalMem_v2)                                                       \
  X(cuDevicePrimaryCtxRetain)                                                  \
  X(cuDevicePrimaryCtxRelease_v2)                                              \
  X(cuDevicePrimaryCtxGetState)                                                \
  X(cuDevicePrimaryCtxReset)                                                   \
  X(cuDevicePrimaryCtxReset_v2)                                                \
  X(cuCtxCreate_v2)                                                            \
  X(cuCtxCreate_v4)                                                            \
  X(cuCtxDestroy_v2)                                                           \
  X(cuCtxPushCurrent_v2)                                                       \
  X(cuCtxPopCurrent_v2)                                                        \
  X(cuCtxGetCurrent)                                                           \
  X(cuCtxSetCurrent)                                                           \
  X(cuCtxGetDevice)                                                            \
  X(cuCtxSynchronize)                                                          \
  X(cuMemGetInfo_v2)                                                           \
  X(cuMemAlloc_v2)                                                             \
  X(cuMemFree_v2)                                                              \
  X(cuMemAllocAsync)                                                           \
  X(cuMemAllocAsync_ptsz)                                                      \
  X(cuMemFreeAsync)                                                            \
  X(cuMemFreeAsync_ptsz)                                                       \
  X(cuMemGetAddressRange_v2)                                                   \
  X(cuMemHostAlloc)                                                            \
  X(cuMemAllocHost_v2)                                                         \
  X(cuMemFreeHost)                                                             \
  X(cuMemHostGetFlags)                                                         \
  X(cuMemHostGetDevicePointer_v2)                                              \
  X(cuMemHostRegister_v2)                                                      \
  X(cuMemHostUnregister)                                                       \
  X(cuStreamCreate)                                                            \
  X(cuStreamCreateWithPriority)                                                \
  X(cuStreamDestroy_v2)                                                        \
  X(cuStreamSynchronize)                                                       \
  X(cuStreamSynchronize_ptsz)                                                  \
  X(cuStreamQuery)                                                             \
  X(cuStreamQuery_ptsz)                                                        \
  X(cuStreamGetFlags)                                                          \
  X(cuStreamGetFlags_ptsz)                                                     \
  X(cuStreamGetCtx)                                                            \
  X(cuLaunchHostFunc)                                                          \
  X(cuLaunchHostFunc_ptsz)                                                     \
  X(cuMemcpyAsync)                                                             \
  X(cuMemcpyAsync_ptsz)                                                        \
  X(cuMemsetD8Async)                                                           \
  X(cuMemsetD8Async_ptsz)                                                      \
  X(cuMemcpy)                                                                  \
  X(cuMemcpy_ptds)                                                             \
  X(cuMemcpyHtoD_v2)                                                           \
  X(cuMemcpyHtoD_v2_ptds)                                                      \
  X(cuMemcpyDtoH_v2)                                                           \
  X(cuMemcpyDtoH_v2_ptds)                                                      \
  X(cuMemcpyDtoD_v2)                                                           \
  X(cuMemcpyDtoD_v2_ptds)                                                      \
  X(cuMemsetD8_v2)                                                             \
  X(cuMemsetD8_v2_ptds)                                                        \
  X(cuEventCreate)                                                             \
  X(cuEventRecord)                                                             \
  X(cuEventRecord_ptsz)                                                        \
  X(cuEventQuery)                                                              \
  X(cuEventSynchronize)                                                        \
  X(cuEventDestroy_v2)                                                         \
  X(cuStreamWaitEvent)                                                         \
  X(cuStreamWaitEvent_ptsz)                                                    \
  X(cuStreamBeginCapture)                                                      \
  X(cuStreamBeginCapture_v2)                                                   \
  X(cuStreamBeginCapture_v2_ptsz)                                              \
  X(cuStreamBeginCaptureToGraph)                                               \
  X(cuStreamBeginCaptureToGraph_ptsz)                                          \
  X(cuStreamEndCapture)                                                        \
  X(cuStreamEndCapture_ptsz)                                                   \
  X(cuStreamIsCapturing)                                                       \
  X(cuStreamIsCapturing_ptsz)                                                  \
  X(cuStreamGetCaptureInfo_v2)                                                 \
  X(cuStreamGetCaptureInfo_v2_ptsz)                                            \
  X(cuStreamGetCaptureInfo_v3)                                                 \
  X(cuStreamGetCaptureInfo_v3_ptsz)                                            \
  X(cuThreadExchangeStreamCaptureMode)                                         \
  X(cuGraphCreate)                                                             \
  X(cuGraphDestroy)                                                            \
  X(cuUserObjectCreate)                                                        \
  X(cuUserObjectRelease)                                                       \
  X(cuGraphRetainUserObject)                                                   \
  X(cuGraphGetNodes)                                                           \
  X(cuGraphNodeGetType)                                                        \
  X(cuGraphDestroyNode)                                                        \
  X(cuGraphInstantiate)                                                        \
  X(cuGraphInstantiate_v2)                                                     \
  X(cuGraphInstantiateWithFlags)                                               \
  X(cuGraphInstantiateWithParams)                                              \
  X(cuGraphInstantiateWithParams_ptsz)                                         \
  X(cuGraphExecDestroy)                                                        \
  X(cuGraphExecGetFlags)                                                       \
  X(cuGraphClone)                                                              \
  X(cuGraphAddChildGraphNode)                                                  \
  X(cuGraphAddNode)                                                            \
  X(cuGraphAddNode_v2)                                                         \
  X(cuGraphConditionalHandleCreate)                                            \
  X(cuGraphChildGraphNodeGetGraph)                                             \
  X(cuGraphExecChildGraphNodeSetParams)                                        \
  X(cuGraphExecNodeSetParams)                                                  \
  X(cuGraphNodeSetParams)                                                      \
  X(cuGraphNodeFindInClone)                                                    \
  X(cuGraphExecUpdate)                                                         \
  X(cuGraphExecUpdate_v2)                                                      \
  X(cuGraphLaunch)                                                             \
  X(cuGraphLaunch_ptsz)                                                        \
  X(cuMemGetAllocationGranularity)                                             \
  X(cuMemAddressReserve)                                                       \
  X(cuMemAddressFree)                                                          \
  X(cuMemCreate)                                                               \
  X(cuMemRelease)                                                              \
  X(cuMemMap)                                                                  \
  X(cuMemUnmap)                                                                \
  X(cuMemSetAccess)                                                            \
  X(cuMemExportToShareableHandle)                                              \
  X(cuMemImportFromShareableHandle)                                            \
  X(cuIpcGetMemHandle)                                                         \
  X(cuIpcOpenMemHandle_v2)                                                     \
  X(cuIpcCloseMemHandle)                                                       \
  X(cuPointerGetAttribute)                                                     \
  X(cuPointerGetAttributes)                                                    \
  X(cuGetErrorName)                                                            \
  X(cuGetErrorString)                                                          \
  X(cuGetProcAddress)                                                          \
  X(cuGetProcAddress_v2)

enum {
#define FK_ENUM(name) FK_##name,
  FK_ENTRY_POINTS(FK_ENUM)
#undef FK_ENUM
      FK_N_ENTRY_POINTS
};

static const char *const fk_names[FK_N_ENTRY_POINTS] = {
#define FK_NAME(name) #name,
    FK_ENTRY_POINTS(FK_NAME)
#undef FK_NAME
};

static atomic_llong fk_calls[FK_N_ENTRY_POINTS];

/* A sticky error (cuFakeSetStickyError): after a kernel's fault "any
 * further CUDA work will return the same error. To continue using CUDA,
 * the process must be terminated and relaunched" (CUDA 13.0's cuda.h,
 * CUDA_ERROR_ILLEGAL_ADDRESS). Every entry point answers it but those that do
 * no work in a context: naming errors, versions and entry points, the devices'
 * properties, and the thread's current context. A test hook clears it (0); a
 * real process must exit. Process-wide, every device and context alike: a
 * test cannot show another device still working. */
static atomic_int fk_sticky;
static bool fk_sticky_spares(int entry) {
  static const char *const spared[] = {"cuInit",
                                       "cuDriverGetVersion",
                                       "cuDeviceGet",
                                       "cuDeviceGetCount",
                                       "cuDeviceGetName",
                                       "cuDeviceGetAttribute",
                                       "cuDeviceTotalMem_v2",
                                       "cuCtxGetCurrent",
                                       "cuCtxSetCurrent",
                                       "cuCtxPushCurrent_v2",
                                       "cuCtxPopCurrent_v2",
                                       "cuCtxGetDevice",
                                       "cuGetErrorName",
                                       "cuGetErrorString",
                                       "cuGetProcAddress",
                                       "cuGetProcAddress_v2"};
  for (size_t i = 0; i < sizeof spared / sizeof spared[0]; i++)
    if (strcmp(fk_names[entry], spared[i]) == 0)
      return true;
  return false;
}
void cuFakeSetStickyError(CUresult code);
void cuFakeSetStickyError(CUresult code) {
  atomic_store(&fk_sticky, (int)code);
}

/* Test hooks on one entry point (by its exported name), for the failure
 * paths a driver takes only rarely:
 * cuFakeRefuse(name, code, times): its next `times` calls (-1: every call
 * until a call with times 0) answer code and do nothing, as a driver
 * refusing the call would;
 * cuFakeBeforeCall(name, fn, arg): its next call first runs fn(arg), on the
 * calling thread, before anything else (once), so that a test can act
 * between the library's steps around that call.
 * Both run after the host-function and sticky-error checks, which they
 * leave as they are. */
static atomic_bool fk_hooked;
static atomic_long fk_refuse_left[FK_N_ENTRY_POINTS];
static atomic_int fk_refuse_code[FK_N_ENTRY_POINTS];
static atomic_int fk_before_entry = -1;
static void (*_Atomic fk_before_fn)(void *);
static void *_Atomic fk_before_arg;

static CUresult fk_hook(int entry) {
  int want = entry;
  if (atomic_load(&fk_before_entry) == entry &&
      atomic_compare_exchange_strong(&fk_before_entry, &want, -1)) {
    void (*fn)(void *) = atomic_load(&fk_before_fn);
    fn(atomic_load(&fk_before_arg));
  }
  long left = atomic_load(&fk_refuse_left[entry]);
  while (left != 0) {
    if (left < 0 ||
        atomic_compare_exchange_weak(&fk_refuse_left[entry], &left, left - 1))
      return (CUresult)atomic_load(&fk_refuse_code[entry]);
  }
  return CUDA_SUCCESS;
}

/* Counts a call; a call from a host function is refused: "The host function
 * must not make any CUDA API calls" (cuda.h, cuLaunchHostFunc; the
 * Programming Guide's "Host Functions (Callbacks)"), the real driver's answer
 * being CUDA_ERROR_NOT_PERMITTED. */
#define FK_COUNT(name)                                                         \
  do {                                                                         \
    atomic_fetch_add_explicit(&fk_calls[FK_##name], 1, memory_order_relaxed);  \
    if (fk_in_host_fn) {                                                       \
      atomic_fetch_add(&fk_not_permitted, 1);                                  \
      return CUDA_ERROR_NOT_PERMITTED;                                         \
    }                                                                          \
    int fk_sticky_ = atomic_load_explicit(&fk_sticky, memory_order_relaxed);   \
    if (MP__UNLIKELY(fk_sticky_ != 0) && !fk_sticky_spares(FK_##name))         \
      return (CUresult)fk_sticky_;                                             \
    if (MP__UNLIKELY(                                                          \
            atomic_load_explicit(&fk_hooked, memory_order_relaxed))) {         \
      CUresult fk_refused_ = fk_hook(FK_##name);                               \
      if (fk_refused_ != CUDA_SUCCESS)                                         \
        return fk_refused_;                                                    \
    }                                                                          \
  } while (0)

/* The index of the entry point exported as name, or -1. */
static int fk_entry_of(const char *name) {
  for (int i = 0; name != NULL && i < FK_N_ENTRY_POINTS; i++)
    if (strcmp(fk_names[i], name) == 0)
      return i;
  return -1;
}

/* fk_hook's refusals; false for a name the fake does not export. */
bool cuFakeRefuse(const char *name, CUresult code, long times);
bool cuFakeRefuse(const char *name, CUresult code, long times) {
  int i = fk_entry_of(name);
  if (i < 0)
    return false;
  atomic_store(&fk_refuse_code[i], (int)code);
  atomic_store(&fk_refuse_left[i], times);
  atomic_store(&fk_hooked, true);
  return true;
}

/* fk_hook's call before; false for a name the fake does not export. */
bool cuFakeBeforeCall(const char *name, void (*fn)(void *), void *arg);
bool cuFakeBeforeCall(const char *name, void (*fn)(void *), void *arg) {
  int i = fk_entry_of(name);
  if (i < 0 || fn == NULL)
    return false;
  atomic_store(&fk_before_fn, fn);
  atomic_store(&fk_before_arg, arg);
  atomic_store(&fk_before_entry, i);
  atomic_store(&fk_hooked, true);
  return true;
}

long long cuFakeGetCallCount(const char *name) {
  int i = fk_entry_of(name);
  return i < 0 ? -1 : atomic_load(&fk_calls[i]);
}

void cuFakeResetCallCounts(void) {
  for (int i = 0; i < FK_N_ENTRY_POINTS; i++)
    atomic_store(&fk_calls[i], 0);
}

/* FAKECUDA_CALL_REPORT=1: at exit, every entry point called at least once
 * and how often, one "fakecuda: calls NAME N" line each on stderr (counts
 * for programs the tests cannot reach, such as mpbench). */
__attribute__((destructor)) static void fk_call_report(void) {
  const char *v = getenv("FAKECUDA_CALL_REPORT");
  if (v == NULL || v[0] == '\0' || strcmp(v, "0") == 0)
    return;
  for (int i = 0; i < FK_N_ENTRY_POINTS; i++) {
    long long n = atomic_load(&fk_calls[i]);
    if (n > 0)
      fprintf(stderr, "fakecuda: calls %s %lld\n", fk_names[i], n);
  }
}

/* ---- state --------------------------------------------------------------- */

#define FK_MAX_DEVICES   8
#define FK_MAX_CTX_DEPTH 32
#define FK_DEFAULT_NAME  "mempool fakecuda device"

/* The primary context of one fake device; CUcontext points at it. */
struct fk_stream;
struct CUctx_st {
  int ordinal;
  int refs;                   /* primary context retains; under fk.lock */
  bool created;               /* by cuCtxCreate, not a primary context */
  _Atomic(mp_device_t *) dev; /* the host device, NULL until needed */
  /* Under fk.lock: the streams made in the context (CUstream points at
   * one), those destroyed whose work may still run, the event re-recorded
   * at the legacy stream's end, and a count of the context's lives (a
   * thread's per-thread stream of an earlier life is gone). */
  struct fk_stream *live, *retired;
  mp_event_t legacy_tail;
  unsigned generation;
  /* Bytes of the device's physical memory cuMemCreate handed out that no
   * mapping holds (fk_phys_count), under fk.lock. */
  size_t unbacked;
  /* Under fk.lock: the next context cuCtxCreate made (fk.created). */
  struct CUctx_st *next_created;
};

/* A physical allocation from cuMemCreate (or an imported one); a handle
 * is its id, valid while it is listed (fk.phys) and not released
 * (fk_phys_valid). */
typedef struct fk_phys {
  CUmemGenericAllocationHandle id; /* never reused (fk.next_phys_id) */
  size_t size; /* 0 for an imported handle: the importer gives the size */
  int ordinal;
  int maps;      /* live mappings; under fk.lock */
  bool released; /* cuMemRelease called; freed with its last mapping */
  CUmemAllocationHandleType types; /* requestedHandleTypes at cuMemCreate */
  int import_fd; /* cuMemImportFromShareableHandle: the memory; else -1 */
  /* The primary context whose device memory it is (NULL: imported, or that
   * device was closed, which freed it), and the list of every handle. */
  struct CUctx_st *ctx;
  struct fk_phys *next;
} fk_phys_t;

/* One range of device addresses handed out: an allocation or a mapping. */
typedef struct fk_range {
  uintptr_t base;
  size_t size;
  const struct CUctx_st *ctx; /* the context it was made in */
  fk_phys_t *phys;            /* mappings only */
  unsigned access;            /* mappings: devices that may read it (a bit
                                 per ordinal, cuMemSetAccess) */
  unsigned writable;          /* mappings: devices that may also write it */
  int ipc_fd;                 /* allocations: the descriptor cuIpcGetMemHandle
                                 exported (closed at cuMemFree), or -1 */
  bool ipc_open;              /* a cuIpcOpenMemHandle mapping */
  uint64_t ipc_serial;        /* allocations: their handles' serial (0: none
                                 yet); opened mappings: the handle's */
  int32_t ipc_pid;            /* opened mappings: the exporter */
  unsigned ipc_refs;          /* opened mappings: opens not yet closed */
  bool stream_ordered;        /* cuMemAllocAsync's, not cuMemAlloc's */
  unsigned char gout;         /* allocations of a graph's memory nodes:
                                 FK_GOUT_* (0: none) */
} fk_range_t;

/* A graph allocation's state (the Programming Guide, "Graph Memory Nodes":
 * "Graph allocations are considered recreated every time a graph runs";
 * its lifetime "begins when GPU execution reaches the allocating graph
 * node" and ends at its free). The fake allocates the memory at capture,
 * at the address every launch gives, and keeps these states: */
enum {
  FK_GOUT_IDLE = 1,  /* not allocated: before a launch, or freed since */
  FK_GOUT_LIVE = 2,  /* a launch allocated it, not yet freed */
  FK_GOUT_INNER = 3, /* freed inside a graph: cuda.h, cuGraphAddMemAllocNode,
                        "These allocations cannot be freed outside the
                        owning graph" */
};

static struct {
  pthread_mutex_t lock; /* everything below but `ready` */
  atomic_int ready;     /* 1 once cuInit succeeded */
  bool initialized;
  CUresult init_result;
  int count;
  bool no_vmm;
  bool no_shareable;
  /* The last cuMemCreate's prop (cuFakeLastMemCreate), under fk.lock. */
  CUmemAllocationHandleType last_handle_types;
  int last_rdma;
  char spec[FK_MAX_DEVICES][512]; /* "host:<FAKECUDA_DEVICE[_N]>" */
  char name[128];
  struct CUctx_st ctx[FK_MAX_DEVICES];
  /* Every context cuCtxCreate made, newest first; a destroyed one stays
   * (its streams are forgotten), as its handle may still be passed. */
  struct CUctx_st *created;
  fk_range_t *ranges; /* sorted by base */
  size_t n_ranges, cap_ranges;
  fk_phys_t *phys; /* every handle not yet freed, listed through next */
  CUmemGenericAllocationHandle next_phys_id; /* the last handle given out */
} fk = {.lock = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local struct CUctx_st *fk_stack[FK_MAX_CTX_DEPTH];
static _Thread_local int fk_depth;

/* Set while a host function (cuLaunchHostFunc) runs on this thread. */
static _Thread_local bool fk_in_host_fn;

/* Errors a test may count (cuFakeGetErrorCount): uses of invalid handles,
 * CUDA calls from host functions, unsafe calls during a capture, copies
 * and memsets of mappings without access. */
static atomic_llong fk_bad_handles, fk_not_permitted, fk_capture_refusals;
/* Copies and memsets refused for want of access (fk_access_ok). */
static atomic_llong fk_illegal_addresses;

/* Test hook: what the last cuMemCreate asked for. */
void cuFakeLastMemCreate(int *handle_types, int *rdma);
void cuFakeLastMemCreate(int *handle_types, int *rdma) {
  pthread_mutex_lock(&fk.lock);
  *handle_types = (int)fk.last_handle_types;
  *rdma = fk.last_rdma;
  pthread_mutex_unlock(&fk.lock);
}

long long cuFakeGetErrorCount(CUresult code);
long long cuFakeGetErrorCount(CUresult code) {
  switch (code) {
  case CUDA_ERROR_INVALID_HANDLE: return atomic_load(&fk_bad_handles);
  case CUDA_ERROR_NOT_PERMITTED: return atomic_load(&fk_not_permitted);
  case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
    return atomic_load(&fk_capture_refusals);
  case CUDA_ERROR_ILLEGAL_ADDRESS: return atomic_load(&fk_illegal_addresses);
  default: return -1;
  }
}

static CUresult fk_bad_handle(void) {
  atomic_fetch_add(&fk_bad_handles, 1);
  return CUDA_ERROR_INVALID_HANDLE;
}

static CUresult fk_result_of(mp_status_t st) {
  switch (st) {
  case MP_OK: return CUDA_SUCCESS;
  case MP_EINVAL: return CUDA_ERROR_INVALID_VALUE;
  case MP_ENOMEM:
  case MP_ELIMIT: return CUDA_ERROR_OUT_OF_MEMORY;
  case MP_ENODEV: return CUDA_ERROR_NO_DEVICE;
  case MP_EBUSY: return CUDA_ERROR_NOT_READY;
  case MP_ENOTSUP: return CUDA_ERROR_NOT_SUPPORTED;
  default: return CUDA_ERROR_UNKNOWN;
  }
}

static bool fk_env_flag(const char *name) {
  const char *v = getenv(name);
  return v != NULL && v[0] != '\0' && strcmp(v, "0") != 0;
}

static bool fk_env_flag_is(const char *name, const char *value) {
  const char *v = getenv(name);
  return v != NULL && strcmp(v, value) == 0;
}

/* The handles of the streams destroyed (under fk.lock). A destroyed
 * stream's handle is undefined behaviour in a real driver, which may crash:
 * an H200 (driver 580.159.04, 2026-11-28) died in cuEventRecord and in
 * cuStreamIsCapturing given one. So a use of one here stops the process
 * with a message, unless FAKECUDA_DEAD_STREAMS=refuse asks for the
 * CUDA_ERROR_INVALID_HANDLE answer (for a test of a caller's check of
 * such a handle, which no GPU twin runs). */
static CUstream *fk_dead; /* every destroyed handle not yet reused */
static size_t fk_ndead, fk_dead_cap;

/* arr (n used of *cap elements of elem bytes) with room for one more:
 * itself, or a copy twice as big; NULL (arr untouched) without host
 * memory. */
static void *fk_room(void *arr, size_t n, size_t *cap, size_t elem) {
  if (n < *cap)
    return arr;
  size_t c = *cap ? 2 * *cap : 64;
  void *p = realloc(arr, c * elem);
  if (p != NULL)
    *cap = c;
  return p;
}

/* A destroyed handle, remembered for good (until a new stream gets the
 * same address: fk_dead_forget). Without host memory it is not
 * remembered, and a later use is only refused. */
static void fk_dead_add(CUstream h) {
  CUstream *d = fk_room(fk_dead, fk_ndead, &fk_dead_cap, sizeof *d);
  if (d == NULL)
    return;
  fk_dead = d;
  fk_dead[fk_ndead++] = h;
}

static void fk_dead_forget(CUstream h) {
  for (size_t i = 0; i < fk_ndead; i++)
    if (fk_dead[i] == h) {
      fk_dead[i] = fk_dead[--fk_ndead];
      return;
    }
}

static CUresult fk_dead_or_bad(CUstream h) {
  for (size_t i = 0; i < fk_ndead; i++)
    if (h != NULL && fk_dead[i] == h &&
        !fk_env_flag_is("FAKECUDA_DEAD_STREAMS", "refuse")) {
      fprintf(stderr,
              "fakecuda: stream %p used after cuStreamDestroy: undefined "
              "behaviour (a GPU may crash here)\n",
              (void *)h);
      abort();
    }
  return fk_bad_handle();
}

/* The host device behind ordinal, opened on first need. */
static mp_device_t *fk_host(int ordinal) {
  struct CUctx_st *c = &fk.ctx[ordinal];
  mp_device_t *dev = atomic_load(&c->dev);
  if (dev != NULL)
    return dev;
  pthread_mutex_lock(&fk.lock);
  dev = atomic_load(&c->dev);
  if (dev == NULL) {
    if (mp_device_open(fk.spec[ordinal], &dev) == MP_OK)
      atomic_store(&c->dev, dev);
    else
      fprintf(stderr, "fakecuda: cannot open '%s': %s\n", fk.spec[ordinal],
              mp_last_error());
  }
  pthread_mutex_unlock(&fk.lock);
  return dev;
}

static bool fk_valid_device(CUdevice d) {
  return atomic_load(&fk.ready) && d >= 0 && d < fk.count;
}

/* The current context's host device, or NULL (no or a destroyed context). */
static mp_device_t *fk_current(void) {
  if (!atomic_load(&fk.ready) || fk_depth == 0)
    return NULL;
  return atomic_load(&fk_stack[fk_depth - 1]->dev);
}

#define FK_NEED_INIT()                                                         \
  do {                                                                         \
    if (!atomic_load(&fk.ready))                                               \
      return CUDA_ERROR_NOT_INITIALIZED;                                       \
  } while (0)

#define FK_CURRENT(dev)                                                        \
  mp_device_t *dev = fk_current();                                             \
  do {                                                                         \
    if (!atomic_load(&fk.ready))                                               \
      return CUDA_ERROR_NOT_INITIALIZED;                                       \
    if (dev == NULL)                                                           \
      return CUDA_ERROR_INVALID_CONTEXT;                                       \
  } while (0)

/* ---- streams as CUDA orders them ---------------------------------------- */

/* Streams one capture may span: its origin and those joined to it. */
#define FK_CAP_STREAMS 16

/* A stream made by cuStreamCreate, or a thread's per-thread default stream;
 * CUstream points at one. Blocking streams (flags 0, and every per-thread
 * stream) are ordered with the legacy NULL stream; CU_STREAM_NON_BLOCKING
 * ones are not. */
typedef struct fk_stream {
  mp_stream_t s;   /* the host stream that runs it */
  mp_event_t tail; /* re-recorded at its end when the legacy stream waits */
  bool blocking;
  struct fk_stream *next; /* in its context's live or retired list */
  /* Stream capture (under fk.lock): status, the mode it began with, the
   * thread that began it, its id, the graph being built, the events
   * recorded into it, and the next capturing stream (fk_capturing). A
   * stream that joined a capture (fk_capture_join) has these of its
   * origin, whose graph it shares, and cap_origin set; cap_slot is its
   * place in the capture's clocks (the origin's: 0), cap_width (the
   * origin's) how many places are taken. cap_clock[k]: how many nodes of
   * stream k this stream's next node comes after. */
  CUstreamCaptureStatus cap;
  CUstreamCaptureMode cap_mode;
  pthread_t cap_thread;
  cuuint64_t cap_id;
  struct CUgraph_st *graph;
  bool cap_into; /* graph is the program's (cuStreamBeginCaptureToGraph) */
  struct fk_cap_event *cap_events;
  size_t n_cap_events, cap_cap_events;
  struct fk_stream *cap_next, *cap_origin;
  unsigned cap_slot, cap_width;
  uint64_t cap_clock[FK_CAP_STREAMS];
} fk_stream_t;

/* An event recorded on a capturing stream: what a wait on it comes after. */
typedef struct fk_cap_event {
  CUevent ev;
  uint64_t clock[FK_CAP_STREAMS];
} fk_cap_event_t;

/* ---- graphs (opaque; what stream capture records) ------------------------ */

/* One captured operation. */
typedef struct fk_node {
  CUgraphNodeType type; /* HOST, MEMSET, MEMCPY, MEM_ALLOC, MEM_FREE, GRAPH */
  CUhostFn fn;
  void *arg;
  CUdeviceptr dst, src; /* MEM_ALLOC, MEM_FREE: the memory in dst */
  unsigned char value;
  size_t n; /* GRAPH: how many nodes before it are its graph's copies */
  /* GRAPH, the node a child graph node call returned: its embedded graph
   * (cuGraphChildGraphNodeGetGraph), the node's own, freed with it; NULL
   * in the copies of it in other graphs and executables. */
  struct CUgraph_st *child;
  /* Which node of a graph it is: its copy in an executable keeps it
   * (cuGraphExecNodeSetParams names an executable's node by its graph's). */
  unsigned long long id;
  /* The graph the node is in (fk_graph_add), for cuGraphNodeSetParams,
   * which names no graph; not read in an executable's copies. */
  struct CUgraph_st *in;
  /* In a clone (cuGraphClone), the id of the original's node it copies,
   * for cuGraphNodeFindInClone; 0 in any other node. */
  unsigned long long from;
  /* CONDITIONAL, the node cuGraphAddNode returned: its nbodies body graphs
   * (CUDA_CONDITIONAL_NODE_PARAMS.phGraph_out, "CUDA-owned", "Valid for
   * the lifetime of the conditional node"), freed with it; NULL in the
   * copies of it. */
  struct CUgraph_st **bodies;
  unsigned nbodies;
} fk_node_t;

/* A user object (cuUserObjectCreate): its destructor runs on the fake's
 * destructor thread (fk_dtor_queue), after the last reference goes: the
 * creator's, a graph's or an executable's. */
struct CUuserObject_st {
  atomic_uint refs;
  void *ptr;
  CUhostFn destroy;
};

/* References a graph or an executable holds on user objects. */
typedef struct fk_urefs {
  struct CUuserObject_st **objs;
  unsigned *counts;
  size_t n;
} fk_urefs_t;

/* A device address of a graph's memory, on its device. */
typedef struct fk_gaddr {
  mp_device_t *dev;
  CUdeviceptr p;
} fk_gaddr_t;

typedef struct fk_glist {
  fk_gaddr_t *a;
  size_t n, cap;
} fk_glist_t;

/* The memory of a graph's memory nodes, which the fake allocates at
 * capture, at the address every replay uses: `mem`, what the graph frees
 * inside itself (an allocation node and its free node), and `outs`, its
 * allocation nodes not freed inside it, allocated again by each launch
 * (FK_GOUT_*). An executable graph stands alone once made: "the graph may
 * be destroyed" after cuGraphInstantiate (cuda.h), and an executable owns
 * the physical memory of its allocations (the Programming Guide, "Graph
 * Memory Nodes"). So the memory is the graph's and every executable's made
 * from it, freed when the last of them is destroyed (before 2026-12-01 the
 * graph's destruction freed it under its executables, whose replays then
 * wrote freed memory), but for outputs live then: "Graph destruction does
 * not automatically free any live graph-allocated memory" (the same
 * section), so those become the program's to free. Its fields under
 * fk.lock. */
typedef struct fk_gmem {
  unsigned refs;
  fk_glist_t mem, outs;
  /* Other graphs' outputs this graph frees (cuda.h, cuGraphAddMemAllocNode:
   * an allocation not freed in its graph can be freed by "launching a
   * graph with a free node for that allocation"): each launch frees them,
   * and they stay their graph's. */
  fk_glist_t frees;
} fk_gmem_t;

/* A graph is its nodes in capture order (a linear chain: one stream's
 * capture); an executable graph is a copy of them. Both hold their user
 * objects and the graph's own memory. */
struct CUgraph_st {
  fk_node_t **nodes;
  size_t n, cap;
  fk_urefs_t urefs;
  fk_gmem_t *gmem; /* NULL: no memory node */
  /* Moved into a parent's child graph node (cuda.h,
   * CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE): the parent's, destroyed with it. */
  bool moved;
};
struct CUgraphExec_st {
  fk_node_t *nodes;
  size_t n;
  fk_urefs_t urefs;
  fk_gmem_t *gmem; /* its graph's, one reference more */
  bool auto_free;  /* CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH */
  unsigned long long flags; /* those it was instantiated with, but UPLOAD */
};

static bool fk_glist_push(fk_glist_t *l, mp_device_t *dev, CUdeviceptr p) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 4;
    void *q = realloc(l->a, cap * sizeof *l->a);
    if (q == NULL)
      return false;
    l->a = q;
    l->cap = cap;
  }
  l->a[l->n].dev = dev;
  l->a[l->n++].p = p;
  return true;
}

static fk_range_t *fk_range_at(uintptr_t base);

/* Graph g has a memory node for p: an allocation node (freed false), an
 * output until a free node in g frees it (freed true), which makes p
 * memory g frees inside itself. Under fk.lock. */
static bool fk_gmem_own(struct CUgraph_st *g, mp_device_t *dev, CUdeviceptr p,
                        bool freed) {
  fk_gmem_t *m = g->gmem;
  if (m == NULL && (m = g->gmem = calloc(1, sizeof *m)) != NULL)
    m->refs = 1;
  if (m == NULL)
    return false;
  bool mine = !freed;
  for (size_t i = 0; freed && !mine && i < m->outs.n; i++)
    mine = m->outs.a[i].p == p;
  fk_range_t *r = fk_range_at(p);
  if (!mine && r != NULL &&
      (r->gout == FK_GOUT_IDLE || r->gout == FK_GOUT_LIVE))
    return fk_glist_push(&m->frees, dev, p); /* another graph's output */
  if (!fk_glist_push(freed ? &m->mem : &m->outs, dev, p))
    return false;
  for (size_t i = 0; freed && i < m->outs.n; i++)
    if (m->outs.a[i].p == p) {
      m->outs.a[i] = m->outs.a[--m->outs.n];
      break;
    }
  if (r != NULL)
    r->gout = freed ? FK_GOUT_INNER : FK_GOUT_IDLE;
  return true;
}

/* The last reference to m went: its outputs live now become the
 * program's, and the others join m->mem, which the caller frees. Under
 * fk.lock. */
static void fk_gmem_orphan(fk_gmem_t *m) {
  for (size_t i = 0; i < m->outs.n; i++) {
    fk_range_t *r = fk_range_at(m->outs.a[i].p);
    if (r == NULL || r->gout != FK_GOUT_IDLE) {
      if (r != NULL && r->gout == FK_GOUT_LIVE)
        r->gout = 0;
      continue;
    }
    if (!fk_glist_push(&m->mem, m->outs.a[i].dev, m->outs.a[i].p))
      r->gout = 0; /* no room to free it: the program's, leaked */
  }
  free(m->outs.a);
  free(m->frees.a);
}

/* Drops a reference to *gm (taken from its holder, which no longer has
 * it): the last one frees the memory. Takes fk.lock, so not under it. */
static CUresult fk_free(mp_device_t *dev, CUdeviceptr dptr);
static void fk_gmem_drop(fk_gmem_t **gm) {
  pthread_mutex_lock(&fk.lock);
  fk_gmem_t *m = *gm;
  *gm = NULL;
  bool last = m != NULL && --m->refs == 0;
  if (last)
    fk_gmem_orphan(m);
  pthread_mutex_unlock(&fk.lock);
  if (!last)
    return;
  for (size_t i = 0; i < m->mem.n; i++)
    (void)fk_free(m->mem.a[i].dev, m->mem.a[i].p);
  free(m->mem.a);
  free(m);
}

/* Destructors run on one thread of the fake's own, in turn, never on the
 * thread that dropped the last reference, which does not wait for them:
 * "Destructor callbacks cannot make CUDA API calls and should avoid
 * blocking behavior, as they are executed by a shared internal thread"
 * (cuda.h, cuUserObjectCreate), and CU_USER_OBJECT_NO_DESTRUCTOR_SYNC, the
 * one flag allowed, says "the destructor execution is not synchronized by
 * any CUDA handle" (cuda.h, CUuserObject_flags): nothing the caller does
 * waits for it. CUDA calls made there are refused as in a host function.
 * Run inline, as the fake did before, a destructor could not race with
 * the thread that destroyed the graph, nor be found not to have run yet.
 * Destructors still queued at exit do not run. */
typedef struct fk_dtor {
  CUhostFn fn;
  void *ptr;
  struct fk_dtor *next;
} fk_dtor_t;
static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  fk_dtor_t *head, *tail;
  bool started;
} fk_dtors = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void *fk_dtor_main(void *unused) {
  (void)unused;
  fk_in_host_fn = true; /* for the thread's life */
  pthread_mutex_lock(&fk_dtors.mu);
  for (;;) {
    while (fk_dtors.head == NULL)
      pthread_cond_wait(&fk_dtors.cv, &fk_dtors.mu);
    fk_dtor_t *d = fk_dtors.head;
    fk_dtors.head = d->next;
    if (fk_dtors.head == NULL)
      fk_dtors.tail = NULL;
    pthread_mutex_unlock(&fk_dtors.mu);
    d->fn(d->ptr);
    free(d);
    pthread_mutex_lock(&fk_dtors.mu);
  }
  return NULL;
}

/* Queues fn(ptr) for the destructor thread, started on first use; where
 * no thread or memory can be had, runs it here (refusing CUDA calls), so
 * it is never lost. */
static void fk_dtor_queue(CUhostFn fn, void *ptr) {
  fk_dtor_t *d = malloc(sizeof *d);
  pthread_mutex_lock(&fk_dtors.mu);
  if (d != NULL && !fk_dtors.started) {
    pthread_t t;
    pthread_attr_t a;
    if (pthread_attr_init(&a) == 0) {
      (void)pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
      fk_dtors.started = pthread_create(&t, &a, fk_dtor_main, NULL) == 0;
      (void)pthread_attr_destroy(&a);
    }
  }
  if (d == NULL || !fk_dtors.started) {
    pthread_mutex_unlock(&fk_dtors.mu);
    free(d);
    bool was = fk_in_host_fn;
    fk_in_host_fn = true;
    fn(ptr);
    fk_in_host_fn = was;
    return;
  }
  *d = (fk_dtor_t){.fn = fn, .ptr = ptr};
  if (fk_dtors.tail != NULL)
    fk_dtors.tail->next = d;
  else
    fk_dtors.head = d;
  fk_dtors.tail = d;
  pthread_cond_signal(&fk_dtors.cv);
  pthread_mutex_unlock(&fk_dtors.mu);
}

/* Drops count references of o; the last queues its destructor
 * (fk_dtor_queue). */
static void fk_uobj_release(struct CUuserObject_st *o, unsigned count) {
  if (atomic_fetch_sub(&o->refs, count) != count)
    return;
  fk_dtor_queue(o->destroy, o->ptr);
  free(o);
}

/* Adds count references of o to r (o's count goes up unless moved). */
static bool fk_urefs_add(fk_urefs_t *r, struct CUuserObject_st *o,
                         unsigned count, bool move) {
  struct CUuserObject_st **objs =
      realloc(r->objs, (r->n + 1) * sizeof *r->objs);
  if (objs == NULL)
    return false;
  r->objs = objs;
  unsigned *counts = realloc(r->counts, (r->n + 1) * sizeof *r->counts);
  if (counts == NULL)
    return false;
  r->counts = counts;
  if (!move)
    atomic_fetch_add(&o->refs, count);
  r->objs[r->n] = o;
  r->counts[r->n++] = count;
  return true;
}

static void fk_urefs_drop(fk_urefs_t *r) {
  for (size_t i = 0; i < r->n; i++)
    fk_uobj_release(r->objs[i], r->counts[i]);
  free(r->objs);
  free(r->counts);
  memset(r, 0, sizeof *r);
}

static bool fk_graph_add(struct CUgraph_st *g, const fk_node_t *node) {
  if (g->n == g->cap) {
    size_t cap = g->cap ? 2 * g->cap : 8;
    fk_node_t **p = realloc(g->nodes, cap * sizeof *p);
    if (p == NULL)
      return false;
    g->nodes = p;
    g->cap = cap;
  }
  fk_node_t *copy = malloc(sizeof *copy);
  if (copy == NULL)
    return false;
  static atomic_ullong ids;
  *copy = *node;
  copy->id = atomic_fetch_add(&ids, 1) + 1;
  copy->in = g;
  copy->from = 0;
  g->nodes[g->n++] = copy;
  return true;
}

static void fk_graph_free(struct CUgraph_st *g) {
  if (g == NULL)
    return;
  /* A graph dropped unfinished (an invalidated capture), under fk.lock:
   * no executable was made from it; its memory stays allocated, as
   * before, the program's. cuGraphDestroy takes gmem first. */
  if (g->gmem != NULL && --g->gmem->refs == 0) {
    for (size_t i = 0; i < g->gmem->outs.n; i++) {
      fk_range_t *r = fk_range_at(g->gmem->outs.a[i].p);
      if (r != NULL)
        r->gout = 0;
    }
    free(g->gmem->outs.a);
    free(g->gmem->frees.a);
    free(g->gmem->mem.a);
    free(g->gmem);
  }
  for (size_t i = 0; i < g->n; i++) {
    fk_graph_free(g->nodes[i]->child); /* a child graph node's own */
    for (unsigned k = 0; k < g->nodes[i]->nbodies; k++)
      fk_graph_free(g->nodes[i]->bodies[k]); /* a conditional node's own */
    free(g->nodes[i]->bodies);
    free(g->nodes[i]);
  }
  free(g->nodes);
  fk_urefs_drop(&g->urefs);
  free(g);
}

/* Capturing streams of every context, and how many there are. */
static fk_stream_t *fk_capturing;
static atomic_int fk_n_captures;
static atomic_ullong fk_next_capture_id = 1;
/* This thread's capture mode (cuThreadExchangeStreamCaptureMode). */
static _Thread_local CUstreamCaptureMode fk_thread_mode =
    CU_STREAM_CAPTURE_MODE_GLOBAL;

/* The stream st's capture began on. */
static fk_stream_t *fk_capture_origin(fk_stream_t *st) {
  return st->cap_origin != NULL ? st->cap_origin : st;
}

/* Ends st's capture, its graph returned (NULL: dropped; a graph the
 * program captures into, cuStreamBeginCaptureToGraph, is its own and only
 * not returned). The capture of an
 * origin takes every stream joined to it out of capture too (the
 * Programming Guide, "Cross-stream Dependencies and Events": "All streams
 * being captured to the same capture graph are taken out of capture mode
 * upon cudaStreamEndCapture()"); a joined stream (one destroyed) leaves
 * alone, its graph the origin's. Under fk.lock. */
/* Events whose last record was made in a capture that has ended: still
 * "last recorded in a capturing stream" (cuda.h, CUDA_ERROR_CAPTURED_EVENT)
 * until recorded again outside a capture or destroyed. Under fk.lock. */
static CUevent *fk_stale_caps;
static size_t fk_nstale_caps, fk_stale_caps_cap;
static void fk_stale_cap_add(CUevent e) {
  for (size_t i = 0; i < fk_nstale_caps; i++)
    if (fk_stale_caps[i] == e)
      return;
  if (fk_nstale_caps == fk_stale_caps_cap) {
    size_t c = fk_stale_caps_cap ? 2 * fk_stale_caps_cap : 16;
    CUevent *n = realloc(fk_stale_caps, c * sizeof *n);
    if (n == NULL)
      return;
    fk_stale_caps = n;
    fk_stale_caps_cap = c;
  }
  fk_stale_caps[fk_nstale_caps++] = e;
}
static bool fk_stale_cap_take(CUevent e, bool take) {
  for (size_t i = 0; i < fk_nstale_caps; i++)
    if (fk_stale_caps[i] == e) {
      if (take)
        fk_stale_caps[i] = fk_stale_caps[--fk_nstale_caps];
      return true;
    }
  return false;
}

static struct CUgraph_st *fk_capture_end(fk_stream_t *st, bool keep) {
  for (fk_stream_t *o = fk_capturing; st->cap_origin == NULL && o != NULL;) {
    if (o->cap_origin == st) {
      (void)fk_capture_end(o, false);
      o = fk_capturing; /* the list changed */
    } else {
      o = o->cap_next;
    }
  }
  for (fk_stream_t **at = &fk_capturing; *at != NULL; at = &(*at)->cap_next)
    if (*at == st) {
      *at = st->cap_next;
      atomic_fetch_sub(&fk_n_captures, 1);
      break;
    }
  struct CUgraph_st *g = st->cap_origin == NULL ? st->graph : NULL;
  bool into = st->cap_into;
  st->graph = NULL;
  st->cap_into = false;
  st->cap = CU_STREAM_CAPTURE_STATUS_NONE;
  st->cap_next = st->cap_origin = NULL;
  st->cap_slot = st->cap_width = 0;
  memset(st->cap_clock, 0, sizeof st->cap_clock);
  for (size_t i = 0; i < st->n_cap_events; i++)
    fk_stale_cap_add(st->cap_events[i].ev);
  free(st->cap_events);
  st->cap_events = NULL;
  st->n_cap_events = st->cap_cap_events = 0;
  if (!keep) {
    if (!into) /* the program's graph stays the program's */
      fk_graph_free(g);
    g = NULL;
  }
  return g;
}

/* Invalidates st's capture: every stream captured into its graph.
 * Under fk.lock. */
static void fk_capture_invalidate(fk_stream_t *st) {
  fk_stream_t *origin = fk_capture_origin(st);
  for (fk_stream_t *o = fk_capturing; o != NULL; o = o->cap_next)
    if (fk_capture_origin(o) == origin)
      o->cap = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
}

/* A potentially unsafe call during stream capture (cuda.h,
 * cuThreadExchangeStreamCaptureMode: allocation and free through
 * cuMemAlloc/cuMemFree and the host allocators, cuCtxSynchronize,
 * synchronous copies, waiting on the legacy stream): refused with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED when this thread's mode prohibits
 * it, and the captures that prohibit it are invalidated (cuStreamEndCapture
 * then says CUDA_ERROR_STREAM_CAPTURE_INVALIDATED). Global mode: this
 * thread's own capture not begun relaxed, or any other thread's capture
 * begun global; thread-local: only this thread's own; relaxed: never. */
static CUresult fk_unsafe(void) {
  if (atomic_load(&fk_n_captures) == 0 ||
      fk_thread_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_SUCCESS;
  bool refused = false;
  pthread_mutex_lock(&fk.lock);
  for (fk_stream_t *st = fk_capturing; st != NULL; st = st->cap_next) {
    bool mine = pthread_equal(st->cap_thread, pthread_self());
    bool prohibits = mine ? st->cap_mode != CU_STREAM_CAPTURE_MODE_RELAXED
                          : fk_thread_mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
                                st->cap_mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
    if (prohibits) {
      refused = true;
      fk_capture_invalidate(st);
    }
  }
  pthread_mutex_unlock(&fk.lock);
  if (!refused)
    return CUDA_SUCCESS;
  atomic_fetch_add(&fk_capture_refusals, 1);
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

/* A refusal with code that invalidates st's capture (waiting on or asking
 * a capturing stream, querying a captured event): these conflict with
 * capture in every mode. Under fk.lock. */
static CUresult fk_capture_conflict(fk_stream_t *st, CUresult code) {
  fk_capture_invalidate(st);
  atomic_fetch_add(&fk_capture_refusals, 1);
  return code;
}

/* A blocking stream of context c that captures, or NULL. While one does,
 * the legacy stream is "in an unusable state" (cuda.h, cuStreamIsCapturing):
 * cuStreamIsCapturing on it answers CUDA_ERROR_STREAM_CAPTURE_IMPLICIT and
 * leaves the capture alone, while work on it or a query or wait of it is
 * refused with that code and invalidates the capture, in every mode (seen
 * on an H200, driver 580.159.04, 2026-11-28, with cuStreamQuery in global
 * and relaxed mode). Under fk.lock. */
static fk_stream_t *fk_blocking_capture(struct CUctx_st *c) {
  for (fk_stream_t *o = c->live; o != NULL; o = o->next)
    if (o->blocking && o->cap != CU_STREAM_CAPTURE_STATUS_NONE)
      return o;
  return NULL;
}

#define FK_UNSAFE()                                                            \
  do {                                                                         \
    CUresult fk_unsafe_r_ = fk_unsafe();                                       \
    if (fk_unsafe_r_ != CUDA_SUCCESS)                                          \
      return fk_unsafe_r_;                                                     \
  } while (0)

/* The virtual memory and IPC calls that make, map, share or give back
 * memory (cuMemAddressReserve/Free, cuMemCreate/Release, cuMemMap/Unmap,
 * cuMemSetAccess, cuMemExport/ImportFromShareableHandle, cuIpcGetMemHandle,
 * cuIpcOpenMemHandle, cuIpcCloseMemHandle) are potentially unsafe as
 * cudaMalloc is: cuda.h (cuThreadExchangeStreamCaptureMode) names
 * cudaMalloc's as the example because "the operation is not enqueued
 * asynchronously to a stream, and is not observed by stream capture",
 * which is as true of these, and it exempts none of them. An H200 (driver
 * 580.159.04, 2026-11-28) allowed cuMemCreate/cuMemMap in global mode
 * beside another thread's global capture: the fake is stricter than that
 * driver, so that a library call that relies on a driver's leniency here
 * fails in CI instead of on some other driver. Queries (granularity,
 * properties, address ranges) are not. */
#define FK_UNSAFE_VMM() FK_UNSAFE()

/* This thread's per-thread default stream in each context it used (valid
 * while the context's generation is the one it was made in). */
#define FK_PER_THREAD_SLOTS 16
static _Thread_local struct {
  const struct CUctx_st *ctx;
  unsigned generation;
  fk_stream_t *st;
} fk_per_thread[FK_PER_THREAD_SLOTS];

/* The context current on this thread; fk_depth > 0. */
static struct CUctx_st *fk_ctx(void) {
  return fk_stack[fk_depth - 1];
}

/* A stream's record once its stream is gone: kept, never freed, so that
 * no later stream gets its address as its handle and a use of the dead
 * handle is always caught (fk_dead_or_bad). A driver may reuse a handle,
 * where such a use would reach another stream unnoticed; a test asks for
 * that with FAKECUDA_REUSE_STREAMS (fk_unbury). Under fk.lock. */
static fk_stream_t *fk_grave;
static void fk_bury(fk_stream_t *st) {
  st->next = fk_grave;
  fk_grave = st;
}

/* FAKECUDA_REUSE_STREAMS=1: a new stream gets the record (so the handle)
 * buried last, as a driver may reuse a handle once the stream's resources
 * are released (cuda.h, cuStreamDestroy: "the resources associated with
 * hStream will be released automatically once the device has completed
 * all work in hStream"; nothing there promises a handle is never seen
 * again). A stream is buried once its work has completed and a later call
 * of its context reaps it (cuCtxSynchronize, then cuStreamCreate, makes
 * sure). NULL: not asked, or no buried record. Under fk.lock. */
static fk_stream_t *fk_unbury(void) {
  if (fk_grave == NULL || !fk_env_flag("FAKECUDA_REUSE_STREAMS"))
    return NULL;
  fk_stream_t *st = fk_grave;
  fk_grave = st->next;
  memset(st, 0, sizeof *st);
  return st;
}

/* Makes a stream of the current context and lists it. Under fk.lock. */
static CUresult fk_stream_new(mp_device_t *dev, bool blocking,
                              fk_stream_t **out) {
  fk_stream_t *st = fk_unbury();
  if (st == NULL)
    st = calloc(1, sizeof *st);
  if (st == NULL)
    return CUDA_ERROR_OUT_OF_MEMORY;
  mp_status_t rc = mp_stream_create(dev, &st->s);
  if (rc == MP_OK) {
    rc = mp_event_create(dev, &st->tail);
    if (rc != MP_OK)
      (void)mp_stream_destroy(dev, st->s);
  }
  if (rc != MP_OK) {
    free(st);
    return fk_result_of(rc);
  }
  st->blocking = blocking;
  fk_dead_forget((CUstream)st);
  struct CUctx_st *c = fk_ctx();
  st->next = c->live;
  c->live = st;
  *out = st;
  return CUDA_SUCCESS;
}

/* Frees the retired streams whose work has finished. Under fk.lock. */
static void fk_reap(mp_device_t *dev, struct CUctx_st *c) {
  for (fk_stream_t **at = &c->retired; *at != NULL;) {
    fk_stream_t *st = *at;
    if (mp_event_query(dev, st->tail) != MP_OK) {
      at = &st->next;
      continue;
    }
    *at = st->next;
    (void)mp_stream_destroy(dev, st->s);
    (void)mp_event_destroy(dev, st->tail);
    fk_bury(st);
  }
}

/* Forgets every stream of a context being destroyed (closing its host
 * device frees what they held). Under fk.lock. */
static void fk_forget_streams(struct CUctx_st *c) {
  for (fk_stream_t **list = &c->live; list != NULL;
       list = list == &c->live ? &c->retired : NULL)
    while (*list != NULL) {
      fk_stream_t *st = *list;
      *list = st->next;
      (void)fk_capture_end(st, false);
      fk_bury(st);
    }
  c->legacy_tail = NULL;
  c->generation++;
}

/* The stream a handle names in the current context: *out is NULL for the
 * legacy stream. A handle that is not a live stream of this context (a
 * destroyed one, another context's) is CUDA_ERROR_INVALID_HANDLE, as the
 * driver answers. Handles, after cuda.h ("Stream handles"): NULL is the
 * legacy stream, or the per-thread stream for the _ptsz/_ptds entry points
 * (what --default-stream per-thread compiles to); CU_STREAM_LEGACY (0x1)
 * and CU_STREAM_PER_THREAD (0x2) name them whatever the entry point.
 * Under fk.lock. */
static CUresult fk_resolve(mp_device_t *dev, CUstream h, bool ptsz,
                           fk_stream_t **out) {
  struct CUctx_st *c = fk_ctx();
  if (h == CU_STREAM_LEGACY || (h == NULL && !ptsz)) {
    *out = NULL;
    return CUDA_SUCCESS;
  }
  if (h == CU_STREAM_PER_THREAD || h == NULL) {
    /* The Programming Guide ("Per-thread default stream"): each host thread
     * has its own, which is not non-blocking: it synchronizes with the
     * legacy stream. */
    size_t slot = 0; /* its slot, else a free one, else the first */
    for (size_t i = FK_PER_THREAD_SLOTS; i-- > 0;)
      if (fk_per_thread[i].ctx == c ||
          (fk_per_thread[i].ctx == NULL && fk_per_thread[slot].ctx != c))
        slot = i;
    if (fk_per_thread[slot].ctx != c ||
        fk_per_thread[slot].generation != c->generation) {
      fk_stream_t *st = NULL;
      CUresult r = fk_stream_new(dev, true, &st);
      if (r != CUDA_SUCCESS)
        return r;
      fk_per_thread[slot].ctx = c;
      fk_per_thread[slot].st = st;
      fk_per_thread[slot].generation = c->generation;
    }
    *out = fk_per_thread[slot].st;
    return CUDA_SUCCESS;
  }
  for (fk_stream_t *st = c->live; st != NULL; st = st->next)
    if ((CUstream)st == h) {
      *out = st;
      return CUDA_SUCCESS;
    }
  return fk_dead_or_bad(h);
}

/* The host stream of a resolved stream (NULL: the legacy stream). */
static mp_stream_t fk_host_stream(const fk_stream_t *st) {
  return st == NULL ? NULL : st->s;
}

/* Before an operation goes on stream st: the implicit synchronization of
 * the legacy stream (CUDA driver API, "Stream synchronization behavior"):
 * work on the legacy stream waits for all work already queued on every
 * blocking stream of the context, and work on a blocking stream waits for
 * all work already queued on the legacy stream. Non-blocking streams wait
 * for nothing. Under fk.lock. */
static CUresult fk_order(mp_device_t *dev, const fk_stream_t *st) {
  struct CUctx_st *c = fk_ctx();
  mp_status_t rc = MP_OK;
  if (st == NULL) {
    /* The legacy stream would wait for a blocking stream that captures:
     * refused, the capture invalidated (cuda.h,
     * CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: "a disallowed implicit dependency
     * on a current capture sequence from cudaStreamLegacy"). */
    fk_stream_t *cap = fk_blocking_capture(c);
    if (cap != NULL) {
      fk_capture_invalidate(cap);
      return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    }
    for (const fk_stream_t *o = c->live; o != NULL && rc == MP_OK; o = o->next)
      if (o->blocking) {
        rc = mp_event_record(dev, o->tail, o->s);
        if (rc == MP_OK)
          rc = mp_stream_wait_event(dev, NULL, o->tail);
      }
  } else if (st->blocking) {
    if (c->legacy_tail == NULL)
      rc = mp_event_create(dev, &c->legacy_tail);
    if (rc == MP_OK)
      rc = mp_event_record(dev, c->legacy_tail, NULL);
    if (rc == MP_OK)
      rc = mp_stream_wait_event(dev, st->s, c->legacy_tail);
  }
  return fk_result_of(rc);
}

/* An operation on a capturing stream is recorded, not run (the
 * Programming Guide, "Stream Capture"): node (NULL: nothing to replay, as
 * an event wait) joins the graph, an event record is remembered (ev). A
 * stream whose capture was invalidated refuses it. Under fk.lock. */
static CUresult fk_capture_op(fk_stream_t *st, const fk_node_t *node,
                              CUevent ev) {
  if (st->cap == CU_STREAM_CAPTURE_STATUS_INVALIDATED)
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  if (node != NULL) {
    if (!fk_graph_add(st->graph, node))
      return CUDA_ERROR_OUT_OF_MEMORY;
    st->cap_clock[st->cap_slot]++;
  }
  if (ev != NULL) {
    if (st->n_cap_events == st->cap_cap_events) {
      size_t cap = st->cap_cap_events ? 2 * st->cap_cap_events : 4;
      fk_cap_event_t *p = realloc(st->cap_events, cap * sizeof *p);
      if (p == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
      st->cap_events = p;
      st->cap_cap_events = cap;
    }
    fk_cap_event_t *rec = &st->cap_events[st->n_cap_events++];
    rec->ev = ev;
    memcpy(rec->clock, st->cap_clock, sizeof rec->clock);
  }
  return CUDA_SUCCESS;
}

/* Starts an operation on handle h: resolves it, orders it with the legacy
 * stream and, on success, returns with fk.lock held (fk_end releases it),
 * so that the ordering and the operation are queued together. On a
 * capturing stream the operation is recorded instead (node, ev: see
 * fk_capture_op), *captured is set and the lock is not held. */
static CUresult fk_begin(mp_device_t *dev, CUstream h, bool ptsz,
                         const fk_node_t *node, CUevent ev, mp_stream_t *out,
                         bool *captured) {
  pthread_mutex_lock(&fk.lock);
  fk_reap(dev, fk_ctx());
  fk_stream_t *st = NULL;
  *captured = false;
  CUresult r = fk_resolve(dev, h, ptsz, &st);
  if (r == CUDA_SUCCESS && st != NULL &&
      st->cap != CU_STREAM_CAPTURE_STATUS_NONE) {
    r = fk_capture_op(st, node, ev);
    *captured = r == CUDA_SUCCESS;
    pthread_mutex_unlock(&fk.lock);
    return r;
  }
  if (r == CUDA_SUCCESS)
    r = fk_order(dev, st);
  if (r != CUDA_SUCCESS) {
    pthread_mutex_unlock(&fk.lock);
    return r;
  }
  *out = fk_host_stream(st);
  return CUDA_SUCCESS;
}

static void fk_end(void) {
  pthread_mutex_unlock(&fk.lock);
}

/* The host stream of h, for a call that waits on it (not under the lock):
 * waiting on a capturing stream is refused and invalidates its capture
 * (cuda.h, cuStreamSynchronize / cuStreamQuery: "This function is not
 * allowed during stream capture"), and waiting on any other stream is an
 * unsafe call (fk_unsafe): on an H200 (driver 580.159.04, 2026-11-28)
 * cuStreamQuery and cuStreamSynchronize of a stream outside the capture,
 * made in global mode while another thread captured in global mode,
 * returned CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and the capture ended
 * CUDA_ERROR_STREAM_CAPTURE_INVALIDATED; in relaxed and thread-local mode
 * they succeeded. */
static CUresult fk_lookup_stream(mp_device_t *dev, CUstream h, bool ptsz,
                                 mp_stream_t *out) {
  pthread_mutex_lock(&fk.lock);
  fk_stream_t *st = NULL;
  CUresult r = fk_resolve(dev, h, ptsz, &st);
  fk_stream_t *cap = NULL;
  if (r == CUDA_SUCCESS && st != NULL &&
      st->cap != CU_STREAM_CAPTURE_STATUS_NONE)
    r = fk_capture_conflict(st, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  else if (r == CUDA_SUCCESS && st == NULL &&
           (cap = fk_blocking_capture(fk_ctx())) != NULL)
    r = fk_capture_conflict(cap, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  pthread_mutex_unlock(&fk.lock);
  if (r == CUDA_SUCCESS)
    r = fk_unsafe();
  *out = fk_host_stream(st);
  return r;
}

/* The stream of h, or NULL, with fk.lock held when it captures (for
 * cuMemAllocAsync/cuMemFreeAsync, which become graph nodes then). */
static CUresult fk_capturing_stream(mp_device_t *dev, CUstream h, bool ptsz,
                                    fk_stream_t **out) {
  pthread_mutex_lock(&fk.lock);
  CUresult r = fk_resolve(dev, h, ptsz, out);
  if (r != CUDA_SUCCESS || *out == NULL ||
      (*out)->cap == CU_STREAM_CAPTURE_STATUS_NONE) {
    *out = NULL;
    pthread_mutex_unlock(&fk.lock);
  }
  return r;
}

/* ---- address ranges ------------------------------------------------------ */

/* A handle's memory, freed once fk_phys_unlink took it off the list. */
static void fk_phys_free(fk_phys_t *p) {
  if (p->import_fd >= 0)
    close(p->import_fd);
  free(p);
}

/* Physical memory is the device's from cuMemCreate to the release of its
 * handle and its last unmap (cuda.h, cuMemCreate: "This creates a memory
 * allocation on the target device"; it may fail with
 * CUDA_ERROR_OUT_OF_MEMORY; cuMemRelease: "The memory allocation will be
 * freed when all outstanding mappings to the memory are unmapped and when
 * all outstanding references to the handle ... are also released"). The
 * host device charges memory when it is mapped (vm_map) and gives it back
 * when it is unmapped, so a handle that no mapping holds is counted here,
 * in its context's unbacked bytes: cuMemCreate and cuMemAlloc fail with
 * CUDA_ERROR_OUT_OF_MEMORY where they would not fit beside it, and
 * cuMemGetInfo reports it used, as a GPU does. Call with add false before
 * changing p's state and with add true after. Under fk.lock. */
static void fk_phys_count(const fk_phys_t *p, bool add) {
  if (p->ctx == NULL || p->released || p->maps != 0 || p->import_fd >= 0)
    return;
  if (add)
    p->ctx->unbacked += p->size;
  else
    p->ctx->unbacked -= p->size;
}

/* Whether h names a handle that is neither freed nor released: cuda.h,
 * cuMemRelease, "If handle is not a valid handle the behavior is
 * undefined"; a GPU's handle table refuses one it no longer holds, the
 * fake refuses it with CUDA_ERROR_INVALID_VALUE (and never reads freed
 * memory). A handle is an id no other handle gets again (fk_phys_list),
 * not the address of its record: calloc hands that address to the next
 * cuMemCreate, and a stale handle named the new allocation. Under
 * fk.lock. */
static fk_phys_t *fk_phys_valid(CUmemGenericAllocationHandle h) {
  for (fk_phys_t *p = fk.phys; p != NULL; p = p->next)
    if (p->id == h)
      return p->released ? NULL : p;
  return NULL;
}

/* Lists p (fk.phys) under a new handle, never given out before (ids count
 * up from a base no small integer or host address is likely to meet).
 * Under fk.lock. */
static void fk_phys_list(fk_phys_t *p) {
  if (fk.next_phys_id == 0)
    fk.next_phys_id = (CUmemGenericAllocationHandle)0xfa4e000000000000ull;
  p->id = ++fk.next_phys_id;
  p->next = fk.phys;
  fk.phys = p;
}

/* Takes p off the list of handles (it is freed next). Under fk.lock. */
static void fk_phys_unlink(fk_phys_t *p) {
  for (fk_phys_t **at = &fk.phys; *at != NULL; at = &(*at)->next)
    if (*at == p) {
      *at = p->next;
      return;
    }
}

/* A mapping of p went: whether p is to be freed now (its last one, once
 * released; then off the list already). Under fk.lock. */
static bool fk_phys_unmapped_locked(fk_phys_t *p) {
  fk_phys_count(p, false);
  p->maps--;
  fk_phys_count(p, true);
  bool free_now = p->maps == 0 && p->released;
  if (free_now)
    fk_phys_unlink(p);
  return free_now;
}

/* The bytes of host device dev that handles no mapping holds keep
 * (fk_phys_count). Under fk.lock. */
static size_t fk_unbacked_of(const mp_device_t *dev) {
  size_t n = 0;
  for (int i = 0; i < FK_MAX_DEVICES; i++)
    if (atomic_load(&fk.ctx[i].dev) == dev)
      n += fk.ctx[i].unbacked;
  return n;
}

/* CUDA_SUCCESS when bytes more of dev's memory fit beside what it has in
 * use and what unmapped handles keep, else CUDA_ERROR_OUT_OF_MEMORY.
 * Under fk.lock. */
static CUresult fk_fits(mp_device_t *dev, size_t bytes) {
  size_t free_b = 0, total_b = 0, held = fk_unbacked_of(dev);
  mp_status_t st = mp_device_mem_info(dev, &free_b, &total_b);
  if (st != MP_OK)
    return fk_result_of(st);
  return held <= free_b && bytes <= free_b - held ? CUDA_SUCCESS
                                                  : CUDA_ERROR_OUT_OF_MEMORY;
}

/* Address reservations (cuMemAddressReserve), for the ranges
 * cuPointerGetAttribute gives of mapped memory (fk_pointer_attribute); the
 * host device keeps its own. Under fk.lock. */
typedef struct fk_resv {
  uintptr_t base;
  size_t size;
  const struct CUctx_st *ctx;
} fk_resv_t;
static fk_resv_t *fk_resvs;
static size_t fk_nresvs, fk_resvs_cap;

/* The index of the reservation holding addr, or fk_nresvs. Under
 * fk.lock. */
static size_t fk_resv_find(uintptr_t addr) {
  size_t i = 0;
  while (i < fk_nresvs && addr - fk_resvs[i].base >= fk_resvs[i].size)
    i++;
  return i;
}

/* Index of the first range whose base is >= addr. Under fk.lock. */
static size_t fk_range_lower(uintptr_t addr) {
  size_t lo = 0, hi = fk.n_ranges;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (fk.ranges[mid].base < addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static bool fk_range_add(fk_range_t r) {
  pthread_mutex_lock(&fk.lock);
  bool ok = true;
  if (fk.n_ranges == fk.cap_ranges) {
    size_t cap = fk.cap_ranges ? fk.cap_ranges * 2 : 64;
    fk_range_t *p = realloc(fk.ranges, cap * sizeof *p);
    if (p == NULL)
      ok = false;
    else {
      fk.ranges = p;
      fk.cap_ranges = cap;
    }
  }
  if (ok) {
    size_t i = fk_range_lower(r.base);
    memmove(&fk.ranges[i + 1], &fk.ranges[i],
            (fk.n_ranges - i) * sizeof *fk.ranges);
    fk.ranges[i] = r;
    fk.n_ranges++;
  }
  pthread_mutex_unlock(&fk.lock);
  return ok;
}

/* Removes the range starting exactly at base; false when there is none. */
static bool fk_range_take(uintptr_t base, fk_range_t *out) {
  pthread_mutex_lock(&fk.lock);
  size_t i = fk_range_lower(base);
  bool found = i < fk.n_ranges && fk.ranges[i].base == base;
  if (found) {
    *out = fk.ranges[i];
    memmove(&fk.ranges[i], &fk.ranges[i + 1],
            (fk.n_ranges - i - 1) * sizeof *fk.ranges);
    fk.n_ranges--;
  }
  pthread_mutex_unlock(&fk.lock);
  return found;
}

/* The range whose base is base, or NULL. Under fk.lock. */
static fk_range_t *fk_range_at(uintptr_t base) {
  size_t i = fk_range_lower(base);
  return i < fk.n_ranges && fk.ranges[i].base == base ? &fk.ranges[i] : NULL;
}

/* The range holding addr. */
static bool fk_range_find(uintptr_t addr, fk_range_t *out) {
  pthread_mutex_lock(&fk.lock);
  size_t i = fk_range_lower(addr + 1);
  bool found = i > 0 && addr - fk.ranges[i - 1].base < fk.ranges[i - 1].size;
  if (found)
    *out = fk.ranges[i - 1];
  pthread_mutex_unlock(&fk.lock);
  return found;
}

/* Drops every range of a device whose host device is closing. */
static void fk_range_drop_ctx(struct CUctx_st *ctx) {
  pthread_mutex_lock(&fk.lock);
  size_t k = 0;
  for (size_t i = 0; i < fk.n_ranges; i++) {
    fk_range_t *r = &fk.ranges[i];
    if (r->ctx != ctx) {
      fk.ranges[k++] = *r;
      continue;
    }
    fk_phys_t *p = r->phys;
    if (p != NULL) {
      fk_phys_count(p, false);
      p->maps--;
      fk_phys_count(p, true);
    }
    if (p != NULL && p->maps == 0 && p->released) {
      fk_phys_unlink(p);
      fk_phys_free(p);
    }
    if (r->ipc_fd >= 0)
      close(r->ipc_fd);
  }
  fk.n_ranges = k;
  /* The closed device's memory went with it: its handles hold none. */
  for (fk_phys_t *p = fk.phys; p != NULL; p = p->next)
    if (p->ctx == ctx)
      p->ctx = NULL;
  ctx->unbacked = 0;
  /* Its reservations too (the host device released them). */
  k = 0;
  for (size_t i = 0; i < fk_nresvs; i++)
    if (fk_resvs[i].ctx != ctx)
      fk_resvs[k++] = fk_resvs[i];
  fk_nresvs = k;
  pthread_mutex_unlock(&fk.lock);
}

/* ---- queued work on mapped memory ---------------------------------------
 * cuMemUnmap does not wait for work queued on the memory it unmaps: cuda.h
 * promises no such wait (its \note_sync says only that it "exhibits
 * synchronous behavior for most use cases"), and PyTorch's expandable
 * segments synchronize the stream before unmapping because unmap "does not
 * appear to synchronize in all cases". The host device's vm_unmap fences the
 * range, so such work faulted on a stream worker when it ran, but only if
 * nothing was mapped there first: a caller that maps the range again (the
 * pool's growth fills holes) had the work write into the new memory, as a
 * GPU would, unseen. So every copy and memset that touches a mapping is
 * remembered with an event recorded after it, until the event completes,
 * and cuMemUnmap of a range such work still touches stops the process with
 * a message (as a use of a destroyed stream does), unless
 * FAKECUDA_UNMAP_IN_USE=refuse asks for CUDA_ERROR_INVALID_VALUE instead (a
 * test of the rule). Under fk.lock. */
typedef struct fk_flight {
  mp_device_t *dev;
  uintptr_t lo[2], hi[2]; /* the ranges the operation touches */
  mp_event_t done;        /* recorded after it */
} fk_flight_t;
static fk_flight_t *fk_flights;
static size_t fk_nflights, fk_flights_cap;

/* Whether a range's memory is watched for queued work: a mapping (for
 * cuMemUnmap), stream-ordered memory (for cuMemFree, which does not wait
 * for it: fk_free_in_use), and, with FAKECUDA_FREE_IN_USE set, every
 * allocation (fk_free_in_use). */
static bool fk_watched(const fk_range_t *r, bool all) {
  return r->phys != NULL || r->stream_ordered || (all && !r->ipc_open);
}

static bool fk_pin_touches_locked(uintptr_t lo, uintptr_t hi);
/* Whether [lo, hi) reaches into a watched range. Under fk.lock. */
static bool fk_touches_watched(uintptr_t lo, uintptr_t hi, bool all) {
  if (all && fk_pin_touches_locked(lo, hi))
    return true; /* page-locked memory: cuMemFreeHost promises no wait */
  size_t i = fk_range_lower(lo + 1);
  if (i > 0 && lo - fk.ranges[i - 1].base < fk.ranges[i - 1].size &&
      fk_watched(&fk.ranges[i - 1], all))
    return true;
  for (; i < fk.n_ranges && fk.ranges[i].base < hi; i++)
    if (fk_watched(&fk.ranges[i], all))
      return true;
  return false;
}

/* Forgets the operations that have completed (all of dev's when closing:
 * its events go with it). Under fk.lock. */
static void fk_flights_prune(const mp_device_t *closing) {
  for (size_t i = 0; i < fk_nflights;) {
    fk_flight_t *f = &fk_flights[i];
    if (f->dev != closing && mp_event_query(f->dev, f->done) != MP_OK) {
      i++;
      continue;
    }
    if (f->dev != closing)
      (void)mp_event_destroy(f->dev, f->done);
    *f = fk_flights[--fk_nflights];
  }
}

/* Remembers an operation on [dst, dst + n) (and [src, src + n) unless 0)
 * just queued on host stream hs, if it touches a mapping; without host
 * memory or an event it is not remembered (a check missed, not a
 * failure). Under fk.lock. */
static void fk_flight_add(mp_device_t *dev, mp_stream_t hs, uintptr_t dst,
                          uintptr_t src, size_t n) {
  bool all = getenv("FAKECUDA_FREE_IN_USE") != NULL;
  if (!fk_touches_watched(dst, dst + n, all) &&
      (src == 0 || !fk_touches_watched(src, src + n, all)))
    return;
  fk_flights_prune(NULL);
  fk_flight_t *p = fk_room(fk_flights, fk_nflights, &fk_flights_cap, sizeof *p);
  if (p == NULL)
    return;
  fk_flights = p;
  fk_flight_t f = {.dev = dev, .lo = {dst, src}, .hi = {dst + n, src + n}};
  if (mp_event_create(dev, &f.done) != MP_OK)
    return;
  if (mp_event_record(dev, f.done, hs) != MP_OK) {
    (void)mp_event_destroy(dev, f.done);
    return;
  }
  fk_flights[fk_nflights++] = f;
}

/* Whether queued work not yet done touches [lo, hi). Under fk.lock. */
static bool fk_in_flight(uintptr_t lo, uintptr_t hi) {
  fk_flights_prune(NULL);
  for (size_t i = 0; i < fk_nflights; i++)
    for (int k = 0; k < 2; k++)
      if (fk_flights[i].lo[k] < hi && lo < fk_flights[i].hi[k] &&
          fk_flights[i].lo[k] != 0)
        return true;
  return false;
}

/* ---- access to mapped memory ----------------------------------------------
 * A mapping starts with no access for any device: "all mappings start with
 * no accessibility setup" (cuda.h, cuMemUnmap), "calling ::cuMemMap does not
 * make the address accessible, the caller needs to update accessibility of a
 * contiguous mapped VA range by calling ::cuMemSetAccess" (cuda.h, cuMemMap).
 * A device reads a mapping only where cuMemSetAccess gave it
 * CU_MEM_ACCESS_FLAGS_PROT_READ or _READWRITE, and writes it only with
 * _READWRITE (cuda.h, CUmemAccess_flags). A copy or memset runs on its
 * stream's device, which must have that access to every mapping it writes
 * (dst) or reads (src). A GPU faults when the work runs and the context is
 * lost (CUDA_ERROR_ILLEGAL_ADDRESS from later calls); the fake refuses the
 * call itself with that code, counted (cuFakeGetErrorCount), and says so on
 * stderr, so a caller that drops the error still leaves a trace. Captured
 * copies are checked when their graph is launched, as a GPU would fault
 * then. */

/* Whether device ordinal may read (write: and write) every mapping that
 * [lo, lo + n) reaches into; memory that is no mapping is not judged here.
 * Under fk.lock. */
static bool fk_access_ok(uintptr_t lo, size_t n, int ordinal, bool write) {
  unsigned bit = 1u << ordinal;
  uintptr_t hi = n > UINTPTR_MAX - lo ? UINTPTR_MAX : lo + n;
  size_t i = fk_range_lower(lo + 1);
  if (i > 0)
    i--; /* the range that may hold lo */
  for (; i < fk.n_ranges && fk.ranges[i].base < hi; i++) {
    const fk_range_t *r = &fk.ranges[i];
    if (r->phys == NULL || r->base + r->size <= lo)
      continue;
    if (!(r->access & bit) || (write && !(r->writable & bit)))
      return false;
  }
  return true;
}

/* Whether [lo, lo + n) stays inside the cuMemAlloc (or cuMemAllocAsync,
 * or IPC-opened) allocation that holds lo, if one does: a copy or memset
 * that runs past an allocation's end writes or reads memory it does not
 * own, which a GPU may fault on or silently corrupt; here it is refused
 * (CUDA_ERROR_INVALID_VALUE, with a line on stderr), where the host memory
 * behind it would take it silently. Mappings of a reservation are not checked:
 * a copy may span adjacent ones. Under fk.lock. */
static bool fk_within_allocation(uintptr_t lo, size_t n) {
  size_t i = fk_range_lower(lo + 1);
  if (i == 0)
    return true;
  const fk_range_t *r = &fk.ranges[i - 1];
  if (r->phys != NULL || lo - r->base >= r->size)
    return true; /* a mapping, or not device memory of ours */
  return n <= r->size - (lo - r->base);
}

static CUresult fk_no_access(int ordinal, CUdeviceptr dst, CUdeviceptr src,
                             size_t n, const char *what) {
  atomic_fetch_add(&fk_illegal_addresses, 1);
  fprintf(stderr,
          "fakecuda: a copy or memset on device %d of %zu bytes (dst %p, src "
          "%p) %s: CUDA_ERROR_ILLEGAL_ADDRESS\n",
          ordinal, n, (void *)dst, (void *)src, what);
  return CUDA_ERROR_ILLEGAL_ADDRESS;
}

/* ---- initialization, devices, contexts ----------------------------------- */

CUresult cuInit(unsigned int flags) {
  FK_COUNT(cuInit);
  if (flags != 0)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fk.lock);
  if (!fk.initialized) {
    fk.initialized = true;
    fk.init_result = CUDA_SUCCESS;
    fk.count = 1;
    const char *v = getenv("FAKECUDA_DEVICE_COUNT");
    if (v != NULL && v[0] != '\0') {
      int n = atoi(v);
      fk.count = n < 1 ? 1 : n > FK_MAX_DEVICES ? FK_MAX_DEVICES : n;
    }
    fk.no_vmm = fk_env_flag("FAKECUDA_NO_VMM");
    fk.no_shareable = fk_env_flag("FAKECUDA_NO_SHAREABLE");
    const char *all = getenv("FAKECUDA_DEVICE");
    for (int i = 0; i < FK_MAX_DEVICES; i++) {
      char name[32];
      snprintf(name, sizeof name, "FAKECUDA_DEVICE_%d", i);
      v = getenv(name);
      v = v != NULL ? v : all;
      snprintf(fk.spec[i], sizeof fk.spec[i], "host:%s%s", v ? v : "",
               !fk.no_vmm    ? ""
               : (v && v[0]) ? ",vmm=0"
                             : "vmm=0");
    }
    v = getenv("FAKECUDA_NAME");
    snprintf(fk.name, sizeof fk.name, "%s", v && v[0] ? v : FK_DEFAULT_NAME);
    for (int i = 0; i < FK_MAX_DEVICES; i++)
      fk.ctx[i].ordinal = i;
    if (fk_env_flag("FAKECUDA_NO_DEVICE"))
      fk.init_result = CUDA_ERROR_NO_DEVICE;
    v = getenv("FAKECUDA_INIT_ERROR");
    if (v != NULL && atoi(v) != 0)
      fk.init_result = (CUresult)atoi(v);
    if (fk.init_result == CUDA_SUCCESS)
      atomic_store(&fk.ready, 1);
  }
  CUresult r = fk.init_result;
  pthread_mutex_unlock(&fk.lock);
  return r;
}

CUresult cuDriverGetVersion(int *version) {
  FK_COUNT(cuDriverGetVersion);
  if (version == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  const char *v = getenv("FAKECUDA_DRIVER_VERSION");
  *version = (v != NULL && atoi(v) > 0) ? atoi(v) : CUDA_VERSION;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
  FK_COUNT(cuDeviceGetCount);
  FK_NEED_INIT();
  if (count == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  *count = fk.count;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  FK_COUNT(cuDeviceGet);
  FK_NEED_INIT();
  if (device == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  if (!fk_valid_device(ordinal))
    return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
  FK_COUNT(cuDeviceGetName);
  FK_NEED_INIT();
  if (name == NULL || len <= 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (!fk_valid_device(dev))
    return CUDA_ERROR_INVALID_DEVICE;
  snprintf(name, (size_t)len, "%s", fk.name);
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib,
                              CUdevice dev) {
  FK_COUNT(cuDeviceGetAttribute);
  FK_NEED_INIT();
  if (pi == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  if (!fk_valid_device(dev))
    return CUDA_ERROR_INVALID_DEVICE;
  switch (attrib) {
  case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    *pi = !fk.no_vmm;
    break;
  case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
  case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED:
    *pi = !fk.no_vmm && !fk.no_shareable;
    break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = 9; break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = 0; break;
  case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
  case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
  case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
  case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
  /* Registered memory is the device's at its host address (cuda.h,
   * cuMemHostRegister; fk_host_register), and may be registered READ_ONLY
   * ("Support for the use of this flag can be queried from the device
   * attribute CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED"; the
   * fake took the flag while it answered 0 before 2026-12-04). */
  case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM:
  case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED: *pi = 1; break;
  default: *pi = 0; break;
  }
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
  FK_COUNT(cuDeviceTotalMem_v2);
  FK_NEED_INIT();
  if (bytes == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  if (!fk_valid_device(dev))
    return CUDA_ERROR_INVALID_DEVICE;
  mp_device_t *h = fk_host(dev);
  if (h == NULL)
    return CUDA_ERROR_UNKNOWN;
  return fk_result_of(mp_device_mem_info(h, NULL, bytes));
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  FK_COUNT(cuDevicePrimaryCtxRetain);
  FK_NEED_INIT();
  if (pctx == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  if (!fk_valid_device(dev))
    return CUDA_ERROR_INVALID_DEVICE;
  if (fk_host(dev) == NULL)
    return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&fk.lock);
  fk.ctx[dev].refs++;
  pthread_mutex_unlock(&fk.lock);
  *pctx = &fk.ctx[dev];
  return CUDA_SUCCESS;
}

static void fk_pins_drop_ctx(const struct CUctx_st *ctx);
static void fk_registered_drop_ctx(const struct CUctx_st *ctx);

/* Closes a context's host device (freeing everything made in it) after
 * forgetting its streams. */
static void fk_ctx_close(struct CUctx_st *c, mp_device_t *closing) {
  if (closing == NULL)
    return;
  pthread_mutex_lock(&fk.lock);
  fk_flights_prune(closing);
  pthread_mutex_unlock(&fk.lock);
  mp_device_close(closing);
  fk_range_drop_ctx(c);
  fk_pins_drop_ctx(c);
  fk_registered_drop_ctx(c);
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  FK_COUNT(cuDevicePrimaryCtxRelease_v2);
  FK_NEED_INIT();
  if (!fk_valid_device(dev))
    return CUDA_ERROR_INVALID_DEVICE;
  mp_device_t *closing = NULL;
  pthread_mutex_lock(&fk.lock);
  struct CUctx_st *c = &fk.ctx[dev];
  if (c->refs == 0) {
    pthread_mutex_unlock(&fk.lock);
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  if (--c->refs == 0) {
    closing = atomic_exchange(&c->dev, NULL);
    fk_forget_streams(c);
  }
  pthread_mutex_unlock(&fk.lock);
  fk_ctx_close(c, closing); /* destroyed with everything made in it */
  return CUDA_SUCCESS;
}

/* cuda.h, cuDevicePrimaryCtxReset: "Destroy all allocations and reset all
 * state on the primary context", whoever still holds it; a later retain
 * starts a new one. "Resetting the primary context does not release it":
 * the retains stay, each still released by its holder. */
static CUresult fk_primary_reset(CUdevice dev) {
  FK_NEED_INIT();
  if (!fk_valid_device(dev))
    return CUDA_ERROR_INVALID_DEVICE;
  struct CUctx_st *c = &fk.ctx[dev];
  pthread_mutex_lock(&fk.lock);
  mp_device_t *closing = atomic_exchange(&c->dev, NULL);
  fk_forget_streams(c);
  pthread_mutex_unlock(&fk.lock);
  fk_ctx_close(c, closing);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  FK_COUNT(cuDevicePrimaryCtxReset_v2);
  return fk_primary_reset(dev);
}

/* The original does the same (cuda.h documents one function). */
CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  FK_COUNT(cuDevicePrimaryCtxReset);
  return fk_primary_reset(dev);
}

/* cuCtxCreate: a context of its own (its own memory, streams and work),
 * pushed on the calling thread's stack. */
static CUresult fk_ctx_create(CUcontext *pctx, CUdevice dev) {
  FK_NEED_INIT();
  if (pctx == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  if (!fk_valid_device(dev))
    return CUDA_ERROR_INVALID_DEVICE;
  if (fk_depth == FK_MAX_CTX_DEPTH)
    return CUDA_ERROR_INVALID_VALUE;
  struct CUctx_st *c = calloc(1, sizeof *c);
  if (c == NULL)
    return CUDA_ERROR_OUT_OF_MEMORY;
  mp_device_t *h = NULL;
  if (mp_device_open(fk.spec[dev], &h) != MP_OK) {
    free(c);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  c->ordinal = dev;
  c->refs = 1;
  c->created = true;
  atomic_store(&c->dev, h);
  pthread_mutex_lock(&fk.lock);
  c->next_created = fk.created;
  fk.created = c;
  pthread_mutex_unlock(&fk.lock);
  fk_stack[fk_depth++] = c;
  *pctx = c;
  return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
  FK_COUNT(cuCtxCreate_v2);
  (void)flags;
  return fk_ctx_create(pctx, dev);
}

CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params,
                        unsigned int flags, CUdevice dev) {
  FK_COUNT(cuCtxCreate_v4);
  (void)params;
  (void)flags;
  return fk_ctx_create(pctx, dev);
}

/* cuda.h, cuCtxDestroy: destroys a context made by cuCtxCreate (not a
 * primary one) and what it holds, popping it if it is this thread's
 * current one. Its handle stays a dead context (CUDA_ERROR_INVALID_CONTEXT
 * in any thread that still has it current), never freed memory. */
CUresult cuCtxDestroy_v2(CUcontext ctx) {
  FK_COUNT(cuCtxDestroy_v2);
  FK_NEED_INIT();
  if (ctx == NULL || !ctx->created)
    return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&fk.lock);
  mp_device_t *closing = atomic_exchange(&ctx->dev, NULL);
  if (closing != NULL)
    fk_forget_streams(ctx);
  pthread_mutex_unlock(&fk.lock);
  if (closing == NULL)
    return CUDA_ERROR_INVALID_CONTEXT;
  fk_ctx_close(ctx, closing);
  if (fk_depth > 0 && fk_stack[fk_depth - 1] == ctx)
    fk_depth--;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags,
                                    int *active) {
  FK_COUNT(cuDevicePrimaryCtxGetState);
  FK_NEED_INIT();
  if (flags == NULL || active == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  if (!fk_valid_device(dev))
    return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&fk.lock);
  /* retained, and not destroyed by a reset since */
  *active = fk.ctx[dev].refs > 0 && atomic_load(&fk.ctx[dev].dev) != NULL;
  pthread_mutex_unlock(&fk.lock);
  *flags = 0;
  return CUDA_SUCCESS;
}

/* Whether ctx is a context the fake made and that is alive: a device's
 * primary context while retained (cuDevicePrimaryCtxRetain; a reset one
 * too, which the retains keep), or one of cuCtxCreate's not destroyed.
 * ctx is compared, never read, until found: any other pointer (freed,
 * forged, another library's) is an answer, not a crash. cuda.h lists
 * CUDA_ERROR_INVALID_CONTEXT for cuCtxPushCurrent and cuCtxSetCurrent. */
static bool fk_ctx_live(CUcontext ctx) {
  bool live = false;
  pthread_mutex_lock(&fk.lock);
  for (int i = 0; i < fk.count; i++)
    if (ctx == &fk.ctx[i])
      live = fk.ctx[i].refs > 0;
  for (struct CUctx_st *c = fk.created; c != NULL; c = c->next_created)
    if (ctx == c)
      live = atomic_load(&c->dev) != NULL;
  pthread_mutex_unlock(&fk.lock);
  return live;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  FK_COUNT(cuCtxPushCurrent_v2);
  FK_NEED_INIT();
  if (ctx == NULL || fk_depth == FK_MAX_CTX_DEPTH)
    return CUDA_ERROR_INVALID_VALUE;
  if (!fk_ctx_live(ctx))
    return CUDA_ERROR_INVALID_CONTEXT;
  fk_stack[fk_depth++] = ctx;
  return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
  FK_COUNT(cuCtxPopCurrent_v2);
  FK_NEED_INIT();
  if (fk_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  CUcontext c = fk_stack[--fk_depth];
  if (pctx != NULL)
    *pctx = c;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx) {
  FK_COUNT(cuCtxGetCurrent);
  FK_NEED_INIT();
  if (pctx == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  *pctx = fk_depth ? fk_stack[fk_depth - 1] : NULL;
  return CUDA_SUCCESS;
}

/* Replaces the top of the stack; NULL pops it. */
CUresult cuCtxSetCurrent(CUcontext ctx) {
  FK_COUNT(cuCtxSetCurrent);
  FK_NEED_INIT();
  if (ctx != NULL && !fk_ctx_live(ctx))
    return CUDA_ERROR_INVALID_CONTEXT; /* as cuCtxPushCurrent */
  if (ctx == NULL) {
    if (fk_depth > 0)
      fk_depth--;
  } else if (fk_depth == 0) {
    fk_stack[fk_depth++] = ctx;
  } else {
    fk_stack[fk_depth - 1] = ctx;
  }
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device) {
  FK_COUNT(cuCtxGetDevice);
  FK_NEED_INIT();
  if (device == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  if (fk_depth == 0)
    return CUDA_ERROR_INVALID_CONTEXT;
  *device = fk_stack[fk_depth - 1]->ordinal;
  return CUDA_SUCCESS;
}

/* It waits for every stream, a capturing one too, so it conflicts with a
 * capture in every mode: on an H200 (driver 580.159.04, 2026-11-28) it
 * returned CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidated another
 * thread's capture also when the caller was in relaxed mode, and when the
 * capture was begun relaxed. (Every capture here counts, not only those in
 * the current context: the tests capture in one context.) */
CUresult cuCtxSynchronize(void) {
  FK_COUNT(cuCtxSynchronize);
  FK_CURRENT(dev);
  FK_UNSAFE();
  if (atomic_load(&fk_n_captures) > 0) {
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&fk.lock);
    for (fk_stream_t *st = fk_capturing; st != NULL; st = st->cap_next)
      r = fk_capture_conflict(st, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    pthread_mutex_unlock(&fk.lock);
    if (r != CUDA_SUCCESS)
      return r;
  }
  return fk_result_of(mp_device_synchronize(dev));
}

/* ---- memory -------------------------------------------------------------- */

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
  FK_COUNT(cuMemGetInfo_v2);
  FK_CURRENT(dev);
  if (free_bytes == NULL || total_bytes == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  /* Memory that cuMemCreate handles keep unmapped is in use too
   * (fk_phys_count). */
  pthread_mutex_lock(&fk.lock);
  mp_status_t st = mp_device_mem_info(dev, free_bytes, total_bytes);
  size_t held = fk_unbacked_of(dev);
  if (st == MP_OK)
    *free_bytes -= held < *free_bytes ? held : *free_bytes;
  pthread_mutex_unlock(&fk.lock);
  return fk_result_of(st);
}

static CUresult fk_alloc(mp_device_t *dev, CUdeviceptr *dptr, size_t bytes,
                         bool stream_ordered) {
  if (dptr == NULL || bytes == 0)
    return CUDA_ERROR_INVALID_VALUE;
  /* Not where unmapped cuMemCreate handles keep the memory
   * (fk_phys_count); the host device checks the rest. The check and the
   * charge are one step under fk.lock, as cuMemCreate's and cuMemMap's
   * are: between the two another thread's cuMemCreate took the same free
   * memory (fk_fits), and together they held more than the device has,
   * which a GPU never hands out. */
  pthread_mutex_lock(&fk.lock);
  CUresult fit = fk_unbacked_of(dev) != 0 ? fk_fits(dev, bytes) : CUDA_SUCCESS;
  void *p = NULL;
  mp_status_t st =
      fit == CUDA_SUCCESS ? mp_device_alloc(dev, bytes, &p) : MP_OK;
  pthread_mutex_unlock(&fk.lock);
  if (fit != CUDA_SUCCESS)
    return fit;
  if (st != MP_OK)
    return fk_result_of(st);
  fk_range_t r = {.base = (uintptr_t)p,
                  .size = bytes,
                  .ctx = fk_stack[fk_depth - 1],
                  .ipc_fd = -1,
                  .stream_ordered = stream_ordered};
  if (!fk_range_add(r)) {
    (void)mp_device_free(dev, p);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *dptr = (CUdeviceptr)p;
  return CUDA_SUCCESS;
}

static CUresult fk_free(mp_device_t *dev, CUdeviceptr dptr) {
  fk_range_t r;
  if (!fk_range_take((uintptr_t)dptr, &r))
    return CUDA_ERROR_INVALID_VALUE;
  if (r.phys != NULL || r.ipc_open) { /* a mapping, not an allocation */
    (void)fk_range_add(r);
    return CUDA_ERROR_INVALID_VALUE;
  }
  /* The device it was allocated on: with unified addressing a pointer
   * names its allocation whichever context is current (cuda.h, "Unified
   * Addressing"), so another device's memory is freed on that device. */
  mp_device_t *home = r.ctx != NULL ? atomic_load(&r.ctx->dev) : NULL;
  mp_status_t st = mp_device_free(home != NULL ? home : dev, (void *)dptr);
  if (st != MP_OK)
    (void)fk_range_add(r);
  else if (r.ipc_fd >= 0)
    close(r.ipc_fd);
  return fk_result_of(st);
}

/* An entry point that needs a current context: counted, refused without
 * cuInit or a context, then `call` with dev the current context's device
 * and ptsz true in a per-thread-default-stream twin (_ptsz, _ptds). */
#define FK_IN_CTX_PT(name, pt, params, call)                                   \
  CUresult name params {                                                       \
    FK_COUNT(name);                                                            \
    FK_CURRENT(dev);                                                           \
    const bool ptsz = (pt);                                                    \
    (void)ptsz;                                                                \
    return call;                                                               \
  }
#define FK_IN_CTX(name, params, call) FK_IN_CTX_PT(name, false, params, call)
/* The same for a function and its per-thread-default-stream twin. */
#define FK_IN_CTX_TWINS(name, twin, params, call)                              \
  FK_IN_CTX_PT(name, false, params, call)                                      \
  FK_IN_CTX_PT(twin, true, params, call)

static CUresult fk_alloc_sync(mp_device_t *dev, CUdeviceptr *dptr,
                              size_t bytes) {
  CUresult r = fk_unsafe();
  return r == CUDA_SUCCESS ? fk_alloc(dev, dptr, bytes, false) : r;
}

/* A free by the program (cuMemFree, cuMemFreeAsync outside a capture).
 * Of a graph's output it ends the allocation a launch made; the memory
 * stays the graph's for its next launch. Of one not live (before a launch,
 * or freed twice) or freed inside its graph it is refused: cuda.h,
 * cuGraphAddMemAllocNode, such allocations "can be freed by passing the
 * allocation to cuMemFreeAsync or cuMemFree" once, and "cannot be freed
 * outside the owning graph" when the graph frees them. */
static CUresult fk_free_user(mp_device_t *dev, CUdeviceptr dptr) {
  pthread_mutex_lock(&fk.lock);
  fk_range_t *r = fk_range_at((uintptr_t)dptr);
  unsigned char g = r != NULL ? r->gout : 0;
  if (g == FK_GOUT_LIVE)
    r->gout = FK_GOUT_IDLE;
  pthread_mutex_unlock(&fk.lock);
  if (g == 0)
    return fk_free(dev, dptr);
  return g == FK_GOUT_LIVE ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* cuMemFree and the work still queued on the memory it frees. cuda.h,
 * cuMemFree: "This API will not perform any implicit synchronization when
 * the pointer was allocated with ::cuMemAllocAsync ... Callers must ensure
 * that all accesses to these pointer have completed before invoking
 * ::cuMemFree"; "For all other pointers, this API may perform implicit
 * synchronization". So freeing stream-ordered memory a queued copy or
 * memset still uses stops the process with a message (a GPU would run the
 * work on freed memory), as cuMemUnmap does (fk_flight_t). cuMemAlloc
 * memory is waited for, as drivers do in practice (the host device's free
 * waits for every stream), unless FAKECUDA_FREE_IN_USE is set: then freeing
 * any memory such work still uses stops the process too, for a caller that
 * says it never relies on that "may" (the cuda backend: mp__cuda_free).
 * FAKECUDA_FREE_IN_USE=refuse answers CUDA_ERROR_INVALID_VALUE instead (a
 * test of the rule); nothing is freed then. Only copies and memsets are
 * seen, queued after the variable was set. */
static CUresult fk_free_in_use(CUdeviceptr dptr) {
  const char *v = getenv("FAKECUDA_FREE_IN_USE");
  bool all = v != NULL;
  pthread_mutex_lock(&fk.lock);
  fk_range_t *r = fk_range_at((uintptr_t)dptr);
  bool busy = r != NULL && fk_watched(r, all) && r->phys == NULL &&
              fk_in_flight(r->base, r->base + r->size);
  size_t size = r != NULL ? r->size : 0;
  bool ordered = r != NULL && r->stream_ordered;
  pthread_mutex_unlock(&fk.lock);
  if (!busy)
    return CUDA_SUCCESS;
  if (v != NULL && strcmp(v, "refuse") == 0)
    return CUDA_ERROR_INVALID_VALUE;
  fprintf(stderr,
          "fakecuda: cuMemFree(%p) of %s memory (%zu bytes) that queued "
          "copies or memsets still use (%s)\n",
          (void *)dptr, ordered ? "stream-ordered" : "cuMemAlloc", size,
          ordered ? "cuMemFree does not wait for it"
                  : "FAKECUDA_FREE_IN_USE: a driver may not wait for it");
  abort();
}

static CUresult fk_free_sync(mp_device_t *dev, CUdeviceptr dptr) {
  CUresult r = fk_unsafe();
  if (r == CUDA_SUCCESS)
    r = fk_free_in_use(dptr);
  return r == CUDA_SUCCESS ? fk_free_user(dev, dptr) : r;
}

FK_IN_CTX(cuMemAlloc_v2, (CUdeviceptr * dptr, size_t bytes),
          fk_alloc_sync(dev, dptr, bytes))
FK_IN_CTX(cuMemFree_v2, (CUdeviceptr dptr), fk_free_sync(dev, dptr))

/* Stream-ordered allocation: the memory is usable at once, so it is usable
 * in stream order too. The stream must be valid. On a capturing stream it
 * is a memory allocation node (cuda.h, cuMemAllocAsync: "During stream
 * capture, this function results in the creation of an allocation node");
 * the fake allocates at capture and the graph's replays reuse it. */
static CUresult fk_alloc_async(mp_device_t *dev, CUdeviceptr *dptr,
                               size_t bytes, CUstream s, bool ptsz) {
  fk_stream_t *cap = NULL;
  CUresult r = fk_capturing_stream(dev, s, ptsz, &cap);
  if (r != CUDA_SUCCESS)
    return r;
  if (cap != NULL) {
    bool valid = cap->cap == CU_STREAM_CAPTURE_STATUS_ACTIVE;
    pthread_mutex_unlock(&fk.lock); /* fk_alloc takes it */
    if (!valid)
      return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  r = fk_alloc(dev, dptr, bytes, true);
  if (r != CUDA_SUCCESS || cap == NULL)
    return r;
  r = fk_capturing_stream(dev, s, ptsz, &cap);
  if (r == CUDA_SUCCESS && cap != NULL) {
    fk_node_t node = {
        .type = CU_GRAPH_NODE_TYPE_MEM_ALLOC, .dst = *dptr, .n = bytes};
    r = fk_capture_op(cap, &node, NULL);
    if (r == CUDA_SUCCESS && !fk_gmem_own(cap->graph, dev, *dptr, false))
      r = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_unlock(&fk.lock);
  }
  if (r != CUDA_SUCCESS)
    (void)fk_free(dev, *dptr);
  return r;
}

static fk_stream_t *fk_foreign_stream(CUstream h, struct CUctx_st **ctx);

/* The context of an explicit stream handle that is not the current
 * context's but another device's primary context's or one cuCtxCreate
 * made; NULL otherwise (a default stream, the current context's, or no
 * stream: fk_resolve judges). */
static struct CUctx_st *fk_stream_home(CUstream h) {
  if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
    return NULL;
  pthread_mutex_lock(&fk.lock);
  struct CUctx_st *c = fk_ctx(), *home = NULL;
  bool mine = false;
  for (fk_stream_t *st = c->live; st != NULL && !mine; st = st->next)
    mine = (CUstream)st == h;
  if (mine || fk_foreign_stream(h, &home) == NULL)
    home = NULL;
  pthread_mutex_unlock(&fk.lock);
  return home;
}

/* Stream-ordered calls on another device's stream run in that stream's
 * context: cuda.h, cuMemAllocAsync, "The allocation comes from the memory
 * pool current to the stream's device" (cuda_runtime_api.h,
 * cudaMallocAsync: "associated with the stream's device"), and
 * cuMemFreeAsync takes any stream as "the stream establishing the stream
 * ordering contract". The home context is pushed for the call, so the
 * memory is recorded as its device's, and popped again. */
#define FK_IN_STREAM_HOME(s, call)                                             \
  do {                                                                         \
    struct CUctx_st *home_ = fk_stream_home(s);                                \
    if (home_ == NULL)                                                         \
      return call;                                                             \
    if (fk_depth == FK_MAX_CTX_DEPTH)                                          \
      return CUDA_ERROR_INVALID_VALUE;                                         \
    fk_stack[fk_depth++] = home_;                                              \
    mp_device_t *dev_ = dev;                                                   \
    dev = atomic_load(&home_->dev);                                            \
    CUresult r_ = call;                                                        \
    dev = dev_;                                                                \
    fk_depth--;                                                                \
    return r_;                                                                 \
  } while (0)

static CUresult fk_alloc_async_any(mp_device_t *dev, CUdeviceptr *dptr,
                                   size_t bytes, CUstream s, bool ptsz) {
  FK_IN_STREAM_HOME(s, fk_alloc_async(dev, dptr, bytes, s, ptsz));
}

FK_IN_CTX_TWINS(cuMemAllocAsync, cuMemAllocAsync_ptsz,
                (CUdeviceptr * dptr, size_t bytes, CUstream s),
                fk_alloc_async_any(dev, dptr, bytes, s, ptsz))

/* Stream-ordered free: waits for the stream's work, then frees. On a
 * capturing stream it is a memory free node (cuda.h, cuMemFreeAsync);
 * the memory goes when the graph and its executables are (fk_gmem_t). */
static CUresult fk_free_async(mp_device_t *dev, CUdeviceptr dptr, CUstream s,
                              bool ptsz) {
  fk_stream_t *cap = NULL;
  CUresult r = fk_capturing_stream(dev, s, ptsz, &cap);
  if (r != CUDA_SUCCESS)
    return r;
  if (cap != NULL) {
    fk_node_t node = {.type = CU_GRAPH_NODE_TYPE_MEM_FREE, .dst = dptr};
    r = fk_capture_op(cap, &node, NULL);
    if (r == CUDA_SUCCESS && !fk_gmem_own(cap->graph, dev, dptr, true))
      r = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_unlock(&fk.lock);
    return r;
  }
  pthread_mutex_lock(&fk.lock);
  fk_stream_t *st = NULL;
  r = fk_resolve(dev, s, ptsz, &st);
  pthread_mutex_unlock(&fk.lock);
  if (r != CUDA_SUCCESS)
    return r;
  mp_status_t rc = mp_stream_synchronize(dev, fk_host_stream(st));
  return rc == MP_OK ? fk_free_user(dev, dptr) : fk_result_of(rc);
}

static CUresult fk_free_async_any(mp_device_t *dev, CUdeviceptr dptr,
                                  CUstream s, bool ptsz) {
  FK_IN_STREAM_HOME(s, fk_free_async(dev, dptr, s, ptsz));
}

FK_IN_CTX_TWINS(cuMemFreeAsync, cuMemFreeAsync_ptsz,
                (CUdeviceptr dptr, CUstream s),
                fk_free_async_any(dev, dptr, s, ptsz))

static bool fk_pin_range(uintptr_t addr, fk_range_t *r);

/* cuda.h: "the allocation by cuMemAlloc() or cuMemAllocPitch() that
 * contains the input pointer dptr"; a pointer in no allocation is
 * CUDA_ERROR_NOT_FOUND. Page-locked memory (cuMemHostAlloc,
 * cuMemAllocHost) is such an allocation too, as cuPointerGetAttribute's
 * RANGE_START_ADDR and RANGE_SIZE have it (fk_pin_range): with unified
 * addressing its host address is its device pointer (cuda.h, "Automatic
 * Mapping of Host Allocated Host Memory": the pointer value through which
 * it is accessed in kernels "is the same as the pointer value through which
 * that memory is accessed on the host"). */
CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize,
                                 CUdeviceptr dptr) {
  FK_COUNT(cuMemGetAddressRange_v2);
  FK_CURRENT(dev);
  (void)dev;
  fk_range_t r;
  if (!fk_range_find((uintptr_t)dptr, &r) && !fk_pin_range((uintptr_t)dptr, &r))
    return CUDA_ERROR_NOT_FOUND;
  if (pbase != NULL)
    *pbase = (CUdeviceptr)r.base;
  if (psize != NULL)
    *psize = r.size;
  return CUDA_SUCCESS;
}

/* Page-locked allocations (cuMemHostAlloc, cuMemAllocHost), as the driver
 * tracks them (cuda.h, cuMemHostAlloc: "The driver tracks the virtual
 * memory ranges allocated with this function"): each one's range, the
 * flags it was made with and the context it was made in, under fk.lock.
 * With unified addressing a pointer names its allocation whichever
 * context is current (cuda.h, "Unified Addressing"; cuMemAllocHost: the
 * memory is "immediately accessible to all contexts on all devices"), so
 * cuMemFreeHost frees it in the context that made it, as cuMemFree does
 * device memory (fk_free), and cuMemHostGetFlags and
 * cuMemHostGetDevicePointer find it from any address inside it ("the
 * pointer does not reside in an allocation performed by cuMemAllocHost()
 * or cuMemHostAlloc()"). A context's close frees its allocations with its
 * host device and drops them here. */
typedef struct fk_pin {
  uintptr_t base;
  size_t size;
  unsigned flags;
  const struct CUctx_st *ctx;
} fk_pin_t;
static fk_pin_t *fk_pins;
static size_t fk_npins, fk_cap_pins;

/* Under fk.lock: the index of the allocation holding addr (exact: starting
 * at it), or fk_npins. */
static size_t fk_pin_find(uintptr_t addr, bool exact) {
  for (size_t i = 0; i < fk_npins; i++)
    if (exact ? fk_pins[i].base == addr
              : addr - fk_pins[i].base < fk_pins[i].size)
      return i;
  return fk_npins;
}

static bool fk_pin_add(fk_pin_t pin) {
  pthread_mutex_lock(&fk.lock);
  bool ok = true;
  if (fk_npins == fk_cap_pins) {
    size_t cap = fk_cap_pins ? 2 * fk_cap_pins : 16;
    fk_pin_t *p = realloc(fk_pins, cap * sizeof *p);
    if (p == NULL) {
      ok = false;
    } else {
      fk_pins = p;
      fk_cap_pins = cap;
    }
  }
  if (ok)
    fk_pins[fk_npins++] = pin;
  pthread_mutex_unlock(&fk.lock);
  return ok;
}

/* Whether [lo, hi) reaches into page-locked memory. Under fk.lock. */
static bool fk_pin_touches_locked(uintptr_t lo, uintptr_t hi) {
  for (size_t i = 0; i < fk_npins; i++)
    if (fk_pins[i].base < hi && lo < fk_pins[i].base + fk_pins[i].size)
      return true;
  return false;
}

/* The allocation holding addr (exact: starting at it), taken out of the
 * table when take; false when there is none. */
static bool fk_pin_get(uintptr_t addr, bool exact, bool take, fk_pin_t *out) {
  pthread_mutex_lock(&fk.lock);
  size_t i = fk_pin_find(addr, exact);
  bool found = i < fk_npins;
  if (found) {
    *out = fk_pins[i];
    if (take)
      fk_pins[i] = fk_pins[--fk_npins];
  }
  pthread_mutex_unlock(&fk.lock);
  return found;
}

/* The page-locked allocation holding addr as a range (its base and size
 * only); false when there is none. */
static bool fk_pin_range(uintptr_t addr, fk_range_t *r) {
  fk_pin_t pin;
  if (!fk_pin_get(addr, false, false, &pin))
    return false;
  *r = (fk_range_t){.base = pin.base, .size = pin.size};
  return true;
}

static void fk_pins_drop_ctx(const struct CUctx_st *ctx) {
  pthread_mutex_lock(&fk.lock);
  size_t k = 0;
  for (size_t i = 0; i < fk_npins; i++)
    if (fk_pins[i].ctx != ctx)
      fk_pins[k++] = fk_pins[i];
  fk_npins = k;
  pthread_mutex_unlock(&fk.lock);
}

static CUresult fk_host_alloc(mp_device_t *dev, void **pp, size_t bytes,
                              unsigned flags) {
  if (pp == NULL || bytes == 0)
    return CUDA_ERROR_INVALID_VALUE;
  FK_UNSAFE();
  void *p = NULL;
  mp_status_t st = mp_device_host_alloc(dev, bytes, &p);
  if (st != MP_OK)
    return fk_result_of(st);
  if (!fk_pin_add((fk_pin_t){.base = (uintptr_t)p,
                             .size = bytes,
                             .flags = flags,
                             .ctx = fk_stack[fk_depth - 1]})) {
    (void)mp_device_host_free(dev, p);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *pp = p;
  return CUDA_SUCCESS;
}

/* Flags other than PORTABLE | DEVICEMAP | WRITECOMBINED (cuda.h's list):
 * CUDA_ERROR_INVALID_VALUE. cuMemAllocHost takes none. */
FK_IN_CTX(cuMemHostAlloc, (void **pp, size_t bytes, unsigned int flags),
          (flags & ~0x7u ? CUDA_ERROR_INVALID_VALUE
                         : fk_host_alloc(dev, pp, bytes, flags)))
FK_IN_CTX(cuMemAllocHost_v2, (void **pp, size_t bytes),
          fk_host_alloc(dev, pp, bytes, 0))

CUresult cuMemFreeHost(void *p) {
  FK_COUNT(cuMemFreeHost);
  FK_CURRENT(dev);
  FK_UNSAFE();
  fk_pin_t pin;
  /* cuda.h, cuMemFreeHost, promises no synchronization at all: with
   * FAKECUDA_FREE_IN_USE set, freeing page-locked memory that queued
   * copies or memsets still use stops the process, as cuMemFree does. */
  if (p != NULL && getenv("FAKECUDA_FREE_IN_USE") != NULL &&
      fk_pin_get((uintptr_t)p, true, false, &pin)) {
    pthread_mutex_lock(&fk.lock);
    bool busy = fk_in_flight(pin.base, pin.base + pin.size);
    pthread_mutex_unlock(&fk.lock);
    if (busy) {
      fprintf(stderr,
              "fakecuda: cuMemFreeHost(%p) of page-locked memory (%zu "
              "bytes) that queued copies or memsets still use\n",
              p, pin.size);
      if (fk_env_flag_is("FAKECUDA_FREE_IN_USE", "refuse"))
        return CUDA_ERROR_INVALID_VALUE;
      abort();
    }
  }
  if (p == NULL || !fk_pin_get((uintptr_t)p, true, true, &pin))
    return CUDA_ERROR_INVALID_VALUE;
  /* Freed in the context that made it, whichever is current. */
  mp_device_t *home = pin.ctx != NULL ? atomic_load(&pin.ctx->dev) : NULL;
  mp_status_t st = mp_device_host_free(home != NULL ? home : dev, p);
  if (st != MP_OK)
    (void)fk_pin_add(pin);
  return fk_result_of(st);
}

/* cuda.h, cuMemHostGetFlags: "the flags pFlags that were specified when
 * allocating the pinned host buffer p"; it "will fail if the pointer does
 * not reside in an allocation performed by cuMemAllocHost() or
 * cuMemHostAlloc()" (CUDA_ERROR_INVALID_VALUE). */
CUresult cuMemHostGetFlags(unsigned int *pFlags, void *p) {
  FK_COUNT(cuMemHostGetFlags);
  FK_CURRENT(dev);
  (void)dev;
  fk_pin_t pin;
  if (pFlags == NULL || !fk_pin_get((uintptr_t)p, false, false, &pin))
    return CUDA_ERROR_INVALID_VALUE;
  *pFlags = pin.flags;
  return CUDA_SUCCESS;
}

/* cuMemHostRegister / cuMemHostUnregister (cuda.h's documentation): a
 * range already registered (overlapping one) is
 * CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, unregistering a pointer that
 * does not start a registered range CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
 * flags other than PORTABLE | DEVICEMAP | IOMEMORY | READ_ONLY
 * CUDA_ERROR_INVALID_VALUE. The host device needs nothing pinned: the
 * ranges are remembered, under fk.lock, each with the context that
 * registered it, and are device memory to copies and memsets while
 * registered (mp__host_note_import on that context's device, as an IPC
 * import's): cuMemHostRegister "Page-locks the memory range ... and maps
 * it for the device(s)", and "For devices that have a non-zero value for
 * the device attribute
 * CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM [the fake's
 * devices], the memory can also be accessed from the device using the
 * host pointer p"; cuMemHostUnregister "Unmaps the memory range". Before
 * 2026-12-04 the device did not know it, and refused a memset of it.
 * Each keeps its flags: DEVICEMAP for cuMemHostGetDevicePointer, READ_ONLY
 * for copies and memsets ("The pointer is treated as pointing to memory
 * that is considered read-only by the device", fk_read_only_touched). A
 * context's close forgets its registrations, as its device does
 * (fk_registered_drop_ctx). */
#define FK_MAX_REGISTERED 64
static struct {
  uintptr_t base;
  size_t size;
  unsigned flags;
  struct CUctx_st *ctx;
} fk_registered[FK_MAX_REGISTERED];

/* Whether the registration holding addr is mapped in the current context
 * (ctx): registered DEVICEMAP, and PORTABLE or by ctx. cuda.h,
 * cuMemHostRegister: "CU_MEMHOSTREGISTER_PORTABLE: The memory returned by
 * this call will be considered as pinned memory by all CUDA contexts, not
 * just the one that performed the allocation", and a DEVICEMAP failure "is
 * deferred to cuMemHostGetDevicePointer() because the memory may be mapped
 * into other CUDA contexts via the CU_MEMHOSTREGISTER_PORTABLE flag": without
 * it, only the registering context has it mapped. (cuMemHostAlloc's memory
 * is every context's whatever its flags, cuda.h "Unified Addressing", which
 * names registered memory among its exceptions.) Before 2026-12-04 every
 * context had it. */
static bool fk_registered_mapped_in(uintptr_t addr,
                                    const struct CUctx_st *ctx) {
  bool mapped = false;
  pthread_mutex_lock(&fk.lock);
  for (int i = 0; i < FK_MAX_REGISTERED; i++)
    if (fk_registered[i].size != 0 &&
        addr - fk_registered[i].base < fk_registered[i].size)
      mapped = (fk_registered[i].flags & CU_MEMHOSTREGISTER_DEVICEMAP) != 0 &&
               ((fk_registered[i].flags & CU_MEMHOSTREGISTER_PORTABLE) != 0 ||
                fk_registered[i].ctx == ctx);
  pthread_mutex_unlock(&fk.lock);
  return mapped;
}

/* Whether [lo, lo + n) reaches into a registration that context ctx does
 * not have: registered without PORTABLE by another context. cuda.h,
 * cuMemHostRegister: without CU_MEMHOSTREGISTER_PORTABLE the memory is
 * "considered as pinned memory" by "the one [context] that performed the
 * allocation" only, and it is the registration that "maps it for the
 * device(s)"; the host-pointer access ("the memory can also be accessed
 * from the device using the host pointer p") is that mapping's. To another
 * context the range is plain pageable host memory, which no device of the
 * fake reads or writes itself (CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS,
 * "Device supports coherently accessing pageable memory without calling
 * cudaHostRegister on it", answers 0). cuMemHostAlloc's memory is not
 * here: it is every context's (cuda.h "Unified Addressing", whose
 * "Exceptions, Disjoint Addressing" names registered memory). Under
 * fk.lock. */
static bool fk_registered_foreign(uintptr_t lo, size_t n,
                                  const struct CUctx_st *ctx) {
  uintptr_t hi = n > UINTPTR_MAX - lo ? UINTPTR_MAX : lo + n;
  for (int i = 0; i < FK_MAX_REGISTERED; i++)
    if (fk_registered[i].size != 0 &&
        (fk_registered[i].flags & CU_MEMHOSTREGISTER_PORTABLE) == 0 &&
        fk_registered[i].ctx != ctx && fk_registered[i].base < hi &&
        lo < fk_registered[i].base + fk_registered[i].size)
      return true;
  return false;
}

/* Whether [lo, lo + n) reaches into a READ_ONLY registration. Under
 * fk.lock. */
static bool fk_read_only_touched(uintptr_t lo, size_t n) {
  uintptr_t hi = n > UINTPTR_MAX - lo ? UINTPTR_MAX : lo + n;
  for (int i = 0; i < FK_MAX_REGISTERED; i++)
    if (fk_registered[i].size != 0 &&
        (fk_registered[i].flags & CU_MEMHOSTREGISTER_READ_ONLY) != 0 &&
        fk_registered[i].base < hi &&
        lo < fk_registered[i].base + fk_registered[i].size)
      return true;
  return false;
}

/* What the CPU may do with every page of [lo, hi), from /proc/self/maps
 * (proc(5): one line a mapping, "address perms offset dev inode pathname",
 * in address order). Lines are read whole (getline): a mapping of a file
 * with a long path makes a line of any length, and a fixed buffer would
 * read its tail as a line of its own, whose text (a file name may be
 * "7f00-7f10 r--p") parsed as a mapping. Before 2026-12-05 a 512-byte
 * buffer did so, and a page mapped nowhere in the range (a hole) was not
 * noticed. */
typedef enum {
  FK_CPU_WRITABLE,  /* mapped readable and writable throughout */
  FK_CPU_READ_ONLY, /* mapped readable throughout, a page not writable */
  FK_CPU_NONE       /* a page not mapped, or mapped without read access */
} fk_cpu_access_t;

static fk_cpu_access_t fk_cpu_access(uintptr_t lo, uintptr_t hi) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (f == NULL)
    return FK_CPU_WRITABLE; /* not known: taken, as before */
  fk_cpu_access_t a = FK_CPU_WRITABLE;
  uintptr_t next = lo; /* [lo, next) is mapped readable */
  char *line = NULL, perms[8];
  size_t cap = 0;
  unsigned long b0, b1;
  bool stopped = false;
  while (!stopped && next < hi && getline(&line, &cap, f) != -1) {
    if (sscanf(line, "%lx-%lx %7s", &b0, &b1, perms) != 3 || b1 <= next)
      continue;
    /* A hole before this mapping, or a page the CPU cannot read. */
    stopped = b0 > next || perms[0] != 'r';
    if (!stopped && perms[1] != 'w')
      a = FK_CPU_READ_ONLY;
    if (!stopped)
      next = b1;
  }
  /* Short of hi: a hole, an unreadable page, or nothing mapped after next
   * (the end of the list); a read that failed before the end (getline's
   * ENOMEM) says nothing about the rest. */
  if (next < hi && (stopped || feof(f)))
    a = FK_CPU_NONE;
  free(line);
  fclose(f);
  return a;
}

static CUresult fk_host_register(mp_device_t *dev, void *p, size_t bytes,
                                 unsigned flags) {
  const unsigned known =
      CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
      CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
  if (p == NULL || bytes == 0 || (flags & ~known) != 0 ||
      bytes > UINTPTR_MAX - (uintptr_t)p)
    return CUDA_ERROR_INVALID_VALUE;
  /* cuMemHostRegister "Page-locks the memory range specified by p and
   * bytesize" (cuda.h): a page mapped nowhere, or mapped without read
   * access (PROT_NONE), cannot be page-locked or mapped for the device.
   * cuda.h names no code for it: CUDA_ERROR_INVALID_VALUE, the one it
   * lists for a bad argument (NVIDIA/open-gpu-kernel-modules issue 732
   * reports cudaHostRegister answering "invalid argument" for pages the
   * driver could not pin; the fake's choice, not checked on a GPU); nothing
   * is registered, whatever the flags. Before 2026-12-05 the fake registered
   * such a range, and its device took the hole for memory. */
  fk_cpu_access_t cpu = fk_cpu_access((uintptr_t)p, (uintptr_t)p + bytes);
  if (cpu == FK_CPU_NONE)
    return CUDA_ERROR_INVALID_VALUE;
  /* cuda.h, CU_MEMHOSTREGISTER_READ_ONLY: "On platforms without
   * CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES [the
   * fake's devices answer 0], this flag is required in order to register
   * memory mapped to the CPU as read-only". cuda.h names no code for the
   * failure: CUDA_ERROR_INVALID_VALUE, the one cuMemHostRegister lists for
   * a bad range; nothing is registered. Before 2026-12-04 the fake took
   * such a range without the flag. */
  if ((flags & CU_MEMHOSTREGISTER_READ_ONLY) == 0 && cpu == FK_CPU_READ_ONLY)
    return CUDA_ERROR_INVALID_VALUE;
  uintptr_t b = (uintptr_t)p;
  CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&fk.lock);
  int slot = -1;
  for (int i = 0; i < FK_MAX_REGISTERED; i++) {
    if (fk_registered[i].size == 0) {
      slot = slot < 0 ? i : slot;
    } else if (b < fk_registered[i].base + fk_registered[i].size &&
               fk_registered[i].base < b + bytes) {
      r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
      slot = -1;
      break;
    }
  }
  if (slot >= 0) {
    fk_registered[slot].base = b;
    fk_registered[slot].size = bytes;
    fk_registered[slot].flags = flags;
    fk_registered[slot].ctx = fk_ctx();
    r = CUDA_SUCCESS;
  }
  pthread_mutex_unlock(&fk.lock);
  if (r == CUDA_SUCCESS && mp__host_note_import(dev, p, bytes, true) != MP_OK) {
    pthread_mutex_lock(&fk.lock);
    fk_registered[slot].size = 0; /* nothing changed */
    pthread_mutex_unlock(&fk.lock);
    r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  return r;
}

static CUresult fk_host_unregister(mp_device_t *dev, void *p) {
  CUresult r = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  struct CUctx_st *c = NULL;
  pthread_mutex_lock(&fk.lock);
  for (int i = 0; p != NULL && i < FK_MAX_REGISTERED; i++)
    if (fk_registered[i].size != 0 && fk_registered[i].base == (uintptr_t)p) {
      fk_registered[i].size = 0;
      c = fk_registered[i].ctx;
      r = CUDA_SUCCESS;
      break;
    }
  pthread_mutex_unlock(&fk.lock);
  if (r == CUDA_SUCCESS) {
    /* Known to the device of the context that registered it. */
    mp_device_t *home = c != NULL ? atomic_load(&c->dev) : NULL;
    (void)mp__host_note_import(home != NULL ? home : dev, p, 0, false);
  }
  return r;
}

/* The registrations of a context whose device closed (with them). */
static void fk_registered_drop_ctx(const struct CUctx_st *ctx) {
  pthread_mutex_lock(&fk.lock);
  for (int i = 0; i < FK_MAX_REGISTERED; i++)
    if (fk_registered[i].ctx == ctx)
      fk_registered[i].size = 0;
  pthread_mutex_unlock(&fk.lock);
}

/* cuda.h, cuMemHostGetDevicePointer: "Passes back the device pointer pdptr
 * corresponding to the mapped, pinned host buffer p allocated by
 * cuMemHostAlloc"; it "will fail if the CU_MEMHOSTALLOC_DEVICEMAP flag was
 * not specified at the time the memory was allocated"; "Flags provides for
 * future releases. For now, it must be set to 0". cuMemHostRegister's
 * memory has one too: "CU_MEMHOSTREGISTER_DEVICEMAP: Maps the allocation
 * into the CUDA address space. The device pointer to the memory may be
 * obtained by calling cuMemHostGetDevicePointer()" (a registration made
 * without it is refused, read as cuMemHostAlloc's rule; before 2026-12-04
 * every registration was). Any address inside a mapped allocation has its
 * device pointer: "If all devices visible to the application have a
 * non-zero value for the device attribute
 * [CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM, the fake's], the device pointer
 * returned by cuMemHostGetDevicePointer() will match the original pointer". */
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p,
                                      unsigned int Flags) {
  FK_COUNT(cuMemHostGetDevicePointer_v2);
  FK_CURRENT(dev);
  (void)dev;
  fk_pin_t pin;
  if (pdptr == NULL || Flags != 0)
    return CUDA_ERROR_INVALID_VALUE;
  bool mapped = fk_pin_get((uintptr_t)p, false, false, &pin)
                    ? (pin.flags & CU_MEMHOSTALLOC_DEVICEMAP) != 0
                    : fk_registered_mapped_in((uintptr_t)p, fk_ctx());
  if (!mapped)
    return CUDA_ERROR_INVALID_VALUE;
  *pdptr = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}

FK_IN_CTX(cuMemHostRegister_v2, (void *p, size_t bytes, unsigned int flags),
          fk_host_register(dev, p, bytes, flags))
FK_IN_CTX(cuMemHostUnregister, (void *p), fk_host_unregister(dev, p))

/* ---- streams, copies, events --------------------------------------------- */

/* cuStreamCreate's flags: CU_STREAM_DEFAULT (a blocking stream) or
 * CU_STREAM_NON_BLOCKING; priorities do not change how the host runs it. */
static CUresult fk_stream_create(mp_device_t *dev, CUstream *ps,
                                 unsigned flags) {
  if (ps == NULL || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fk.lock);
  fk_reap(dev, fk_ctx());
  fk_stream_t *st = NULL;
  CUresult r = fk_stream_new(dev, !(flags & CU_STREAM_NON_BLOCKING), &st);
  pthread_mutex_unlock(&fk.lock);
  if (r == CUDA_SUCCESS)
    *ps = (CUstream)st;
  return r;
}

FK_IN_CTX(cuStreamCreate, (CUstream * ps, unsigned int flags),
          fk_stream_create(dev, ps, flags))
FK_IN_CTX(cuStreamCreateWithPriority,
          (CUstream * ps, unsigned int flags, int priority),
          ((void)priority, fk_stream_create(dev, ps, flags)))

/* cuda.h, cuStreamDestroy: "In case the device is still doing work in the
 * stream hStream when cuStreamDestroy() is called, the function will return
 * immediately and the resources associated with hStream will be released
 * automatically once the device has completed all work in hStream." The
 * handle is dead at once: a later use stops the process (fk_dead_or_bad).
 * The default streams cannot be destroyed. */
CUresult cuStreamDestroy_v2(CUstream h) {
  FK_COUNT(cuStreamDestroy_v2);
  FK_CURRENT(dev);
  if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
    return fk_bad_handle();
  struct CUctx_st *c = fk_ctx();
  pthread_mutex_lock(&fk.lock);
  fk_stream_t **at = &c->live;
  while (*at != NULL && (CUstream)*at != h)
    at = &(*at)->next;
  fk_stream_t *st = *at;
  if (st != NULL) {
    *at = st->next;
    fk_dead_add(h);
    (void)fk_capture_end(st, false);
    st->next = c->retired;
    c->retired = st;
    (void)mp_event_record(dev, st->tail, st->s); /* its end, for fk_reap */
    fk_reap(dev, c);
  }
  /* Destroyed twice: a use of a dead handle like any other. */
  CUresult r = st != NULL ? CUDA_SUCCESS : fk_dead_or_bad(h);
  pthread_mutex_unlock(&fk.lock);
  return r;
}

/* Waits for a stream's work (not holding fk.lock). */
static CUresult fk_stream_sync(mp_device_t *dev, CUstream s, bool ptsz) {
  mp_stream_t hs = NULL;
  CUresult r = fk_lookup_stream(dev, s, ptsz, &hs);
  return r == CUDA_SUCCESS ? fk_result_of(mp_stream_synchronize(dev, hs)) : r;
}

FK_IN_CTX_TWINS(cuStreamSynchronize, cuStreamSynchronize_ptsz, (CUstream s),
                fk_stream_sync(dev, s, ptsz))

/* The host backend has no stream query: ask an event recorded at its end. */
/* CUDA_SUCCESS when all work queued on s so far has completed (cuda.h,
 * cuStreamQuery). Asked of the host stream itself: recording a marker and
 * querying it at once asked whether the worker had already reached the new
 * marker, which it rarely had, so an idle stream read as busy. */
static CUresult fk_stream_query(mp_device_t *dev, CUstream s, bool ptsz) {
  mp_stream_t hs = NULL;
  CUresult r = fk_lookup_stream(dev, s, ptsz, &hs);
  return r == CUDA_SUCCESS ? fk_result_of(mp_stream_query(dev, hs)) : r;
}

FK_IN_CTX_TWINS(cuStreamQuery, cuStreamQuery_ptsz, (CUstream s),
                fk_stream_query(dev, s, ptsz))

/* A stream of c, or NULL. Under fk.lock. */
static fk_stream_t *fk_stream_in(struct CUctx_st *c, CUstream h) {
  for (fk_stream_t *st = c->live; st != NULL; st = st->next)
    if ((CUstream)st == h)
      return st;
  return NULL;
}

/* A stream made in a context that is not current: another device's
 * primary context, or one cuCtxCreate made (cuda.h, cuStreamGetCtx:
 * "Returns the CUDA context that the stream is associated with", asked of
 * any stream; cuMemFreeAsync takes any stream), with it in *ctx; or NULL.
 * Under fk.lock. */
static fk_stream_t *fk_foreign_stream(CUstream h, struct CUctx_st **ctx) {
  fk_stream_t *st;
  for (int i = 0; i < fk.count; i++)
    if ((st = fk_stream_in(&fk.ctx[i], h)) != NULL) {
      *ctx = &fk.ctx[i];
      return st;
    }
  for (struct CUctx_st *c = fk.created; c != NULL; c = c->next_created)
    if ((st = fk_stream_in(c, h)) != NULL) {
      *ctx = c;
      return st;
    }
  return NULL;
}

/* fk_resolve for the queries that answer a stream of any context
 * (cuStreamGetCtx, cuStreamGetFlags, cuStreamIsCapturing and
 * cuStreamGetCaptureInfo): an explicit handle of a stream of another
 * context (fk_foreign_stream) is that stream, its context in *ctx (the
 * current context otherwise); only a handle that is no live stream of any
 * context is CUDA_ERROR_INVALID_HANDLE, counted (cuFakeGetErrorCount).
 * Before, fk_resolve counted another context's stream as an invalid handle
 * before it was found and answered, so the count grew with legal queries.
 * Under fk.lock. */
static CUresult fk_resolve_any(mp_device_t *dev, CUstream h, bool ptsz,
                               fk_stream_t **out, struct CUctx_st **ctx) {
  *ctx = fk_ctx();
  struct CUctx_st *other = NULL;
  fk_stream_t *st = NULL;
  if (h != NULL && h != CU_STREAM_LEGACY && h != CU_STREAM_PER_THREAD &&
      fk_stream_in(*ctx, h) == NULL &&
      (st = fk_foreign_stream(h, &other)) != NULL) {
    *out = st;
    *ctx = other;
    return CUDA_SUCCESS;
  }
  return fk_resolve(dev, h, ptsz, out);
}

/* cuda.h, cuStreamGetFlags: the flags the stream was created with (a
 * per-thread or legacy default stream: CU_STREAM_DEFAULT). A stream of
 * another context is answered as the real driver answers it: on an H200
 * (driver 580.159.04, 2026-11-28) cuStreamGetFlags gave its flags
 * (CUDA_SUCCESS) with another context current (only other devices' primary
 * contexts are searched here); a handle that is no live stream at all is
 * CUDA_ERROR_INVALID_HANDLE (fk_resolve), one of the codes cuda.h lists.
 * Asked of a stream that captures, it is refused with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture, in
 * global and relaxed mode alike (an H200, driver 580.159.04, 2026-11-28;
 * cuda.h lists no capture error for it). */
static CUresult fk_stream_flags(mp_device_t *dev, CUstream h, bool ptsz,
                                unsigned int *flags) {
  if (flags == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fk.lock);
  fk_stream_t *st = NULL;
  struct CUctx_st *home = NULL;
  CUresult r = fk_resolve_any(dev, h, ptsz, &st, &home);
  if (r == CUDA_SUCCESS && home == fk_ctx() && st != NULL &&
      st->cap != CU_STREAM_CAPTURE_STATUS_NONE)
    r = fk_capture_conflict(st, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  pthread_mutex_unlock(&fk.lock);
  if (r == CUDA_SUCCESS)
    *flags =
        st == NULL || st->blocking ? CU_STREAM_DEFAULT : CU_STREAM_NON_BLOCKING;
  return r;
}

/* cuda.h, cuStreamGetCtx: the context the stream belongs to; for the
 * legacy and per-thread default streams, the current context. */
static CUresult fk_stream_ctx(mp_device_t *dev, CUstream h, CUcontext *pctx) {
  if (pctx == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fk.lock);
  fk_stream_t *st = NULL;
  struct CUctx_st *c = NULL;
  CUresult r = fk_resolve_any(dev, h, false, &st, &c);
  pthread_mutex_unlock(&fk.lock);
  if (r == CUDA_SUCCESS)
    *pctx = c;
  return r;
}

FK_IN_CTX(cuStreamGetCtx, (CUstream h, CUcontext *pctx),
          fk_stream_ctx(dev, h, pctx))
FK_IN_CTX_TWINS(cuStreamGetFlags, cuStreamGetFlags_ptsz,
                (CUstream s, unsigned int *flags),
                fk_stream_flags(dev, s, ptsz, flags))

/* A host function as it runs: CUDA calls from it are refused (FK_COUNT). */
typedef struct fk_host_call {
  CUhostFn fn;
  void *arg;
} fk_host_call_t;

static void fk_host_trampoline(void *p) {
  fk_host_call_t call = *(fk_host_call_t *)p;
  free(p);
  fk_in_host_fn = true;
  call.fn(call.arg);
  fk_in_host_fn = false;
}

static CUresult fk_launch_host(mp_device_t *dev, CUstream s, bool ptsz,
                               CUhostFn fn, void *arg) {
  if (fn == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  fk_host_call_t *call = malloc(sizeof *call);
  if (call == NULL)
    return CUDA_ERROR_OUT_OF_MEMORY;
  *call = (fk_host_call_t){fn, arg};
  mp_stream_t hs = NULL;
  bool captured = false;
  fk_node_t node = {.type = CU_GRAPH_NODE_TYPE_HOST, .fn = fn, .arg = arg};
  CUresult r = fk_begin(dev, s, ptsz, &node, NULL, &hs, &captured);
  if (r == CUDA_SUCCESS && !captured) {
    r = fk_result_of(mp_stream_launch_host(dev, hs, fk_host_trampoline, call));
    fk_end();
    if (r == CUDA_SUCCESS)
      return r;
  }
  free(call);
  return r;
}

FK_IN_CTX_TWINS(cuLaunchHostFunc, cuLaunchHostFunc_ptsz,
                (CUstream s, CUhostFn fn, void *arg),
                fk_launch_host(dev, s, ptsz, fn, arg))

/* A copy (set: a memset of value v) on stream s; sync waits for it. */
static CUresult fk_copy(mp_device_t *dev, CUdeviceptr dst, CUdeviceptr src,
                        bool set, unsigned char v, size_t n, CUstream s,
                        bool ptsz, bool sync) {
  if (n == 0)
    return CUDA_SUCCESS;
  if (dst == 0 || (!set && src == 0))
    return CUDA_ERROR_INVALID_VALUE;
  if (sync)
    FK_UNSAFE();
  mp_stream_t hs = NULL;
  bool captured = false;
  fk_node_t node = {.type = set ? CU_GRAPH_NODE_TYPE_MEMSET
                                : CU_GRAPH_NODE_TYPE_MEMCPY,
                    .dst = dst,
                    .src = src,
                    .value = v,
                    .n = n};
  CUresult r = fk_begin(dev, s, ptsz, &node, NULL, &hs, &captured);
  if (r != CUDA_SUCCESS || captured)
    return r;
  int ordinal = fk_ctx()->ordinal; /* the device the stream runs on */
  if (!fk_within_allocation((uintptr_t)dst, n) ||
      (!set && !fk_within_allocation((uintptr_t)src, n))) {
    fk_end();
    fprintf(stderr,
            "fakecuda: a copy or memset of %zu bytes (dst %p, src %p) runs "
            "past the end of an allocation: CUDA_ERROR_INVALID_VALUE\n",
            n, (void *)dst, (void *)src);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!fk_access_ok((uintptr_t)dst, n, ordinal, true) ||
      (!set && !fk_access_ok((uintptr_t)src, n, ordinal, false))) {
    fk_end();
    return fk_no_access(ordinal, dst, src, n,
                        "touches a mapping that device may not access "
                        "(cuMemSetAccess)");
  }
  /* A memset of memory another context registered without PORTABLE
   * (fk_registered_foreign): in this context it is pageable host memory, no
   * device pointer, and cuMemsetD8 / cuMemsetD8Async take "dstDevice -
   * Destination device pointer", listing CUDA_ERROR_INVALID_VALUE (cuda.h),
   * the code the fake gives a memset of any pageable memory (host.c,
   * host_check_access); nothing is written. Copies still take it, as
   * pageable memory: cuMemcpy "infers the type of the transfer ... from the
   * pointer values" (cuda.h, cuMemcpy). Before 2026-12-05 the
   * memset ran: the registering context's device knew the range. */
  if (set && fk_registered_foreign((uintptr_t)dst, n, fk_ctx())) {
    fk_end();
    fprintf(stderr,
            "fakecuda: a memset of %zu bytes at %p: host memory another "
            "context registered without CU_MEMHOSTREGISTER_PORTABLE is "
            "pageable memory here, no device pointer: "
            "CUDA_ERROR_INVALID_VALUE\n",
            n, (void *)dst);
    return CUDA_ERROR_INVALID_VALUE;
  }
  /* A device write to a READ_ONLY registration (fk_host_register): a GPU
   * faults on it, the fake refuses it, as a write to a mapping the device
   * may only read. */
  if (fk_read_only_touched((uintptr_t)dst, n)) {
    fk_end();
    return fk_no_access(ordinal, dst, src, n,
                        "writes host memory registered "
                        "CU_MEMHOSTREGISTER_READ_ONLY");
  }
  mp_status_t st =
      set ? mp_memset_async(dev, (void *)dst, v, n, hs)
          : mp_memcpy_async(dev, (void *)dst, (const void *)src, n, hs);
  if (st == MP_OK && !sync)
    fk_flight_add(dev, hs, (uintptr_t)dst, set ? 0 : (uintptr_t)src, n);
  fk_end();
  if (st == MP_OK && sync)
    st = mp_stream_synchronize(dev, hs);
  return fk_result_of(st);
}

static CUresult fk_memcpy(mp_device_t *dev, CUdeviceptr dst, CUdeviceptr src,
                          size_t n, CUstream s, bool ptsz, bool sync) {
  return fk_copy(dev, dst, src, false, 0, n, s, ptsz, sync);
}

static CUresult fk_memset(mp_device_t *dev, CUdeviceptr dst, unsigned char v,
                          size_t n, CUstream s, bool ptsz, bool sync) {
  return fk_copy(dev, dst, 0, true, v, n, s, ptsz, sync);
}

FK_IN_CTX_TWINS(cuMemcpyAsync, cuMemcpyAsync_ptsz,
                (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s),
                fk_memcpy(dev, dst, src, n, s, ptsz, false))
FK_IN_CTX_TWINS(cuMemsetD8Async, cuMemsetD8Async_ptsz,
                (CUdeviceptr dst, unsigned char v, size_t n, CUstream s),
                fk_memset(dev, dst, v, n, s, ptsz, false))

/* The synchronous copies run on the default stream and wait for it. */
FK_IN_CTX_TWINS(cuMemcpy, cuMemcpy_ptds,
                (CUdeviceptr dst, CUdeviceptr src, size_t n),
                fk_memcpy(dev, dst, src, n, NULL, ptsz, true))
FK_IN_CTX_TWINS(cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds,
                (CUdeviceptr dst, const void *src, size_t n),
                fk_memcpy(dev, dst, (CUdeviceptr)src, n, NULL, ptsz, true))
FK_IN_CTX_TWINS(cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds,
                (void *dst, CUdeviceptr src, size_t n),
                fk_memcpy(dev, (CUdeviceptr)dst, src, n, NULL, ptsz, true))
FK_IN_CTX_TWINS(cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds,
                (CUdeviceptr dst, CUdeviceptr src, size_t n),
                fk_memcpy(dev, dst, src, n, NULL, ptsz, true))
FK_IN_CTX_TWINS(cuMemsetD8_v2, cuMemsetD8_v2_ptds,
                (CUdeviceptr dst, unsigned char v, size_t n),
                fk_memset(dev, dst, v, n, NULL, ptsz, true))

CUresult cuEventCreate(CUevent *pe, unsigned int flags) {
  FK_COUNT(cuEventCreate);
  FK_CURRENT(dev);
  /* cuda.h, cuEventCreate: the valid flags are CU_EVENT_DEFAULT,
   * CU_EVENT_BLOCKING_SYNC, CU_EVENT_DISABLE_TIMING and
   * CU_EVENT_INTERPROCESS, which "must be specified along with
   * CU_EVENT_DISABLE_TIMING". The fake keeps no timing either way. */
  const unsigned known =
      CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (pe == NULL || (flags & ~known) != 0 ||
      ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING)))
    return CUDA_ERROR_INVALID_VALUE;
  mp_event_t e = NULL;
  mp_status_t st = mp_event_create(dev, &e);
  if (st == MP_OK)
    *pe = (CUevent)e;
  return fk_result_of(st);
}

/* An event call: a NULL event is an invalid handle, as in the driver. */
#define FK_EVENT_CALL(e, call)                                                 \
  ((e) == NULL ? fk_bad_handle() : fk_result_of(call))

/* The latest record of e, if it was made on a stream that captures (the
 * one a wait uses: cuda.h, cuEventRecord), with *from set to that stream;
 * NULL when e was last recorded outside any capture. Under fk.lock. */
static fk_cap_event_t *fk_captured_event(CUevent e, fk_stream_t **from) {
  for (fk_stream_t *st = fk_capturing; st != NULL; st = st->cap_next)
    for (size_t i = 0; i < st->n_cap_events; i++)
      if (st->cap_events[i].ev == e) {
        *from = st;
        return &st->cap_events[i];
      }
  return NULL;
}

/* A new record of e overwrites the one before (cuda.h, cuEventRecord):
 * e is no captured event unless this record is one. Under fk.lock. */
static void fk_captured_event_forget(CUevent e) {
  for (fk_stream_t *st = fk_capturing; st != NULL; st = st->cap_next)
    for (size_t i = 0; i < st->n_cap_events;)
      if (st->cap_events[i].ev == e)
        st->cap_events[i] = st->cap_events[--st->n_cap_events];
      else
        i++;
}

/* Stream h waits on e, recorded last in a capture (the Programming Guide,
 * "Cross-stream Dependencies and Events": "When a captured event is waited
 * on by a stream, it places the stream in capture mode if it is not
 * already, and the next item in the stream will have additional
 * dependencies on the nodes in the captured event. The two streams are
 * then being captured to the same capture graph."). A stream that joins
 * takes the capture's id, graph, mode and thread, so cuStreamGetCaptureInfo
 * gives it the origin's id (cuda.h: the id is of the "capture sequence"),
 * the unsafe calls its mode forbids are refused (fk_unsafe) and a wait on
 * or query of it is a conflict (fk_lookup_stream), until the origin's
 * cuStreamEndCapture (fk_end_capture). A stream that captures another
 * graph cannot wait on it (cuda.h, CUDA_ERROR_STREAM_CAPTURE_MERGE: "would
 * have resulted in a merge of two independent capture sequences"), and
 * both captures are invalidated (the Programming Guide, "Prohibited and
 * Unhandled Operations" and "Invalidation": "any associated capture
 * graphs are invalidated"). Nor can a capturing stream wait on an event
 * recorded outside any capture, unless the wait is CU_EVENT_WAIT_EXTERNAL
 * (the same section: "It is invalid to wait on a non-captured event from
 * a stream which is being captured without specifying the
 * cudaEventWaitExternal flag"; cuda.h, CUDA_ERROR_STREAM_CAPTURE_ISOLATION:
 * "a dependency would have been created which crosses the capture sequence
 * boundary"): refused, the capture invalidated. The legacy stream (never
 * capturing: cuda.h, cuStreamBeginCapture) is left to wait as before.
 * Under fk.lock. */
static CUresult fk_capture_join(mp_device_t *dev, CUstream h, bool ptsz,
                                CUevent e, unsigned flags) {
  fk_stream_t *st = NULL, *from = NULL;
  /* The flags are CUevent_wait_flags, and CU_EVENT_WAIT_EXTERNAL "is
   * invalid outside of stream capture" (cuda.h, cuStreamWaitEvent): the
   * legacy stream never captures. */
  if (flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL)
    return CUDA_ERROR_INVALID_VALUE;
  if (fk_resolve(dev, h, ptsz, &st) != CUDA_SUCCESS)
    return CUDA_SUCCESS; /* a wait like any other (fk_begin answers) */
  if (st == NULL)
    return flags ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
  fk_cap_event_t *rec = fk_captured_event(e, &from);
  if (rec == NULL && st->cap == CU_STREAM_CAPTURE_STATUS_NONE && flags)
    return CUDA_ERROR_INVALID_VALUE;
  if (rec == NULL && st->cap != CU_STREAM_CAPTURE_STATUS_NONE &&
      !(flags & CU_EVENT_WAIT_EXTERNAL))
    return fk_capture_conflict(st, CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
  if (rec == NULL)
    return CUDA_SUCCESS;
  fk_stream_t *origin = fk_capture_origin(from);
  if (st->cap != CU_STREAM_CAPTURE_STATUS_NONE) {
    if (fk_capture_origin(st) != origin) {
      fk_capture_invalidate(st);
      return fk_capture_conflict(from, CUDA_ERROR_STREAM_CAPTURE_MERGE);
    }
  } else {
    if (origin->cap_width == FK_CAP_STREAMS)
      return CUDA_ERROR_OUT_OF_MEMORY; /* the fake's limit */
    st->cap = origin->cap;
    st->cap_mode = origin->cap_mode;
    st->cap_thread = origin->cap_thread;
    st->cap_id = origin->cap_id;
    st->graph = origin->graph;
    st->cap_origin = origin;
    st->cap_slot = origin->cap_width++;
    memset(st->cap_clock, 0, sizeof st->cap_clock);
    st->cap_next = fk_capturing;
    fk_capturing = st;
    atomic_fetch_add(&fk_n_captures, 1);
  }
  for (unsigned k = 0; k < FK_CAP_STREAMS; k++)
    if (rec->clock[k] > st->cap_clock[k])
      st->cap_clock[k] = rec->clock[k];
  return CUDA_SUCCESS;
}

/* An operation on a stream (an event record, a wait) in stream order. */
static CUresult fk_event_op(mp_device_t *dev, CUevent e, CUstream s, bool ptsz,
                            bool wait, unsigned flags) {
  if (e == NULL)
    return fk_bad_handle();
  pthread_mutex_lock(&fk.lock);
  CUresult r = CUDA_SUCCESS;
  if (wait)
    r = fk_capture_join(dev, s, ptsz, e, flags);
  else {
    fk_captured_event_forget(e);
    (void)fk_stale_cap_take(e, true);
  }
  pthread_mutex_unlock(&fk.lock);
  if (r != CUDA_SUCCESS)
    return r;
  mp_stream_t hs = NULL;
  bool captured = false;
  r = fk_begin(dev, s, ptsz, NULL, wait ? NULL : e, &hs, &captured);
  if (r != CUDA_SUCCESS || captured)
    return r;
  mp_status_t st = wait ? mp_stream_wait_event(dev, hs, (mp_event_t)e)
                        : mp_event_record(dev, (mp_event_t)e, hs);
  fk_end();
  return fk_result_of(st);
}

FK_IN_CTX_TWINS(cuEventRecord, cuEventRecord_ptsz, (CUevent e, CUstream s),
                fk_event_op(dev, e, s, ptsz, false, 0))
/* An event last recorded inside a capture cannot be waited for or queried,
 * whatever the mode (cuda.h, cuThreadExchangeStreamCaptureMode); doing so
 * invalidates the capture and is refused with CUDA_ERROR_CAPTURED_EVENT
 * ("not permitted on an event which was last recorded in a capturing
 * stream": what an H200 answered cuEventQuery, driver 580.159.04,
 * 2026-11-28). Waiting for or querying any other event is an
 * unsafe call (fk_unsafe): seen on an H200 (driver 580.159.04, 2026-11-28)
 * as for streams (fk_lookup_stream). */
static CUresult fk_event_wait(mp_device_t *dev, CUevent e, bool query) {
  if (e == NULL)
    return fk_bad_handle();
  pthread_mutex_lock(&fk.lock);
  bool stale = fk_stale_cap_take(e, false);
  pthread_mutex_unlock(&fk.lock);
  if (stale) {
    fprintf(stderr,
            "fakecuda: %s(%p) of an event last recorded in a "
            "capture that has ended: CUDA_ERROR_CAPTURED_EVENT\n",
            query ? "cuEventQuery" : "cuEventSynchronize", (void *)e);
    atomic_fetch_add(&fk_capture_refusals, 1);
    return CUDA_ERROR_CAPTURED_EVENT;
  }
  if (atomic_load(&fk_n_captures) > 0) {
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&fk.lock);
    for (fk_stream_t *st = fk_capturing; st != NULL; st = st->cap_next)
      for (size_t i = 0; i < st->n_cap_events; i++)
        if (st->cap_events[i].ev == e)
          r = fk_capture_conflict(st, CUDA_ERROR_CAPTURED_EVENT);
    pthread_mutex_unlock(&fk.lock);
    if (r == CUDA_SUCCESS)
      r = fk_unsafe();
    if (r != CUDA_SUCCESS)
      return r;
  }
  return fk_result_of(query ? mp_event_query(dev, (mp_event_t)e)
                            : mp_event_synchronize(dev, (mp_event_t)e));
}

FK_IN_CTX(cuEventQuery, (CUevent e), fk_event_wait(dev, e, true))
FK_IN_CTX(cuEventSynchronize, (CUevent e), fk_event_wait(dev, e, false))
/* A destroyed event is no captured event: a new one at its address must
 * not be taken for it. */
static CUresult fk_event_destroy(mp_device_t *dev, CUevent e) {
  if (e == NULL)
    return fk_bad_handle();
  pthread_mutex_lock(&fk.lock);
  fk_captured_event_forget(e);
  (void)fk_stale_cap_take(e, true);
  pthread_mutex_unlock(&fk.lock);
  return fk_result_of(mp_event_destroy(dev, (mp_event_t)e));
}

FK_IN_CTX(cuEventDestroy_v2, (CUevent e), fk_event_destroy(dev, e))
FK_IN_CTX_TWINS(cuStreamWaitEvent, cuStreamWaitEvent_ptsz,
                (CUstream s, CUevent e, unsigned int flags),
                fk_event_op(dev, e, s, ptsz, true, flags))

/* ---- stream capture and graphs ------------------------------------------- */

/* Whether the n nodes deps are all nodes of g. Under fk.lock. */
static bool fk_graph_has(const struct CUgraph_st *g, const CUgraphNode *deps,
                         size_t n) {
  for (size_t i = 0; i < n; i++) {
    size_t k = 0;
    while (k < g->n && (CUgraphNode)g->nodes[k] != deps[i])
      k++;
    if (k == g->n)
      return false;
  }
  return true;
}

/* cuda.h, cuStreamBeginCapture: "Capture may not be initiated if stream is
 * CU_STREAM_LEGACY"; a stream already capturing is refused too. into: the
 * program's graph to capture into (cuStreamBeginCaptureToGraph), after its
 * n nodes deps, or NULL for a new one. */
static CUresult fk_begin_capture(mp_device_t *dev, CUstream h, bool ptsz,
                                 CUstreamCaptureMode mode,
                                 struct CUgraph_st *into,
                                 const CUgraphNode *deps, size_t n) {
  if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL &&
      mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      mode != CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  struct CUgraph_st *g = into != NULL ? into : calloc(1, sizeof *g);
  if (g == NULL)
    return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&fk.lock);
  fk_stream_t *st = NULL;
  CUresult r = fk_resolve(dev, h, ptsz, &st);
  if (r == CUDA_SUCCESS && st == NULL)
    r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  else if (r == CUDA_SUCCESS && st->cap != CU_STREAM_CAPTURE_STATUS_NONE)
    r = CUDA_ERROR_ILLEGAL_STATE;
  if (r == CUDA_SUCCESS && into != NULL && !fk_graph_has(into, deps, n))
    r = CUDA_ERROR_INVALID_VALUE;
  for (const fk_stream_t *o = fk_capturing; into != NULL && o != NULL;
       o = o->cap_next)
    if (r == CUDA_SUCCESS && o->graph == into)
      r = CUDA_ERROR_INVALID_VALUE; /* another capture is building it */
  if (r == CUDA_SUCCESS) {
    st->cap = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    st->cap_mode = mode;
    st->cap_thread = pthread_self();
    st->cap_id = atomic_fetch_add(&fk_next_capture_id, 1);
    st->cap_width = 1;
    st->graph = g;
    st->cap_into = into != NULL;
    st->cap_next = fk_capturing;
    fk_capturing = st;
    atomic_fetch_add(&fk_n_captures, 1);
    g = NULL;
  }
  pthread_mutex_unlock(&fk.lock);
  if (g != into)
    free(g);
  return r;
}

FK_IN_CTX(cuStreamBeginCapture, (CUstream s),
          fk_begin_capture(dev, s, false, CU_STREAM_CAPTURE_MODE_GLOBAL, NULL,
                           NULL, 0))
FK_IN_CTX_TWINS(cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz,
                (CUstream s, CUstreamCaptureMode mode),
                fk_begin_capture(dev, s, ptsz, mode, NULL, NULL, 0))

/* cuda.h, cuStreamBeginCaptureToGraph (CUDA 12.3): a capture as
 * cuStreamBeginCapture's, "placing new nodes into an existing graph", the
 * first of them after `dependencies`, nodes of hGraph ("Can be NULL if
 * numDependencies is 0"); cuStreamEndCapture returns hGraph, which stays
 * the program's when the capture fails. The fake's graph is a chain: the
 * new nodes come after every node already there, which any dependencies
 * allow. A graph another capture is building is refused
 * (CUDA_ERROR_INVALID_VALUE, the one error cuda.h lists besides
 * initialization). */
static CUresult fk_begin_capture_into(mp_device_t *dev, CUstream h, bool ptsz,
                                      CUgraph g, const CUgraphNode *deps,
                                      size_t n, CUstreamCaptureMode mode) {
  if (g == NULL || (n > 0 && deps == NULL))
    return CUDA_ERROR_INVALID_VALUE;
  return fk_begin_capture(dev, h, ptsz, mode, g, deps, n);
}

FK_IN_CTX_TWINS(cuStreamBeginCaptureToGraph, cuStreamBeginCaptureToGraph_ptsz,
                (CUstream s, CUgraph g, const CUgraphNode *deps,
                 const CUgraphEdgeData *edges, size_t n,
                 CUstreamCaptureMode mode),
                ((void)edges,
                 fk_begin_capture_into(dev, s, ptsz, g, deps, n, mode)))

/* Whether every stream joined to origin's capture was joined back to it:
 * origin's next node comes after each one's last node (the Programming
 * Guide, "Cross-stream Dependencies and Events": "Any other streams which
 * are being captured to the same capture graph, due to event-based
 * dependencies, must also be joined back to the origin stream"). A stream
 * that joined and captured nothing since has nothing to join back. Under
 * fk.lock. */
static bool fk_capture_rejoined(const fk_stream_t *origin) {
  for (const fk_stream_t *o = fk_capturing; o != NULL; o = o->cap_next)
    if (o->cap_origin == origin &&
        origin->cap_clock[o->cap_slot] < o->cap_clock[o->cap_slot])
      return false;
  return true;
}

/* cuda.h, cuStreamEndCapture: a capture ends on the stream it began on
 * ("Capture must be ended on the same stream in which it was initiated",
 * cuStreamBeginCapture; a joined stream answers
 * CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "the capture was not initiated in
 * this stream", and the capture goes on); one not begun relaxed must end
 * in the thread that began it (CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD); an
 * invalidated one ends with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and no
 * graph, one with a stream not joined back with
 * CUDA_ERROR_STREAM_CAPTURE_UNJOINED ("the capture sequence contains a
 * fork that was not joined to the primary stream") and no graph: "Failure
 * to rejoin to the origin stream will result in failure of the overall
 * capture operation" (the Programming Guide). Either way every stream of
 * the capture is out of capture. */
static CUresult fk_end_capture(mp_device_t *dev, CUstream h, bool ptsz,
                               CUgraph *out) {
  if (out == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fk.lock);
  fk_stream_t *st = NULL;
  CUresult r = fk_resolve(dev, h, ptsz, &st);
  if (r == CUDA_SUCCESS &&
      (st == NULL || st->cap == CU_STREAM_CAPTURE_STATUS_NONE))
    r = CUDA_ERROR_ILLEGAL_STATE;
  else if (r == CUDA_SUCCESS && st->cap_origin != NULL)
    r = CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
  else if (r == CUDA_SUCCESS &&
           st->cap_mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
           !pthread_equal(st->cap_thread, pthread_self())) {
    /* Refused, and the capture is over: a later cuStreamEndCapture on its
     * own thread answers CUDA_ERROR_ILLEGAL_STATE (an H200, driver
     * 580.159.04, 2026-11-28). */
    (void)fk_capture_end(st, false);
    r = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  }
  if (r == CUDA_SUCCESS) {
    bool valid = st->cap == CU_STREAM_CAPTURE_STATUS_ACTIVE;
    bool joined = fk_capture_rejoined(st);
    *out = fk_capture_end(st, valid && joined);
    if (!valid)
      r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    else if (!joined)
      r = CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
  }
  pthread_mutex_unlock(&fk.lock);
  return r;
}

FK_IN_CTX_TWINS(cuStreamEndCapture, cuStreamEndCapture_ptsz,
                (CUstream s, CUgraph *g), fk_end_capture(dev, s, ptsz, g))

/* Capture status and id of a stream (legacy: never capturing, but
 * CUDA_ERROR_STREAM_CAPTURE_IMPLICIT while a blocking stream captures:
 * fk_blocking_capture). The id and graph are written only for an active
 * capture (cuda.h, cuStreamGetCaptureInfo: "Valid data (other than capture
 * status) is returned only if ... the returned capture status is
 * CU_STREAM_CAPTURE_STATUS_ACTIVE"): an invalidated capture's id is not
 * given, so a caller that reads one there reads whatever it had. */
static CUresult fk_capture_info(mp_device_t *dev, CUstream h, bool ptsz,
                                CUstreamCaptureStatus *status, cuuint64_t *id,
                                CUgraph *graph) {
  if (status == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fk.lock);
  fk_stream_t *st = NULL;
  struct CUctx_st *home = NULL; /* another context's stream is answered,
                                   as by cuStreamGetFlags and cuStreamGetCtx */
  CUresult r = fk_resolve_any(dev, h, ptsz, &st, &home);
  if (r == CUDA_SUCCESS && st == NULL && fk_blocking_capture(fk_ctx()) != NULL)
    r = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  if (r == CUDA_SUCCESS) {
    *status = st != NULL ? st->cap : CU_STREAM_CAPTURE_STATUS_NONE;
    if (id != NULL && *status == CU_STREAM_CAPTURE_STATUS_ACTIVE)
      *id = st->cap_id;
    if (graph != NULL && *status == CU_STREAM_CAPTURE_STATUS_ACTIVE)
      *graph = st->graph;
  }
  pthread_mutex_unlock(&fk.lock);
  return r;
}

FK_IN_CTX_TWINS(cuStreamIsCapturing, cuStreamIsCapturing_ptsz,
                (CUstream s, CUstreamCaptureStatus *status),
                fk_capture_info(dev, s, ptsz, status, NULL, NULL))

/* The graph of an active capture is given (for cuGraphRetainUserObject);
 * no dependency list (NULL, 0). */
static CUresult fk_capture_info_v3(mp_device_t *dev, CUstream h, bool ptsz,
                                   CUstreamCaptureStatus *status,
                                   cuuint64_t *id, CUgraph *graph,
                                   const CUgraphNode **deps,
                                   const CUgraphEdgeData **edges,
                                   size_t *ndeps) {
  if (graph != NULL)
    *graph = NULL;
  if (deps != NULL)
    *deps = NULL;
  if (edges != NULL)
    *edges = NULL;
  if (ndeps != NULL)
    *ndeps = 0;
  return fk_capture_info(dev, h, ptsz, status, id, graph);
}

FK_IN_CTX_TWINS(cuStreamGetCaptureInfo_v3, cuStreamGetCaptureInfo_v3_ptsz,
                (CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id,
                 CUgraph *graph, const CUgraphNode **deps,
                 const CUgraphEdgeData **edges, size_t *ndeps),
                fk_capture_info_v3(dev, s, ptsz, status, id, graph, deps, edges,
                                   ndeps))
FK_IN_CTX_TWINS(cuStreamGetCaptureInfo_v2, cuStreamGetCaptureInfo_v2_ptsz,
                (CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id,
                 CUgraph *graph, const CUgraphNode **deps, size_t *ndeps),
                fk_capture_info_v3(dev, s, ptsz, status, id, graph, deps, NULL,
                                   ndeps))

CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
  FK_COUNT(cuThreadExchangeStreamCaptureMode);
  FK_NEED_INIT();
  if (mode == NULL || (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL &&
                       *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
                       *mode != CU_STREAM_CAPTURE_MODE_RELAXED))
    return CUDA_ERROR_INVALID_VALUE;
  CUstreamCaptureMode old = fk_thread_mode;
  fk_thread_mode = *mode;
  *mode = old;
  return CUDA_SUCCESS;
}

/* cuda.h, cuGraphCreate: an empty graph; "flags - Graph creation flags,
 * must be 0". */
CUresult cuGraphCreate(CUgraph *out, unsigned int flags) {
  FK_COUNT(cuGraphCreate);
  FK_NEED_INIT();
  if (out == NULL || flags != 0)
    return CUDA_ERROR_INVALID_VALUE;
  struct CUgraph_st *g = calloc(1, sizeof *g);
  if (g == NULL)
    return CUDA_ERROR_OUT_OF_MEMORY;
  *out = g;
  return CUDA_SUCCESS;
}

/* Whether a capture, active or invalidated but not yet ended, is building
 * g. Under fk.lock. */
static bool fk_graph_capturing(const struct CUgraph_st *g) {
  for (const fk_stream_t *o = fk_capturing; o != NULL; o = o->cap_next)
    if (o->graph == g)
      return true;
  return false;
}

/* Destroying a graph frees the memory its free nodes released (the fake
 * keeps it until then, so replays can use it). A graph a capture is
 * building cannot go: cuda.h, cuStreamGetCaptureInfo, graph_out, "All
 * operations other than destroy and node removal are permitted on the
 * graph while the capture sequence is in progress" (the sequence lasts
 * until cuStreamEndCapture, invalidated or not); refused with
 * CUDA_ERROR_INVALID_VALUE, the one error cuda.h lists for cuGraphDestroy
 * besides initialization, and nothing changes. */
CUresult cuGraphDestroy(CUgraph g) {
  FK_COUNT(cuGraphDestroy);
  FK_CURRENT(dev);
  if (g == NULL)
    return fk_bad_handle();
  pthread_mutex_lock(&fk.lock);
  /* A graph moved into a child graph node is the parent's: it "Cannot be
   * independently instantiated or destroyed" (cuda.h,
   * CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE). */
  bool building = fk_graph_capturing(g) || g->moved;
  pthread_mutex_unlock(&fk.lock);
  if (building)
    return CUDA_ERROR_INVALID_VALUE;
  fk_gmem_drop(&g->gmem); /* freed here unless an executable holds it */
  fk_graph_free(g);
  return CUDA_SUCCESS;
}

/* cuda.h, cuGraphDestroyNode: "Removes hNode from its graph. This
 * operation also severs any dependencies of other nodes on hNode and vice
 * versa. Nodes which belong to a graph which contains allocation or free
 * nodes cannot be destroyed": CUDA_ERROR_INVALID_VALUE, the error the call
 * lists, as for a node of a graph a capture is building (cuda.h,
 * cuStreamGetCaptureInfo, graph_out: "All operations other than destroy
 * and node removal are permitted on the graph while the capture sequence
 * is in progress") or that holds a graph one is (the node's own, below);
 * nothing changes then. What the node owns goes with it: a child graph
 * node's embedded graph (cuGraphChildGraphNodeGetGraph: "the node retains
 * ownership of the graph"; a graph moved in,
 * CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE, is the node's too) and a conditional
 * node's body graphs (CUDA_CONDITIONAL_NODE_PARAMS.phGraph_out: "Valid for the
 * lifetime of the conditional node"). In the fake's chain a child graph node
 * stands after the copies of its graph's nodes (fk_child_node): they go with
 * it. Executables made from the graph before stand alone and keep the node. A
 * node handle already destroyed is the program's error (undefined in CUDA), not
 * checked. */
static bool fk_graph_busy(const struct CUgraph_st *g) {
  if (g == NULL)
    return false;
  if (fk_graph_capturing(g))
    return true;
  for (size_t i = 0; i < g->n; i++) {
    if (fk_graph_busy(g->nodes[i]->child))
      return true;
    for (unsigned k = 0; k < g->nodes[i]->nbodies; k++)
      if (fk_graph_busy(g->nodes[i]->bodies[k]))
        return true;
  }
  return false;
}

CUresult cuGraphDestroyNode(CUgraphNode node) {
  FK_COUNT(cuGraphDestroyNode);
  FK_NEED_INIT();
  fk_node_t *nd = (fk_node_t *)node;
  if (nd == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fk.lock);
  struct CUgraph_st *g = nd->in;
  size_t k = 0;
  while (k < g->n && g->nodes[k] != nd)
    k++;
  bool busy = fk_graph_capturing(g) || fk_graph_busy(nd->child);
  for (unsigned b = 0; b < nd->nbodies; b++)
    busy = busy || fk_graph_busy(nd->bodies[b]);
  bool ok = k < g->n && g->gmem == NULL && !busy &&
            (nd->type != CU_GRAPH_NODE_TYPE_GRAPH || k >= nd->n);
  if (ok) {
    size_t from = nd->type == CU_GRAPH_NODE_TYPE_GRAPH ? k - nd->n : k;
    for (size_t i = from; i < k; i++)
      free(g->nodes[i]); /* copies: they own no graph */
    memmove(&g->nodes[from], &g->nodes[k + 1],
            (g->n - k - 1) * sizeof *g->nodes);
    g->n -= k + 1 - from;
    fk_graph_free(nd->child);
    for (unsigned b = 0; b < nd->nbodies; b++)
      fk_graph_free(nd->bodies[b]);
    free(nd->bodies);
    free(nd);
  }
  pthread_mutex_unlock(&fk.lock);
  return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* The index of the node before nd, the node at k - 1 of a chain (a
 * graph's or an executable's), and before the copies of a child graph's
 * nodes that stand before a child graph node (fk_child_node), nested ones
 * among them: k, walked back from the chain's length, visits the graph's
 * own nodes only. */
static size_t fk_prev_own(const fk_node_t *nd, size_t k) {
  size_t span = nd->type == CU_GRAPH_NODE_TYPE_GRAPH ? nd->n : 0;
  return span < k ? k - 1 - span : 0;
}

/* cuda.h, cuGraphGetNodes: "Returns a list of hGraph's nodes. nodes may be
 * NULL, in which case this function will return the number of nodes in
 * numNodes. Otherwise, numNodes entries will be filled in. If numNodes is
 * higher than the actual number of nodes, the remaining entries in nodes
 * will be set to NULL, and the number of nodes actually obtained will be
 * returned in numNodes." The graph's own nodes, a child graph node one of
 * them: the copies of its graph's nodes it runs are not listed (its graph's
 * own are that graph's, cuGraphChildGraphNodeGetGraph). Before 2026-12-04
 * they were, so a program could destroy one of them (cuGraphDestroyNode),
 * and the entries past the nodes were left as they were. With numNodes
 * lower, the first numNodes nodes, numNodes left as it is (before
 * 2026-12-04 it was set to the graph's count). */
CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *n) {
  FK_COUNT(cuGraphGetNodes);
  FK_NEED_INIT();
  if (g == NULL)
    return fk_bad_handle();
  if (n == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fk.lock);
  size_t own = 0;
  for (size_t k = g->n; k > 0; k = fk_prev_own(g->nodes[k - 1], k))
    own++;
  if (nodes != NULL) {
    for (size_t i = own; i < *n; i++)
      nodes[i] = NULL;
    size_t i = own;
    for (size_t k = g->n; k > 0; k = fk_prev_own(g->nodes[k - 1], k))
      if (--i < *n)
        nodes[i] = (CUgraphNode)g->nodes[k - 1];
  }
  pthread_mutex_unlock(&fk.lock);
  /* With nodes, numNodes is the number written: the first numNodes where it
   * is lower (the driver "clamp[s] the out-count to the buffer capacity
   * when the real size is larger", NVIDIA/cuda-python#2529). */
  if (nodes == NULL || own < *n)
    *n = own;
  return CUDA_SUCCESS;
}

CUresult cuGraphNodeGetType(CUgraphNode node, CUgraphNodeType *type) {
  FK_COUNT(cuGraphNodeGetType);
  FK_NEED_INIT();
  if (node == NULL || type == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  *type = ((const fk_node_t *)node)->type;
  return CUDA_SUCCESS;
}

/* The flags cuda.h allows (cuGraphInstantiate: "Valid flags are"
 * AUTO_FREE_ON_LAUNCH, DEVICE_LAUNCH, USE_NODE_PRIORITY; UPLOAD is "Only
 * supported by cuGraphInstantiateWithParams", CUgraphInstantiate_flags),
 * DEVICE_LAUNCH not "in conjunction with" AUTO_FREE_ON_LAUNCH and only for
 * a graph that is not empty and "can only contain kernel nodes, memcpy
 * nodes, memset nodes, and child graph nodes". Else
 * CUDA_ERROR_INVALID_VALUE, the one error the calls list. (Nor may a
 * device-launch graph's copies touch pageable host memory: not checked.) */
static CUresult fk_instantiate_flags_ok(CUgraph g, unsigned long long flags,
                                        bool with_params) {
  unsigned long long known = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
                             CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH |
                             CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
  if (with_params)
    known |= CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD;
  if ((flags & ~known) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (!(flags & CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH))
    return CUDA_SUCCESS;
  if ((flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH) || g->n == 0)
    return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < g->n; i++)
    if (g->nodes[i]->type != CU_GRAPH_NODE_TYPE_MEMSET &&
        g->nodes[i]->type != CU_GRAPH_NODE_TYPE_MEMCPY &&
        g->nodes[i]->type != CU_GRAPH_NODE_TYPE_KERNEL &&
        g->nodes[i]->type != CU_GRAPH_NODE_TYPE_GRAPH)
      return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

static CUresult fk_instantiate(CUgraphExec *out, CUgraph g,
                               unsigned long long flags, bool with_params) {
  if (out == NULL || g == NULL || g->moved || /* as in cuGraphDestroy */
      fk_instantiate_flags_ok(g, flags, with_params) != CUDA_SUCCESS)
    return CUDA_ERROR_INVALID_VALUE;
  struct CUgraphExec_st *x = calloc(1, sizeof *x);
  if (x == NULL ||
      (g->n > 0 && (x->nodes = calloc(g->n, sizeof *x->nodes)) == NULL)) {
    free(x);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  for (size_t i = 0; i < g->n; i++)
    x->nodes[i] = *g->nodes[i];
  x->n = g->n;
  x->auto_free = flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
  /* cuGraphExecGetFlags: "CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD will not be
   * returned by this API as it does not affect the resulting executable
   * graph" (cuda.h). */
  x->flags = flags & ~(unsigned long long)CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD;
  /* cuda.h, cuGraphInstantiate: "If hGraph contains any allocation or free
   * nodes, there can be at most one executable graph in existence for that
   * graph at a time. An attempt to instantiate a second executable graph
   * before destroying the first with cuGraphExecDestroy will result in an
   * error" (which one is not said: CUDA_ERROR_INVALID_VALUE, the one the
   * call lists). */
  pthread_mutex_lock(&fk.lock);
  bool second = g->gmem != NULL && g->gmem->refs > 1;
  if (!second && (x->gmem = g->gmem) != NULL)
    x->gmem->refs++;
  pthread_mutex_unlock(&fk.lock);
  if (second) {
    free(x->nodes);
    free(x);
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (size_t i = 0; i < g->urefs.n; i++)
    if (!fk_urefs_add(&x->urefs, g->urefs.objs[i], g->urefs.counts[i], false)) {
      fk_urefs_drop(&x->urefs);
      fk_gmem_drop(&x->gmem);
      free(x->nodes);
      free(x);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  *out = x;
  return CUDA_SUCCESS;
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *out, CUgraph g,
                                     unsigned long long flags) {
  FK_COUNT(cuGraphInstantiateWithFlags);
  FK_NEED_INIT();
  return fk_instantiate(out, g, flags, false);
}

/* The legacy forms: no flags; on success no error node and an empty log
 * (cuda.h: the log is written, truncated to bufferSize, with a message
 * only for an error). */
static CUresult fk_instantiate_legacy(CUgraphExec *out, CUgraph g,
                                      CUgraphNode *err, char *log,
                                      size_t logsize) {
  CUresult r = fk_instantiate(out, g, 0, false);
  if (err != NULL)
    *err = NULL;
  if (log != NULL && logsize > 0)
    log[0] = '\0';
  return r;
}

CUresult cuGraphInstantiate(CUgraphExec *out, CUgraph g, CUgraphNode *err,
                            char *log, size_t logsize) {
  FK_COUNT(cuGraphInstantiate);
  FK_NEED_INIT();
  return fk_instantiate_legacy(out, g, err, log, logsize);
}

CUresult cuGraphInstantiate_v2(CUgraphExec *out, CUgraph g, CUgraphNode *err,
                               char *log, size_t logsize) {
  FK_COUNT(cuGraphInstantiate_v2);
  FK_NEED_INIT();
  return fk_instantiate_legacy(out, g, err, log, logsize);
}

/* cuda.h, cuGraphInstantiateWithParams: the flags as for WithFlags (an
 * upload stream is not modelled: nothing is uploaded ahead); the result is
 * also said in result_out. */
static CUresult fk_instantiate_params(CUgraphExec *out, CUgraph g,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
  if (p == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  CUresult r = fk_instantiate(out, g, p->flags, true);
  p->hErrNode_out = NULL;
  p->result_out = r == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS
                                    : CUDA_GRAPH_INSTANTIATE_ERROR;
  return r;
}

CUresult cuGraphInstantiateWithParams(CUgraphExec *out, CUgraph g,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
  FK_COUNT(cuGraphInstantiateWithParams);
  FK_NEED_INIT();
  return fk_instantiate_params(out, g, p);
}

CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *out, CUgraph g,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
  FK_COUNT(cuGraphInstantiateWithParams_ptsz);
  FK_NEED_INIT();
  return fk_instantiate_params(out, g, p);
}

CUresult cuGraphExecDestroy(CUgraphExec x) {
  FK_COUNT(cuGraphExecDestroy);
  FK_NEED_INIT();
  if (x == NULL)
    return fk_bad_handle();
  fk_urefs_drop(&x->urefs);
  fk_gmem_drop(&x->gmem);
  free(x->nodes);
  free(x);
  return CUDA_SUCCESS;
}

/* cuda.h, cuGraphExecGetFlags: "the flags that were passed to
 * instantiation" (CUDA 12.0). */
CUresult cuGraphExecGetFlags(CUgraphExec x, cuuint64_t *flags) {
  FK_COUNT(cuGraphExecGetFlags);
  FK_NEED_INIT();
  if (x == NULL || flags == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  *flags = x->flags;
  return CUDA_SUCCESS;
}

/* Copies src's nodes, in order, onto the end of dst, and src's user
 * object references to dst (the copy holding references of its own: an
 * assumption, cuda.h does not say). The copies of child graph nodes embed
 * no graph (fk_node_t.child): fk_graph_copy gives a clone's its own.
 * Nothing changes where host memory runs out (false). Under fk.lock. */
static bool fk_graph_append(struct CUgraph_st *dst,
                            const struct CUgraph_st *src) {
  size_t n = dst->n, refs = dst->urefs.n;
  bool ok = true;
  for (size_t i = 0; ok && i < src->n; i++)
    if ((ok = fk_graph_add(dst, src->nodes[i]))) {
      dst->nodes[dst->n - 1]->child = NULL;
      dst->nodes[dst->n - 1]->bodies = NULL; /* the node's own, not a copy's */
      dst->nodes[dst->n - 1]->nbodies = 0;
    }
  for (size_t i = 0; ok && i < src->urefs.n; i++)
    ok = fk_urefs_add(&dst->urefs, src->urefs.objs[i], src->urefs.counts[i],
                      false);
  if (ok)
    return true;
  while (dst->n > n)
    free(dst->nodes[--dst->n]);
  while (dst->urefs.n > refs) { /* src holds them too: never the last */
    dst->urefs.n--;
    atomic_fetch_sub(&dst->urefs.objs[dst->urefs.n]->refs,
                     dst->urefs.counts[dst->urefs.n]);
  }
  return false;
}

/* A new graph with g's nodes, each child graph node embedding a copy of
 * its graph, recursively (cuda.h, cuGraphClone: child graph nodes
 * "recursively copied into the clone"); NULL without host memory. Under
 * fk.lock. */
static struct CUgraph_st *fk_graph_copy(const struct CUgraph_st *g) {
  struct CUgraph_st *c = calloc(1, sizeof *c);
  if (c == NULL || !fk_graph_append(c, g)) {
    free(c);
    return NULL;
  }
  for (size_t i = 0; i < g->n; i++)
    c->nodes[i]->from = g->nodes[i]->id;
  for (size_t i = 0; i < g->n; i++)
    if (g->nodes[i]->child != NULL &&
        (c->nodes[i]->child = fk_graph_copy(g->nodes[i]->child)) == NULL) {
      fk_graph_free(c);
      return NULL;
    }
  return c;
}

/* Whether g holds a conditional node, itself or in a graph a child graph
 * node of it embeds. Under fk.lock. */
static bool fk_graph_has_cond(const struct CUgraph_st *g) {
  for (size_t i = 0; i < g->n; i++)
    if (g->nodes[i]->type == CU_GRAPH_NODE_TYPE_CONDITIONAL ||
        (g->nodes[i]->child != NULL && fk_graph_has_cond(g->nodes[i]->child)))
      return true;
  return false;
}

/* cuda.h, cuGraphClone: "creates a copy of originalGraph", child graph
 * nodes "recursively copied into the clone"; "Cloning is not supported
 * for graphs which contain memory allocation nodes, memory free nodes, or
 * conditional nodes" (the same in cuGraphAddMemAllocNode's restrictions:
 * "The graph cannot be cloned"): CUDA_ERROR_INVALID_VALUE, the error the
 * call lists, and nothing made. Before 2026-12-04 a graph with conditional
 * nodes was cloned, the copies without body graphs. */
CUresult cuGraphClone(CUgraph *out, CUgraph g) {
  FK_COUNT(cuGraphClone);
  FK_NEED_INIT();
  if (out == NULL || g == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fk.lock);
  bool refused = g->gmem != NULL || fk_graph_has_cond(g);
  struct CUgraph_st *c = refused ? NULL : fk_graph_copy(g);
  CUresult r = refused     ? CUDA_ERROR_INVALID_VALUE
               : c == NULL ? CUDA_ERROR_OUT_OF_MEMORY
                           : CUDA_SUCCESS;
  pthread_mutex_unlock(&fk.lock);
  if (r == CUDA_SUCCESS)
    *out = c;
  return r;
}

/* cuda.h, cuGraphNodeFindInClone: "returns the node in hClonedGraph
 * corresponding to hOriginalNode in the original graph. hClonedGraph must
 * have been cloned from hOriginalGraph via cuGraphClone"; else
 * CUDA_ERROR_INVALID_VALUE, the error the call lists. */
CUresult cuGraphNodeFindInClone(CUgraphNode *out, CUgraphNode orig,
                                CUgraph clone) {
  FK_COUNT(cuGraphNodeFindInClone);
  FK_NEED_INIT();
  const fk_node_t *nd = (const fk_node_t *)orig;
  if (out == NULL || nd == NULL || clone == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fk.lock);
  size_t k = 0;
  while (k < clone->n && clone->nodes[k]->from != nd->id)
    k++;
  CUresult r = k < clone->n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  if (r == CUDA_SUCCESS)
    *out = (CUgraphNode)clone->nodes[k];
  pthread_mutex_unlock(&fk.lock);
  return r;
}

/* A child graph node of g embedding child (cuda.h, cuGraphAddChildGraphNode
 * and CUgraphChildGraphNodeOwnership): cloned ("CLONE: Default behavior
 * for a child graph node. Child graph is cloned into the parent and memory
 * allocation/free nodes can't be present in the child graph"), or moved
 * ("MOVE: The child graph is moved to the parent. The handle to the child
 * graph is owned by the parent and will be destroyed when the parent is
 * destroyed"; it "Cannot be added as a child graph of a separate parent
 * graph"). Refused with CUDA_ERROR_INVALID_VALUE, the error the calls
 * list, for memory nodes in a clone, conditional nodes in a clone
 * (cuGraphAddChildGraphNode: "If childGraph contains allocation nodes,
 * free nodes, or conditional nodes, this call will return an error"), a
 * child moved before, and dependencies not in g. Not modelled: moving a graph
 * with memory nodes (CUDA_ERROR_NOT_SUPPORTED: the fake's memory is one
 * graph's, fk_gmem_t). The fake's graph is a chain: the child's nodes are
 * copied onto its end, followed by a node of type CU_GRAPH_NODE_TYPE_GRAPH that
 * stands for them (the handle returned; a launch runs the copies and passes it
 * by), which embeds the copy, or the moved graph, for
 * cuGraphChildGraphNodeGetGraph. Changes made to that graph afterwards are not
 * seen by the parent's copies (not modelled). */
static CUresult fk_child_node(CUgraphNode *node, CUgraph g,
                              const CUgraphNode *deps, size_t ndeps,
                              CUgraph child, bool move) {
  if (node == NULL || g == NULL || child == NULL || g == child ||
      (ndeps > 0 && deps == NULL))
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fk.lock);
  size_t n = g->n;
  fk_node_t stand = {.type = CU_GRAPH_NODE_TYPE_GRAPH, .n = child->n};
  CUresult r =
      child->moved ||
              (!move && (child->gmem != NULL || fk_graph_has_cond(child))) ||
              !fk_graph_has(g, deps, ndeps)
          ? CUDA_ERROR_INVALID_VALUE
      : child->gmem != NULL       ? CUDA_ERROR_NOT_SUPPORTED
      : fk_graph_append(g, child) ? CUDA_SUCCESS
                                  : CUDA_ERROR_OUT_OF_MEMORY;
  if (r == CUDA_SUCCESS &&
      ((stand.child = move ? child : fk_graph_copy(child)) == NULL ||
       !fk_graph_add(g, &stand))) {
    if (!move)
      fk_graph_free(stand.child);
    while (g->n > n) /* the references stay: released with g */
      free(g->nodes[--g->n]);
    r = CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (r == CUDA_SUCCESS) {
    child->moved = move;
    *node = (CUgraphNode)g->nodes[g->n - 1];
  }
  pthread_mutex_unlock(&fk.lock);
  return r;
}

/* cuda.h, cuGraphAddChildGraphNode: a node that "executes an embedded
 * graph"; "The child graph is cloned in this call"; "If childGraph
 * contains allocation nodes, free nodes, or conditional nodes, this call
 * will return an error". */
CUresult cuGraphAddChildGraphNode(CUgraphNode *node, CUgraph g,
                                  const CUgraphNode *deps, size_t ndeps,
                                  CUgraph child) {
  FK_COUNT(cuGraphAddChildGraphNode);
  FK_NEED_INIT();
  return fk_child_node(node, g, deps, ndeps, child, false);
}

/* cuda.h, cuGraphConditionalHandleCreate: "Creates a conditional handle
 * associated with hGraph"; flags "Currently must be
 * CU_GRAPH_COND_ASSIGN_DEFAULT or 0" (else CUDA_ERROR_INVALID_VALUE, which
 * the call lists). The handle is a number the fake gave, which a
 * conditional node must name ("Handles must be created in advance of
 * creating the node", CUDA_CONDITIONAL_NODE_PARAMS); its graph, context
 * and default value are not kept (no launch runs a body). */
static atomic_ullong fk_cond_handles;

CUresult cuGraphConditionalHandleCreate(CUgraphConditionalHandle *out,
                                        CUgraph g, CUcontext ctx,
                                        unsigned int value,
                                        unsigned int flags) {
  FK_COUNT(cuGraphConditionalHandleCreate);
  FK_NEED_INIT();
  (void)ctx;
  (void)value;
  if (out == NULL || g == NULL ||
      (flags != 0 && flags != CU_GRAPH_COND_ASSIGN_DEFAULT))
    return CUDA_ERROR_INVALID_VALUE;
  *out = (CUgraphConditionalHandle)(atomic_fetch_add(&fk_cond_handles, 1) + 1);
  return CUDA_SUCCESS;
}

/* A conditional node of g (cuda.h, CUDA_CONDITIONAL_NODE_PARAMS): a
 * handle made by cuGraphConditionalHandleCreate; `size` "1 for
 * CU_GRAPH_COND_TYPE_WHILE, 1 or 2 for CU_GRAPH_COND_TYPE_IF, or any value
 * greater than zero for CU_GRAPH_COND_TYPE_SWITCH"; phGraph_out is set to
 * a "CUDA-owned array populated with conditional node child graphs during
 * creation of the node", empty graphs the program fills ("using graph
 * node creation APIs or cuStreamBeginCaptureToGraph"), "Valid for the
 * lifetime of the conditional node": the node's, freed with g, and, as
 * the driver's, neither destroyed nor instantiated on their own (as a
 * moved child graph). Anything else: CUDA_ERROR_INVALID_VALUE, and
 * nothing made. Not modelled: a launch running a body, the node types a
 * body may hold. A graph holding one is not cloned (cuGraphClone). */
static CUresult fk_conditional_node(CUgraphNode *node, CUgraph g,
                                    const CUgraphNode *deps, size_t ndeps,
                                    CUDA_CONDITIONAL_NODE_PARAMS *c) {
  unsigned n = c->size;
  bool sized = c->type == CU_GRAPH_COND_TYPE_WHILE ? n == 1
               : c->type == CU_GRAPH_COND_TYPE_IF
                   ? n == 1 || n == 2
                   : c->type == CU_GRAPH_COND_TYPE_SWITCH && n > 0;
  if (node == NULL || g == NULL || !sized || c->handle == 0 ||
      c->handle > atomic_load(&fk_cond_handles) || (ndeps > 0 && deps == NULL))
    return CUDA_ERROR_INVALID_VALUE;
  fk_node_t cond = {.type = CU_GRAPH_NODE_TYPE_CONDITIONAL, .nbodies = n};
  if ((cond.bodies = calloc(n, sizeof *cond.bodies)) == NULL)
    return CUDA_ERROR_OUT_OF_MEMORY;
  bool ok = true;
  for (unsigned k = 0; ok && k < n; k++)
    if ((ok = (cond.bodies[k] = calloc(1, sizeof **cond.bodies)) != NULL))
      cond.bodies[k]->moved = true;
  pthread_mutex_lock(&fk.lock);
  CUresult r = !fk_graph_has(g, deps, ndeps)  ? CUDA_ERROR_INVALID_VALUE
               : ok && fk_graph_add(g, &cond) ? CUDA_SUCCESS
                                              : CUDA_ERROR_OUT_OF_MEMORY;
  if (r == CUDA_SUCCESS)
    *node = (CUgraphNode)g->nodes[g->n - 1];
  pthread_mutex_unlock(&fk.lock);
  if (r != CUDA_SUCCESS) {
    for (unsigned k = 0; k < n; k++)
      free(cond.bodies[k]);
    free(cond.bodies);
    return r;
  }
  c->phGraph_out = cond.bodies;
  return CUDA_SUCCESS;
}

/* cuda.h, cuGraphAddNode: "Creates a new node in hGraph described by
 * nodeParams"; CU_GRAPH_NODE_TYPE_GRAPH with CUDA_CHILD_GRAPH_NODE_PARAMS
 * ("The child graph to clone into the node for node creation"; "Graphs
 * containing memory allocation or memory free nodes must set the
 * ownership to be moved to the parent"), as fk_child_node. Another
 * ownership: CUDA_ERROR_INVALID_VALUE. CU_GRAPH_NODE_TYPE_CONDITIONAL with
 * CUDA_CONDITIONAL_NODE_PARAMS, as fk_conditional_node. Other node types
 * are not modelled
 * (CUDA_ERROR_NOT_SUPPORTED, which the call lists), nor edge data. */
static CUresult fk_add_node(CUgraphNode *node, CUgraph g,
                            const CUgraphNode *deps, size_t ndeps,
                            CUgraphNodeParams *p) {
  if (p == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  if (p->type == CU_GRAPH_NODE_TYPE_CONDITIONAL)
    return fk_conditional_node(node, g, deps, ndeps, &p->conditional);
  if (p->type != CU_GRAPH_NODE_TYPE_GRAPH)
    return CUDA_ERROR_NOT_SUPPORTED;
  if (p->graph.ownership != CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE &&
      p->graph.ownership != CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE)
    return CUDA_ERROR_INVALID_VALUE;
  return fk_child_node(node, g, deps, ndeps, p->graph.graph,
                       p->graph.ownership ==
                           CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE);
}

/* CUDA 12.2's form (cudaTypedefs.h: PFN_cuGraphAddNode_v12020) and 12.3's,
 * with edge data (_v12030). */
CUresult cuGraphAddNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                        size_t ndeps, CUgraphNodeParams *p) {
  FK_COUNT(cuGraphAddNode);
  FK_NEED_INIT();
  return fk_add_node(node, g, deps, ndeps, p);
}

CUresult cuGraphAddNode_v2(CUgraphNode *node, CUgraph g,
                           const CUgraphNode *deps,
                           const CUgraphEdgeData *edges, size_t ndeps,
                           CUgraphNodeParams *p) {
  FK_COUNT(cuGraphAddNode_v2);
  FK_NEED_INIT();
  (void)edges;
  return fk_add_node(node, g, deps, ndeps, p);
}

/* cuda.h, cuGraphChildGraphNodeGetGraph: "Gets a handle to the embedded
 * graph in a child graph node. This call does not clone the graph";
 * CUDA_ERROR_INVALID_VALUE for a node that embeds none (in the fake, also
 * the copies of a child graph node in its parent's parents). */
CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode node, CUgraph *out) {
  FK_COUNT(cuGraphChildGraphNodeGetGraph);
  FK_NEED_INIT();
  const fk_node_t *nd = (const fk_node_t *)node;
  if (nd == NULL || out == NULL || nd->type != CU_GRAPH_NODE_TYPE_GRAPH ||
      nd->child == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  *out = nd->child;
  return CUDA_SUCCESS;
}

/* cuda.h, cuGraphExecChildGraphNodeSetParams: "Updates the work
 * represented by hNode in hGraphExec as though the nodes contained in
 * hNode's graph had the parameters contained in childGraph's nodes at
 * instantiation. hNode must remain in the graph which was used to
 * instantiate hGraphExec"; "The topology of childGraph, as well as the
 * node insertion order, must match that of the graph contained in hNode";
 * "hNode is also not modified by this call". In the fake: x's copies of
 * the node's graph, before its own copy, become childGraph's, which must
 * have as many nodes of the same types and no memory nodes (cuGraphExecUpdate's
 * restrictions, fk_exec_update); else CUDA_ERROR_INVALID_VALUE, the one
 * error listed, and x unchanged. */
static CUresult fk_exec_child_set(CUgraphExec x, CUgraphNode node,
                                  CUgraph child) {
  const fk_node_t *nd = (const fk_node_t *)node;
  if (x == NULL || nd == NULL || child == NULL ||
      nd->type != CU_GRAPH_NODE_TYPE_GRAPH)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fk.lock);
  size_t k = 0, span = nd->n;
  while (k < x->n && x->nodes[k].id != nd->id)
    k++;
  bool ok = k < x->n && k >= span && child->n == span && child->gmem == NULL &&
            !child->moved;
  for (size_t i = 0; ok && i < span; i++)
    ok = x->nodes[k - span + i].type == child->nodes[i]->type;
  for (size_t i = 0; ok && i < span; i++) {
    fk_node_t *to = &x->nodes[k - span + i];
    unsigned long long id = to->id;
    *to = *child->nodes[i];
    to->id = id;
    to->child = NULL;
  }
  pthread_mutex_unlock(&fk.lock);
  return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGraphExecChildGraphNodeSetParams(CUgraphExec x, CUgraphNode node,
                                            CUgraph child) {
  FK_COUNT(cuGraphExecChildGraphNodeSetParams);
  FK_NEED_INIT();
  return fk_exec_child_set(x, node, child);
}

/* cuda.h, cuGraphExecNodeSetParams: "Sets the parameters of a node in an
 * executable graph"; for a child graph node "Topology must match and
 * restrictions apply recursively" (fk_exec_child_set); a type other than
 * the node's is CUDA_ERROR_INVALID_VALUE. Other node types are not
 * modelled (CUDA_ERROR_NOT_SUPPORTED, which the call lists). */
CUresult cuGraphExecNodeSetParams(CUgraphExec x, CUgraphNode node,
                                  CUgraphNodeParams *p) {
  FK_COUNT(cuGraphExecNodeSetParams);
  FK_NEED_INIT();
  if (p == NULL || node == NULL || p->type != ((const fk_node_t *)node)->type)
    return CUDA_ERROR_INVALID_VALUE;
  if (p->type != CU_GRAPH_NODE_TYPE_GRAPH)
    return CUDA_ERROR_NOT_SUPPORTED;
  return fk_exec_child_set(x, node, p->graph.graph);
}

/* cuda.h, cuGraphNodeSetParams: "Sets the parameters of graph node hNode
 * to nodeParams. The node type specified by nodeParams->type must match
 * the type of hNode" (else CUDA_ERROR_INVALID_VALUE); for a child graph
 * node, CUDA_CHILD_GRAPH_NODE_PARAMS.graph is a graph "to clone into the
 * node", which with memory allocation or free nodes must be moved
 * (CUDA_ERROR_INVALID_VALUE for one with them). In the fake: the node's
 * embedded graph (cuGraphChildGraphNodeGetGraph, the same handle after)
 * and its graph's copies of it (the chain before the node) become a copy
 * of the new graph's nodes, whose topology must match (as many nodes of
 * the same types: CUDA_ERROR_INVALID_VALUE otherwise, the node
 * unchanged), as fk_exec_child_set does for an executable; the
 * executables instantiated before do not change ("An executable graph
 * stands alone"). Not modelled: other node types (CUDA_ERROR_NOT_SUPPORTED,
 * which the call lists), a move (the same error), a change of topology,
 * and the copies in the node's graph's own parents. */
static CUresult fk_node_set(fk_node_t *nd, const CUgraphNodeParams *p) {
  if (nd == NULL || p == NULL || p->type != nd->type)
    return CUDA_ERROR_INVALID_VALUE;
  if (p->type != CU_GRAPH_NODE_TYPE_GRAPH ||
      p->graph.ownership != CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE)
    return CUDA_ERROR_NOT_SUPPORTED;
  const struct CUgraph_st *from = p->graph.graph;
  if (from == NULL || nd->child == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fk.lock);
  struct CUgraph_st *g = nd->in, *e = nd->child;
  size_t k = 0, span = nd->n;
  while (k < g->n && g->nodes[k] != nd)
    k++;
  bool ok = k < g->n && k >= span && from != g && from != e &&
            from->n == span && e->n == span && from->gmem == NULL &&
            !from->moved;
  for (size_t i = 0; ok && i < span; i++)
    ok = from->nodes[i]->type == e->nodes[i]->type &&
         from->nodes[i]->type == g->nodes[k - span + i]->type;
  for (size_t i = 0; ok && i < span; i++) {
    fk_node_t *to[2] = {g->nodes[k - span + i], e->nodes[i]};
    for (int t = 0; t < 2; t++) {
      fk_node_t keep = *to[t];
      *to[t] = *from->nodes[i];
      to[t]->id = keep.id;
      to[t]->in = keep.in;
      to[t]->child = keep.child;
    }
  }
  pthread_mutex_unlock(&fk.lock);
  return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGraphNodeSetParams(CUgraphNode node, CUgraphNodeParams *p) {
  FK_COUNT(cuGraphNodeSetParams);
  FK_NEED_INIT();
  return fk_node_set((fk_node_t *)node, p);
}

/* cuda.h, cuGraphExecUpdate: "Updates the node parameters in the
 * instantiated graph specified by hGraphExec with the node parameters in a
 * topologically identical graph"; CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE
 * with CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED where "The count of
 * nodes directly in hGraphExec and hGraph differ" (no error node), or a
 * child graph's (the fake's choice: no error node either),
 * _NODE_TYPE_CHANGED where a node's type does ("hErrorNode_out is set to
 * the node from hGraph": one of its own, cuGraphGetNodes', for a node
 * inside a child graph the child graph node), _ERROR for an invalid value;
 * x unchanged then. Before 2026-12-04 the fake compared the chains it runs,
 * child graphs' copies among them: another topology of as many nodes of the
 * same types was updated, and the error node could be a copy. Not modelled: the
 * limits on a node's parameters, user object references (x keeps its own), and
 * an update where either graph has memory nodes, which the fake refuses
 * (_NOT_SUPPORTED: an executable's memory is its graph's, fk_gmem_t, which it
 * cannot trade). */
static CUresult fk_exec_update(CUgraphExec x, CUgraph g, CUgraphNode *err,
                               CUgraphExecUpdateResult *result) {
  *err = NULL;
  *result = CU_GRAPH_EXEC_UPDATE_ERROR;
  if (x == NULL || g == NULL)
    return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
  pthread_mutex_lock(&fk.lock);
  size_t xown = 0, gown = 0;
  for (size_t k = x->n; k > 0; k = fk_prev_own(&x->nodes[k - 1], k))
    xown++;
  for (size_t k = g->n; k > 0; k = fk_prev_own(g->nodes[k - 1], k))
    gown++;
  if (x->n != g->n || xown != gown)
    *result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
  else if (x->gmem != NULL || g->gmem != NULL)
    *result = CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED;
  else
    *result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
  /* Equal types, and equal spans of the child graph nodes' copies, are the
   * same nodes directly in each and in each child graph. */
  for (size_t i = 0; *result == CU_GRAPH_EXEC_UPDATE_SUCCESS && i < g->n; i++)
    if (x->nodes[i].type != g->nodes[i]->type) {
      *result = CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED;
      size_t k = g->n; /* the node of g's own that holds i */
      while (fk_prev_own(g->nodes[k - 1], k) > i)
        k = fk_prev_own(g->nodes[k - 1], k);
      *err = (CUgraphNode)g->nodes[k - 1];
    } else if (g->nodes[i]->type == CU_GRAPH_NODE_TYPE_GRAPH &&
               x->nodes[i].n != g->nodes[i]->n) {
      *result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
    }
  for (size_t i = 0; *result == CU_GRAPH_EXEC_UPDATE_SUCCESS && i < g->n;
       i++) { /* x's nodes are still named by its own graph's */
    unsigned long long id = x->nodes[i].id;
    x->nodes[i] = *g->nodes[i];
    x->nodes[i].id = id;
  }
  pthread_mutex_unlock(&fk.lock);
  return *result == CU_GRAPH_EXEC_UPDATE_SUCCESS
             ? CUDA_SUCCESS
             : CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
}

/* The form before CUDA 12.0 (cudaTypedefs.h: PFN_cuGraphExecUpdate_v10020)
 * and CUDA 12.0's, with a result info. */
CUresult cuGraphExecUpdate(CUgraphExec x, CUgraph g, CUgraphNode *err,
                           CUgraphExecUpdateResult *result) {
  FK_COUNT(cuGraphExecUpdate);
  FK_NEED_INIT();
  CUgraphNode e;
  CUgraphExecUpdateResult res;
  CUresult r = fk_exec_update(x, g, &e, &res);
  if (err != NULL)
    *err = e;
  if (result != NULL)
    *result = res;
  return r;
}

CUresult cuGraphExecUpdate_v2(CUgraphExec x, CUgraph g,
                              CUgraphExecUpdateResultInfo *info) {
  FK_COUNT(cuGraphExecUpdate_v2);
  FK_NEED_INIT();
  CUgraphNode e;
  CUgraphExecUpdateResult res;
  CUresult r = fk_exec_update(x, g, &e, &res);
  if (info != NULL) {
    info->result = res;
    info->errorNode = e;
    info->errorFromNode = NULL;
  }
  return r;
}

CUresult cuUserObjectCreate(CUuserObject *out, void *ptr, CUhostFn destroy,
                            unsigned refs, unsigned flags) {
  FK_COUNT(cuUserObjectCreate);
  FK_NEED_INIT();
  if (out == NULL || destroy == NULL || refs == 0 ||
      flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC)
    return CUDA_ERROR_INVALID_VALUE;
  struct CUuserObject_st *o = calloc(1, sizeof *o);
  if (o == NULL)
    return CUDA_ERROR_OUT_OF_MEMORY;
  atomic_init(&o->refs, refs);
  o->ptr = ptr;
  o->destroy = destroy;
  *out = o;
  return CUDA_SUCCESS;
}

CUresult cuUserObjectRelease(CUuserObject o, unsigned count) {
  FK_COUNT(cuUserObjectRelease);
  FK_NEED_INIT();
  if (o == NULL || count == 0 || atomic_load(&o->refs) < count)
    return CUDA_ERROR_INVALID_VALUE;
  fk_uobj_release(o, count);
  return CUDA_SUCCESS;
}

/* Under fk.lock: a graph being captured gets references from another
 * thread's cuStreamGetCaptureInfo. */
CUresult cuGraphRetainUserObject(CUgraph g, CUuserObject o, unsigned count,
                                 unsigned flags) {
  FK_COUNT(cuGraphRetainUserObject);
  FK_NEED_INIT();
  if (g == NULL || o == NULL || count == 0 ||
      (flags & ~(unsigned)CU_GRAPH_USER_OBJECT_MOVE) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fk.lock);
  bool ok =
      fk_urefs_add(&g->urefs, o, count, flags & CU_GRAPH_USER_OBJECT_MOVE);
  pthread_mutex_unlock(&fk.lock);
  return ok ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* A launch of x allocates its graph's outputs again: cuda.h, cuGraphLaunch,
 * "If any allocations created by hGraphExec remain unfreed (from a previous
 * launch) and hGraphExec was not instantiated with
 * CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH, the launch will fail
 * with CUDA_ERROR_INVALID_VALUE" (false: nothing changed); with that flag
 * "each launch behave[s] as though it called cuMemFreeAsync for every
 * unfreed allocation" (cuGraphAddMemAllocNode). Takes fk.lock. */
static bool fk_graph_allocate(CUgraphExec x) {
  pthread_mutex_lock(&fk.lock);
  const fk_gmem_t *m = x->gmem;
  bool ok = true;
  for (size_t i = 0; m != NULL && ok && i < m->outs.n; i++) {
    const fk_range_t *r = fk_range_at(m->outs.a[i].p);
    ok = x->auto_free || r == NULL || r->gout != FK_GOUT_LIVE;
  }
  for (size_t i = 0; m != NULL && ok && i < m->outs.n; i++) {
    fk_range_t *r = fk_range_at(m->outs.a[i].p);
    if (r != NULL && r->gout == FK_GOUT_IDLE)
      r->gout = FK_GOUT_LIVE;
  }
  for (size_t i = 0; m != NULL && ok && i < m->frees.n; i++) {
    fk_range_t *r = fk_range_at(m->frees.a[i].p);
    if (r != NULL && r->gout == FK_GOUT_LIVE)
      r->gout = FK_GOUT_IDLE;
  }
  pthread_mutex_unlock(&fk.lock);
  return ok;
}

/* Replays the graph's operations, in order, on stream s. */
static CUresult fk_graph_launch(mp_device_t *dev, CUgraphExec x, CUstream s,
                                bool ptsz) {
  if (x == NULL)
    return fk_bad_handle();
  if (!fk_graph_allocate(x))
    return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < x->n; i++) {
    const fk_node_t *nd = &x->nodes[i];
    CUresult r = CUDA_SUCCESS;
    if (nd->type == CU_GRAPH_NODE_TYPE_HOST)
      r = fk_launch_host(dev, s, ptsz, nd->fn, nd->arg);
    else if (nd->type == CU_GRAPH_NODE_TYPE_MEMSET ||
             nd->type == CU_GRAPH_NODE_TYPE_MEMCPY)
      r = fk_copy(dev, nd->dst, nd->src, nd->type == CU_GRAPH_NODE_TYPE_MEMSET,
                  nd->value, nd->n, s, ptsz, false);
    if (r != CUDA_SUCCESS)
      return r;
  }
  return CUDA_SUCCESS;
}

FK_IN_CTX_TWINS(cuGraphLaunch, cuGraphLaunch_ptsz, (CUgraphExec x, CUstream s),
                fk_graph_launch(dev, x, s, ptsz))

/* ---- virtual memory management ------------------------------------------- */

/* The host device a prop names; NULL for a bad prop. */
static mp_device_t *fk_prop_device(const CUmemAllocationProp *prop) {
  if (prop == NULL || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      !fk_valid_device(prop->location.id))
    return NULL;
  return fk_host(prop->location.id);
}

CUresult cuMemGetAllocationGranularity(size_t *granularity,
                                       const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags opt) {
  FK_COUNT(cuMemGetAllocationGranularity);
  FK_NEED_INIT();
  (void)opt;
  mp_device_t *dev = fk_prop_device(prop);
  if (granularity == NULL || dev == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  return fk_result_of(mp__device_vm_granularity(dev, granularity));
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                             CUdeviceptr addr, unsigned long long flags) {
  FK_COUNT(cuMemAddressReserve);
  FK_CURRENT(dev);
  FK_UNSAFE_VMM();
  (void)addr; /* a hint only */
  size_t g = 0;
  mp_status_t st = mp__device_vm_granularity(dev, &g);
  if (st != MP_OK)
    return fk_result_of(st);
  if (ptr == NULL || size == 0 || size % g != 0 || flags != 0 ||
      (alignment != 0 && (g % alignment != 0)))
    return CUDA_ERROR_INVALID_VALUE;
  void *p = NULL;
  st = mp__device_vm_reserve(dev, size, &p);
  if (st != MP_OK)
    return fk_result_of(st);
  pthread_mutex_lock(&fk.lock);
  fk_resv_t *t = fk_room(fk_resvs, fk_nresvs, &fk_resvs_cap, sizeof *t);
  if (t != NULL) {
    fk_resvs = t;
    fk_resvs[fk_nresvs++] = (fk_resv_t){
        .base = (uintptr_t)p, .size = size, .ctx = fk_stack[fk_depth - 1]};
  }
  pthread_mutex_unlock(&fk.lock);
  if (t == NULL) {
    (void)mp__device_vm_release(dev, p, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *ptr = (CUdeviceptr)p;
  return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  FK_COUNT(cuMemAddressFree);
  FK_CURRENT(dev);
  FK_UNSAFE_VMM();
  if (ptr == 0 || size == 0)
    return CUDA_ERROR_INVALID_VALUE;
  /* The host device refuses a reservation that still has mappings
   * (MP_EBUSY), which fk_result_of would answer CUDA_ERROR_NOT_READY, a
   * code cuda.h does not list for cuMemAddressFree (CUDA_SUCCESS,
   * _INVALID_VALUE, _NOT_INITIALIZED, _DEINITIALIZED, _NOT_PERMITTED,
   * _NOT_SUPPORTED) and one a caller may take for "try again later". cuda.h
   * says nothing of a mapped range, and cuMemUnmap's text ("the address
   * range is converted to an address reservation") puts the unmap before
   * the free; the fake refuses it with CUDA_ERROR_INVALID_VALUE, changing
   * nothing. Not yet checked on a GPU: test_fakecuda_vmm_rules.c's twin
   * logs the code a real driver gives. */
  mp_status_t st = mp__device_vm_release(dev, (void *)ptr, size);
  if (st == MP_OK) {
    pthread_mutex_lock(&fk.lock);
    size_t i = fk_resv_find((uintptr_t)ptr);
    if (i < fk_nresvs)
      fk_resvs[i] = fk_resvs[--fk_nresvs];
    pthread_mutex_unlock(&fk.lock);
  }
  return st == MP_EBUSY ? CUDA_ERROR_INVALID_VALUE : fk_result_of(st);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop,
                     unsigned long long flags) {
  FK_COUNT(cuMemCreate);
  FK_NEED_INIT();
  FK_UNSAFE_VMM();
  mp_device_t *dev = fk_prop_device(prop);
  size_t g = 0;
  if (handle == NULL || dev == NULL || size == 0 || flags != 0)
    return CUDA_ERROR_INVALID_VALUE;
  mp_status_t st = mp__device_vm_granularity(dev, &g);
  if (st != MP_OK)
    return fk_result_of(st);
  if (size % g != 0)
    return CUDA_ERROR_INVALID_VALUE;
  bool wants_fd = (prop->requestedHandleTypes &
                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
  if (fk.no_shareable && (wants_fd || prop->allocFlags.gpuDirectRDMACapable))
    return CUDA_ERROR_NOT_SUPPORTED;
  fk_phys_t *p = calloc(1, sizeof *p);
  if (p == NULL)
    return CUDA_ERROR_OUT_OF_MEMORY;
  p->size = size;
  p->ordinal = prop->location.id;
  p->types = prop->requestedHandleTypes;
  p->import_fd = -1;
  p->ctx = &fk.ctx[prop->location.id];
  /* The memory is the device's from here (fk_phys_count): a handle that
   * does not fit is CUDA_ERROR_OUT_OF_MEMORY now, not at cuMemMap. */
  pthread_mutex_lock(&fk.lock);
  fk.last_handle_types = prop->requestedHandleTypes;
  fk.last_rdma = prop->allocFlags.gpuDirectRDMACapable;
  CUresult r = fk_fits(dev, size);
  if (r == CUDA_SUCCESS) {
    fk_phys_list(p);
    fk_phys_count(p, true);
    *handle = p->id;
  }
  pthread_mutex_unlock(&fk.lock);
  if (r != CUDA_SUCCESS) {
    free(p);
    return r;
  }
  return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  FK_COUNT(cuMemRelease);
  FK_NEED_INIT();
  FK_UNSAFE_VMM();
  /* A handle released before (or never made) is refused (fk_phys_valid);
   * one still mapped is freed with its last unmap. */
  pthread_mutex_lock(&fk.lock);
  fk_phys_t *p = fk_phys_valid(handle);
  bool free_now = false;
  if (p != NULL) {
    fk_phys_count(p, false);
    p->released = true;
    free_now = p->maps == 0;
    if (free_now)
      fk_phys_unlink(p);
  }
  pthread_mutex_unlock(&fk.lock);
  if (p == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  if (free_now)
    fk_phys_free(p);
  return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                  CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
  FK_COUNT(cuMemMap);
  FK_CURRENT(dev);
  FK_UNSAFE_VMM();
  if (ptr == 0 || offset != 0 || flags != 0)
    return CUDA_ERROR_INVALID_VALUE;
  /* A released handle is no handle (fk_phys_valid), even while a mapping
   * keeps its memory. The map is made under fk.lock, so that a release
   * meanwhile cannot free the handle under it, and so that its memory goes
   * from unbacked to the host device's charge (vm_map) in one step: in
   * between, another thread's cuMemCreate or cuMemAlloc took it as free
   * (fk_fits), and this map then ran out of memory. */
  pthread_mutex_lock(&fk.lock);
  fk_phys_t *p = fk_phys_valid(handle);
  bool ok = p != NULL && (p->import_fd >= 0 || size == p->size);
  mp_status_t st = MP_EINVAL;
  if (ok) {
    fk_phys_count(p, false);
    /* An imported handle maps the exporter's memory (its file range); the
     * host backend checks that size fits in it. */
    st = p->import_fd >= 0
             ? mp__host_vm_map_file(dev, (void *)ptr, size, p->import_fd)
             : mp__device_vm_map(dev, (void *)ptr, size);
    if (st == MP_OK)
      p->maps++;
    fk_phys_count(p, true);
  }
  pthread_mutex_unlock(&fk.lock);
  if (!ok)
    return CUDA_ERROR_INVALID_VALUE;
  if (st != MP_OK)
    return fk_result_of(st);
  CUresult res = CUDA_SUCCESS;
  fk_range_t r = {.base = (uintptr_t)ptr,
                  .size = size,
                  .ctx = fk_stack[fk_depth - 1],
                  .phys = p,
                  .ipc_fd = -1};
  if (!fk_range_add(r)) {
    pthread_mutex_lock(&fk.lock);
    (void)mp__device_vm_unmap(dev, (void *)ptr, size);
    bool free_now = fk_phys_unmapped_locked(p);
    pthread_mutex_unlock(&fk.lock);
    if (free_now)
      fk_phys_free(p);
    res = CUDA_ERROR_OUT_OF_MEMORY;
  }
  return res;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  FK_COUNT(cuMemUnmap);
  FK_CURRENT(dev);
  FK_UNSAFE_VMM();
  pthread_mutex_lock(&fk.lock);
  bool busy = fk_in_flight((uintptr_t)ptr, (uintptr_t)ptr + size);
  pthread_mutex_unlock(&fk.lock);
  if (busy) { /* see fk_flight_t */
    if (fk_env_flag_is("FAKECUDA_UNMAP_IN_USE", "refuse"))
      return CUDA_ERROR_INVALID_VALUE;
    fprintf(stderr,
            "fakecuda: cuMemUnmap(%p, %zu) of memory that queued copies or "
            "memsets still use (a GPU may fault)\n",
            (void *)ptr, size);
    abort();
  }
  fk_range_t r;
  if (!fk_range_take((uintptr_t)ptr, &r))
    return CUDA_ERROR_INVALID_VALUE;
  if (r.phys == NULL || r.size != size) {
    (void)fk_range_add(r);
    return CUDA_ERROR_INVALID_VALUE;
  }
  /* Under fk.lock: the memory goes from the host device's charge back to
   * the handle's count (unbacked) in one step, as in cuMemMap. */
  pthread_mutex_lock(&fk.lock);
  mp_status_t st = mp__device_vm_unmap(dev, (void *)ptr, size);
  bool free_now = st == MP_OK && fk_phys_unmapped_locked(r.phys);
  pthread_mutex_unlock(&fk.lock);
  if (st != MP_OK) {
    (void)fk_range_add(r);
    return fk_result_of(st);
  }
  if (free_now)
    fk_phys_free(r.phys);
  return CUDA_SUCCESS;
}

/* Every byte of [ptr, ptr + size) must be mapped. */
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size,
                        const CUmemAccessDesc *desc, size_t count) {
  FK_COUNT(cuMemSetAccess);
  FK_CURRENT(dev);
  FK_UNSAFE_VMM();
  (void)dev;
  if (desc == NULL || count == 0 || size == 0)
    return CUDA_ERROR_INVALID_VALUE;
  /* Each desc sets its device's access to what its flags say, one of
   * cuda.h's CUmemAccess_flags (PROT_NONE takes access away, PROT_READ
   * leaves it read-only); a later desc for the same device wins. Devices
   * not named keep what they had. */
  unsigned named = 0, readers = 0, writers = 0;
  for (size_t i = 0; i < count; i++) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE)
      return CUDA_ERROR_INVALID_VALUE;
    if (!fk_valid_device(desc[i].location.id))
      return CUDA_ERROR_INVALID_DEVICE;
    unsigned bit = 1u << desc[i].location.id;
    named |= bit;
    readers &= ~bit;
    writers &= ~bit;
    switch (desc[i].flags) {
    case CU_MEM_ACCESS_FLAGS_PROT_NONE: break;
    case CU_MEM_ACCESS_FLAGS_PROT_READ: readers |= bit; break;
    case CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
      readers |= bit;
      writers |= bit;
      break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
  }
  /* "The range must be a fully mapped address range containing all
   * allocations created by cuMemMap / cuMemCreate" (cuda.h,
   * cuMemSetAccess): whole mappings, every byte in one, none cut at
   * either end. Then the access is recorded on each (cuFakeAccessMask) and
   * copies and memsets check it (fk_access_ok). */
  pthread_mutex_lock(&fk.lock);
  uintptr_t at = (uintptr_t)ptr, end = at + size;
  CUresult r = CUDA_SUCCESS;
  while (at < end && r == CUDA_SUCCESS) {
    size_t i = fk_range_lower(at + 1);
    if (i == 0 || at != fk.ranges[i - 1].base ||
        fk.ranges[i - 1].phys == NULL || fk.ranges[i - 1].size > end - at)
      r = CUDA_ERROR_INVALID_VALUE;
    else
      at = fk.ranges[i - 1].base + fk.ranges[i - 1].size;
  }
  for (at = (uintptr_t)ptr; r == CUDA_SUCCESS && at < end;) {
    fk_range_t *g = &fk.ranges[fk_range_lower(at + 1) - 1];
    g->access = (g->access & ~named) | readers;
    g->writable = (g->writable & ~named) | writers;
    at = g->base + g->size;
  }
  pthread_mutex_unlock(&fk.lock);
  return r;
}

/* ---- IPC ------------------------------------------------------------------
 * Memory is the host device's memfd, so a shareable handle is a descriptor
 * of it positioned at the allocation (what the host backend's ipc_export
 * gives), and a CUipcMemHandle names the exporter's descriptor by process
 * and number (opened through /proc/<pid>/fd) with the offset and size.
 * Rules kept (cuda.h): cuMemExportToShareableHandle needs flags 0 and a
 * handle created with the requested type in requestedHandleTypes
 * (CUmemAllocationProp: "bitmask indicating intended handle types");
 * cuIpcGetMemHandle takes "a pointer to the base of an existing device
 * memory allocation created with ::cuMemAlloc" only (not cuMemCreate
 * mappings, not cuMemAllocAsync's stream-ordered memory), and the handle
 * names that whole allocation; FAKECUDA_IPC_INTERIOR=1 also takes a pointer
 * inside one and exports the whole allocation, which the importer then
 * opens at its base: what a real driver is seen to do (vLLM's custom
 * all-reduce shares "the base address of each allocation, or we get wrong
 * address"), for tests that show what a program sharing a sub-allocated
 * pointer gets;
 * cuIpcOpenMemHandle's flags must be CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS and
 * its memory is released with cuIpcCloseMemHandle, never cuMemFree.
 * A handle opened again in a context that has it open gives the same
 * pointer and counts the open (cuda.h, cuIpcOpenMemHandle: "If the memory
 * handle has already been opened by the current context, the reference
 * count on the handle is incremented by 1 and the existing device pointer
 * is returned"); cuIpcCloseMemHandle unmaps at the last close ("Decrements
 * the reference count ... When the reference count reaches 0, this API
 * unmaps the memory"). A handle names its allocation by the exporter and a
 * serial, so an allocation made since at the same address has another
 * handle ("cuIpcGetMemHandle will return a unique handle for the new
 * memory").
 * Limits: a cuMemCreate handle can be exported only while it is mapped
 * (physical memory exists here only in a mapping); an imported handle maps
 * any size that fits in the exported allocation (the host backend checks
 * it against the export: mp__host_vm_map_file), not only its whole size;
 * opening a handle in its exporting process
 * is refused (CUDA_ERROR_INVALID_CONTEXT): cuda.h's cuIpcOpenMemHandle maps
 * "memory exported from another process", and a real driver answers an
 * open in the exporting process "invalid device context" (openucx/ucx
 * pull 11603 and 11226, which had to stop opening handles of their own
 * process); the error code is seen, not documented. */

typedef struct fk_ipc {
  char magic[8]; /* "fkipc1" */
  int32_t pid;   /* the exporter */
  int32_t fd;    /* its descriptor of the memory, positioned at off */
  uint64_t off, size;
  uint64_t serial; /* the allocation's, unique in the exporter */
} fk_ipc_t;

/* The serials of exported allocations (fk_ipc_t). */
static atomic_ullong fk_ipc_serials = 1;
_Static_assert(sizeof(fk_ipc_t) <= CU_IPC_HANDLE_SIZE, "fits the handle");

/* The range a mapping of p lies at in the current context's device. */
static bool fk_phys_mapping(const fk_phys_t *p, fk_range_t *out) {
  pthread_mutex_lock(&fk.lock);
  bool found = false;
  for (size_t i = 0; i < fk.n_ranges && !found; i++)
    if (fk.ranges[i].phys == p) {
      *out = fk.ranges[i];
      found = true;
    }
  pthread_mutex_unlock(&fk.lock);
  return found;
}

CUresult cuMemExportToShareableHandle(void *shareableHandle,
                                      CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType handleType,
                                      unsigned long long flags) {
  FK_COUNT(cuMemExportToShareableHandle);
  FK_CURRENT(dev);
  FK_UNSAFE_VMM();
  pthread_mutex_lock(&fk.lock);
  fk_phys_t *p = fk_phys_valid(handle); /* not a released one */
  CUmemAllocationHandleType types = p != NULL ? p->types : 0;
  bool imported = p != NULL && p->import_fd >= 0;
  pthread_mutex_unlock(&fk.lock);
  if (shareableHandle == NULL || p == NULL || flags != 0 ||
      handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return CUDA_ERROR_INVALID_VALUE;
  if (!(types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    return CUDA_ERROR_NOT_PERMITTED;
  fk_range_t r;
  if (imported || !fk_phys_mapping(p, &r))
    return CUDA_ERROR_NOT_SUPPORTED; /* the fake's limit, see above */
  mp_ipc_handle_t h;
  mp_status_t st = mp__device_ipc_export(dev, (void *)r.base, r.size, true, &h);
  if (st != MP_OK)
    return fk_result_of(st);
  /* cuda.h promises nothing of the descriptor but that it is "the
   * requested handle type" (shareableHandle): not close-on-exec, which
   * the host device's export sets, so the fake clears it. */
  (void)fcntl(h.fd, F_SETFD, 0);
  *(int *)shareableHandle = h.fd;
  return CUDA_SUCCESS;
}

CUresult
cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                               void *osHandle,
                               CUmemAllocationHandleType shHandleType) {
  FK_COUNT(cuMemImportFromShareableHandle);
  FK_CURRENT(dev);
  FK_UNSAFE_VMM();
  (void)dev;
  if (handle == NULL ||
      shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return CUDA_ERROR_INVALID_VALUE;
  /* The driver keeps its own reference: the caller may close osHandle. */
  int fd = fcntl((int)(intptr_t)osHandle, F_DUPFD_CLOEXEC, 0);
  struct stat sb;
  if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    if (fd >= 0)
      close(fd);
    return CUDA_ERROR_INVALID_VALUE;
  }
  fk_phys_t *p = calloc(1, sizeof *p);
  if (p == NULL) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  p->import_fd = fd;
  p->types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  pthread_mutex_lock(&fk.lock);
  fk_phys_list(p);
  *handle = p->id;
  pthread_mutex_unlock(&fk.lock);
  return CUDA_SUCCESS;
}

CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr) {
  FK_COUNT(cuIpcGetMemHandle);
  FK_CURRENT(dev);
  FK_UNSAFE_VMM();
  if (pHandle == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  fk_range_t r;
  if (!fk_range_find((uintptr_t)dptr, &r) || r.phys != NULL || r.ipc_open ||
      r.stream_ordered ||
      (r.base != (uintptr_t)dptr && !fk_env_flag("FAKECUDA_IPC_INTERIOR")))
    return CUDA_ERROR_INVALID_VALUE; /* the base of a cuMemAlloc only */
  int fd = r.ipc_fd;
  uint64_t serial = r.ipc_serial;
  if (fd < 0) {
    mp_ipc_handle_t h;
    mp_status_t st =
        mp__device_ipc_export(dev, (void *)r.base, r.size, false, &h);
    if (st != MP_OK)
      return fk_result_of(st);
    fd = h.fd;
    pthread_mutex_lock(&fk.lock);
    size_t i = fk_range_lower(r.base);
    if (i < fk.n_ranges && fk.ranges[i].base == r.base &&
        fk.ranges[i].ipc_fd < 0) {
      fk.ranges[i].ipc_fd = fd;
      fk.ranges[i].ipc_serial = atomic_fetch_add(&fk_ipc_serials, 1);
    } else {
      close(fd);
      fd = i < fk.n_ranges && fk.ranges[i].base == r.base ? fk.ranges[i].ipc_fd
                                                          : -1;
    }
    if (fd >= 0)
      serial = fk.ranges[i].ipc_serial;
    pthread_mutex_unlock(&fk.lock);
    if (fd < 0)
      return CUDA_ERROR_INVALID_VALUE;
  }
  fk_ipc_t e = {.magic = "fkipc1",
                .pid = (int32_t)getpid(),
                .fd = fd,
                .off = (uint64_t)lseek(fd, 0, SEEK_CUR),
                .size = r.size,
                .serial = serial};
  memset(pHandle, 0, sizeof *pHandle);
  memcpy(pHandle->reserved, &e, sizeof e);
  return CUDA_SUCCESS;
}

/* Opens and closes of CUipcMemHandles go one at a time: an open finds
 * the handle open in its context, or maps it and lists the mapping, in one
 * step, and a close drops the count and unmaps at 0 in one, so that two
 * threads opening one handle in one context get one mapping counted twice
 * (cuda.h, cuIpcOpenMemHandle: "If the memory handle has already been
 * opened by the current context, the reference count on the handle is
 * incremented by 1 and the existing device pointer is returned"), never
 * two, and an open beside the last close finds it either listed or gone.
 * The outermost of the fake's locks: fk.lock and the host device's are
 * taken under it, never the other way. */
static pthread_mutex_t fk_ipc_lock = PTHREAD_MUTEX_INITIALIZER;

/* cuIpcOpenMemHandle of e in ctx, fk_ipc_lock held. */
static CUresult fk_ipc_open_locked(mp_device_t *dev, const struct CUctx_st *ctx,
                                   const fk_ipc_t *e, CUdeviceptr *pdptr) {
  /* Open already in this context: counted, the same pointer. */
  pthread_mutex_lock(&fk.lock);
  fk_range_t *held = NULL;
  for (size_t i = 0; i < fk.n_ranges && held == NULL; i++)
    if (fk.ranges[i].ipc_open && fk.ranges[i].ctx == ctx &&
        fk.ranges[i].ipc_pid == e->pid && fk.ranges[i].ipc_serial == e->serial)
      held = &fk.ranges[i];
  if (held != NULL) {
    held->ipc_refs++;
    *pdptr = (CUdeviceptr)held->base;
  }
  pthread_mutex_unlock(&fk.lock);
  if (held != NULL)
    return CUDA_SUCCESS;
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)e->pid, (int)e->fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0)
    return CUDA_ERROR_INVALID_HANDLE;
  void *p = mmap(NULL, e->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                 (off_t)e->off);
  close(fd);
  if (p == MAP_FAILED)
    return CUDA_ERROR_MAP_FAILED;
  fk_range_t r = {.base = (uintptr_t)p,
                  .size = e->size,
                  .ctx = ctx,
                  .ipc_fd = -1,
                  .ipc_open = true,
                  .ipc_serial = e->serial,
                  .ipc_pid = e->pid,
                  .ipc_refs = 1};
  /* Device memory of this context from now, to copies and memsets
   * (cuda.h, cuIpcOpenMemHandle: "Maps memory exported from another
   * process ... into the current device address space"). */
  if (mp__host_note_import(dev, p, e->size, true) != MP_OK) {
    munmap(p, e->size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (!fk_range_add(r)) {
    (void)mp__host_note_import(dev, p, e->size, false);
    munmap(p, e->size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *pdptr = (CUdeviceptr)p;
  return CUDA_SUCCESS;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
                               unsigned int Flags) {
  FK_COUNT(cuIpcOpenMemHandle_v2);
  FK_CURRENT(dev);
  FK_UNSAFE_VMM();
  fk_ipc_t e;
  memcpy(&e, handle.reserved, sizeof e);
  if (pdptr == NULL || Flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
    return CUDA_ERROR_INVALID_VALUE;
  if (memcmp(e.magic, "fkipc1", 7) != 0 || e.size == 0)
    return CUDA_ERROR_INVALID_HANDLE;
  if (e.pid == (int32_t)getpid())
    return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&fk_ipc_lock);
  CUresult r = fk_ipc_open_locked(dev, fk_stack[fk_depth - 1], &e, pdptr);
  pthread_mutex_unlock(&fk_ipc_lock);
  return r;
}

/* cuIpcCloseMemHandle of dptr, fk_ipc_lock held. */
static CUresult fk_ipc_close_locked(mp_device_t *dev, CUdeviceptr dptr) {
  fk_range_t r;
  if (!fk_range_take((uintptr_t)dptr, &r))
    return CUDA_ERROR_INVALID_VALUE;
  if (!r.ipc_open || --r.ipc_refs > 0) { /* not one; or opened again */
    (void)fk_range_add(r);
    return r.ipc_open ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  }
  /* Known to the device of the context it was opened in. */
  mp_device_t *opened_on = atomic_load(&((struct CUctx_st *)r.ctx)->dev);
  (void)mp__host_note_import(opened_on != NULL ? opened_on : dev,
                             (void *)r.base, r.size, false);
  munmap((void *)r.base, r.size);
  return CUDA_SUCCESS;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  FK_COUNT(cuIpcCloseMemHandle);
  FK_CURRENT(dev);
  FK_UNSAFE_VMM();
  pthread_mutex_lock(&fk_ipc_lock);
  CUresult r = fk_ipc_close_locked(dev, dptr);
  pthread_mutex_unlock(&fk_ipc_lock);
  return r;
}

/* The attributes the shim answers for pool memory (cuda.h,
 * CUpointer_attribute): RANGE_START_ADDR and RANGE_SIZE are the
 * allocation holding ptr, as cuMemGetAddressRange says, but for mapped
 * memory the reservation holding it (cuda.h, cuPointerGetAttribute: "not
 * necessarily the address of the mapped region, but the address of the
 * mappable address range ptr references (e.g. from
 * ::cuMemAddressReserve)"; "To retrieve the size of the mapped region, see
 * ::cuMemGetAddressRange"; the fake gave the mapping);
 * IS_LEGACY_CUDA_IPC_CAPABLE ("suitable for ::cudaIpcGetMemHandle") is 1
 * in a cuMemAlloc allocation, 0 in a cuMemCreate mapping, stream-ordered
 * memory or an opened CUipcMemHandle (what cuIpcGetMemHandle refuses),
 * written as an unsigned int; other attributes are not modelled. */
static CUresult fk_pointer_attribute(void *data, CUpointer_attribute attribute,
                                     CUdeviceptr ptr) {
  if (data == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  fk_range_t r;
  /* Page-locked memory (cuMemHostAlloc, cuMemAllocHost): with unified
   * addressing its host address is its device pointer (cuda.h,
   * cuMemHostGetDevicePointer: the two "will match" where every device can
   * use host pointers, and "Unified Addressing"), so RANGE_START_ADDR and
   * RANGE_SIZE are "the allocation referenced by the device pointer ptr"
   * (cuda.h, cuPointerGetAttribute): the page-locked allocation. It is no
   * cuMemAlloc memory: not IPC capable. */
  bool pinned = false;
  if (!fk_range_find((uintptr_t)ptr, &r)) {
    if (!fk_pin_range((uintptr_t)ptr, &r))
      return CUDA_ERROR_INVALID_VALUE;
    pinned = true;
  }
  uintptr_t base = r.base;
  size_t size = r.size;
  if (r.phys != NULL) {
    pthread_mutex_lock(&fk.lock);
    size_t i = fk_resv_find((uintptr_t)ptr);
    if (i < fk_nresvs) {
      base = fk_resvs[i].base;
      size = fk_resvs[i].size;
    }
    pthread_mutex_unlock(&fk.lock);
  }
  switch (attribute) {
  case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    *(CUdeviceptr *)data = (CUdeviceptr)base;
    return CUDA_SUCCESS;
  case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    *(size_t *)data = size;
    return CUDA_SUCCESS;
  case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    *(unsigned int *)data =
        !pinned && r.phys == NULL && !r.ipc_open && !r.stream_ordered ? 1u : 0u;
    return CUDA_SUCCESS;
  case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
    if (pinned)
      return CUDA_ERROR_NOT_SUPPORTED; /* not modelled */
    /* cuda.h: "a device ordinal of a device against which the memory was
     * allocated": a mapping's physical memory's, else its context's. */
    *(int *)data = r.phys != NULL  ? r.phys->ordinal
                   : r.ctx != NULL ? r.ctx->ordinal
                                   : 0;
    return CUDA_SUCCESS;
  default: return CUDA_ERROR_NOT_SUPPORTED;
  }
}

CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute,
                               CUdeviceptr ptr) {
  FK_COUNT(cuPointerGetAttribute);
  FK_NEED_INIT();
  return fk_pointer_attribute(data, attribute, ptr);
}

/* The plural: each attribute as cuPointerGetAttribute answers it; for a
 * pointer the fake does not know, "default NULL values" and CUDA_SUCCESS
 * (cuda.h). Only the attributes the singular models are answered. */
CUresult cuPointerGetAttributes(unsigned int numAttributes,
                                CUpointer_attribute *attributes, void **data,
                                CUdeviceptr ptr) {
  FK_COUNT(cuPointerGetAttributes);
  FK_NEED_INIT();
  if (attributes == NULL || data == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  fk_range_t r;
  fk_pin_t pin;
  bool known = fk_range_find((uintptr_t)ptr, &r) ||
               fk_pin_get((uintptr_t)ptr, false, false, &pin);
  for (unsigned int i = 0; i < numAttributes; i++) {
    if (data[i] == NULL)
      continue;
    if (known) {
      /* Not the exported cuPointerGetAttribute, which a preloaded shim
       * would answer: the driver's own answer. */
      CUresult e = fk_pointer_attribute(data[i], attributes[i], ptr);
      if (e != CUDA_SUCCESS)
        return e;
      continue;
    }
    switch (attributes[i]) {
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *(CUdeviceptr *)data[i] = 0;
      break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data[i] = 0; break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      *(unsigned int *)data[i] = 0;
      break;
    default: return CUDA_ERROR_NOT_SUPPORTED;
    }
  }
  return CUDA_SUCCESS;
}

/* Test hook: the devices given access to the mapping holding addr, or -1
 * where nothing is mapped. */
int cuFakeAccessMask(CUdeviceptr addr);
int cuFakeAccessMask(CUdeviceptr addr) {
  fk_range_t r;
  if (!fk_range_find((uintptr_t)addr, &r) || r.phys == NULL)
    return -1;
  return (int)r.access;
}

/* ---- errors -------------------------------------------------------------- */

#define FK_ERRORS(X)                                                           \
  X(CUDA_SUCCESS, "no error")                                                  \
  X(CUDA_ERROR_INVALID_VALUE, "invalid argument")                              \
  X(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")                                 \
  X(CUDA_ERROR_NOT_INITIALIZED, "initialization error")                        \
  X(CUDA_ERROR_DEINITIALIZED, "driver shutting down")                          \
  X(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected")                \
  X(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal")                       \
  X(CUDA_ERROR_INVALID_CONTEXT, "invalid device context")                      \
  X(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle")                      \
  X(CUDA_ERROR_NOT_FOUND, "named symbol not found")                            \
  X(CUDA_ERROR_NOT_READY, "device not ready")                                  \
  X(CUDA_ERROR_NOT_PERMITTED, "operation not permitted")                       \
  X(CUDA_ERROR_NOT_SUPPORTED, "operation not supported")                       \
  X(CUDA_ERROR_MAP_FAILED, "mapping of buffer object failed")                  \
  X(CUDA_ERROR_ILLEGAL_STATE, "the operation is not permitted in this state")  \
  X(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered")    \
  X(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure")                    \
  X(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,                                     \
    "operation not permitted when stream is capturing")                        \
  X(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,                                     \
    "operation failed due to a previous error during capture")                 \
  X(CUDA_ERROR_STREAM_CAPTURE_MERGE,                                           \
    "operation would merge two independent capture sequences")                 \
  X(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,                                       \
    "capture was not initiated in this stream")                                \
  X(CUDA_ERROR_STREAM_CAPTURE_UNJOINED,                                        \
    "capture sequence contains a fork that was not joined to the primary "     \
    "stream")                                                                  \
  X(CUDA_ERROR_STREAM_CAPTURE_ISOLATION,                                       \
    "dependency would cross the capture sequence boundary")                    \
  X(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,                                        \
    "operation would make the legacy stream depend on a capturing blocking "   \
    "stream")                                                                  \
  X(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,                                    \
    "attempt to terminate a thread-local capture sequence from another "       \
    "thread")                                                                  \
  X(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,                                         \
    "system has unsupported display driver / cuda driver combination")         \
  X(CUDA_ERROR_UNKNOWN, "unknown error")

CUresult cuGetErrorName(CUresult error, const char **pstr) {
  FK_COUNT(cuGetErrorName);
  if (pstr == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
#define FK_ERR_NAME(code, msg)                                                 \
  case code: *pstr = #code; return CUDA_SUCCESS;
    FK_ERRORS(FK_ERR_NAME)
#undef FK_ERR_NAME
  default: *pstr = NULL; return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult cuGetErrorString(CUresult error, const char **pstr) {
  FK_COUNT(cuGetErrorString);
  if (pstr == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
#define FK_ERR_MSG(code, msg)                                                  \
  case code: *pstr = msg; return CUDA_SUCCESS;
    FK_ERRORS(FK_ERR_MSG)
#undef FK_ERR_MSG
  default: *pstr = NULL; return CUDA_ERROR_INVALID_VALUE;
  }
}

/* ---- entry point lookup -------------------------------------------------- */

/* One ABI of a base name: the CUDA version that introduced it, the function,
 * and its per-thread-default-stream twin if it has one. */
typedef struct fk_proc {
  const char *name;
  int since;
  void (*fn)(void);
  void (*per_thread)(void);
} fk_proc_t;

#define FK_FN(f) ((void (*)(void))(f))
#define FK_P(name, since, f)                                                   \
  { name, since, FK_FN(f), NULL }
#define FK_PT(name, since, f, pt)                                              \
  { name, since, FK_FN(f), FK_FN(pt) }

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                             cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status);

static const fk_proc_t fk_procs[] = {
    FK_P("cuInit", 2000, cuInit),
    FK_P("cuDriverGetVersion", 2020, cuDriverGetVersion),
    FK_P("cuDeviceGet", 2000, cuDeviceGet),
    FK_P("cuDeviceGetCount", 2000, cuDeviceGetCount),
    FK_P("cuDeviceGetName", 2000, cuDeviceGetName),
    FK_P("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    FK_P("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    FK_P("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    FK_P("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    FK_P("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState),
    FK_P("cuDevicePrimaryCtxReset", 7000, cuDevicePrimaryCtxReset),
    FK_P("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2),
    FK_P("cuCtxCreate", 3020, cuCtxCreate_v2),
    FK_P("cuCtxCreate", 12050, cuCtxCreate_v4),
    FK_P("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    FK_P("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
    FK_P("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
    FK_P("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    FK_P("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    FK_P("cuCtxGetDevice", 2000, cuCtxGetDevice),
    FK_P("cuCtxSynchronize", 2000, cuCtxSynchronize),
    FK_P("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    FK_P("cuMemAlloc", 3020, cuMemAlloc_v2),
    FK_P("cuMemFree", 3020, cuMemFree_v2),
    FK_PT("cuMemAllocAsync", 11020, cuMemAllocAsync, cuMemAllocAsync_ptsz),
    FK_PT("cuMemFreeAsync", 11020, cuMemFreeAsync, cuMemFreeAsync_ptsz),
    FK_P("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2),
    FK_P("cuMemHostAlloc", 2020, cuMemHostAlloc),
    FK_P("cuMemAllocHost", 3020, cuMemAllocHost_v2),
    FK_P("cuMemFreeHost", 2000, cuMemFreeHost),
    FK_P("cuMemHostGetFlags", 2030, cuMemHostGetFlags),
    FK_P("cuMemHostGetDevicePointer", 3020, cuMemHostGetDevicePointer_v2),
    FK_P("cuMemHostRegister", 6050, cuMemHostRegister_v2),
    FK_P("cuMemHostUnregister", 4000, cuMemHostUnregister),
    FK_P("cuStreamCreate", 2000, cuStreamCreate),
    FK_P("cuStreamCreateWithPriority", 5050, cuStreamCreateWithPriority),
    FK_P("cuStreamDestroy", 4000, cuStreamDestroy_v2),
    FK_PT("cuStreamSynchronize", 2000, cuStreamSynchronize,
          cuStreamSynchronize_ptsz),
    FK_PT("cuStreamQuery", 2000, cuStreamQuery, cuStreamQuery_ptsz),
    FK_PT("cuStreamGetFlags", 5050, cuStreamGetFlags, cuStreamGetFlags_ptsz),
    FK_P("cuStreamGetCtx", 9020, cuStreamGetCtx),
    FK_PT("cuLaunchHostFunc", 10000, cuLaunchHostFunc, cuLaunchHostFunc_ptsz),
    FK_PT("cuMemcpyAsync", 4000, cuMemcpyAsync, cuMemcpyAsync_ptsz),
    FK_PT("cuMemsetD8Async", 3020, cuMemsetD8Async, cuMemsetD8Async_ptsz),
    FK_PT("cuMemcpy", 4000, cuMemcpy, cuMemcpy_ptds),
    FK_PT("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds),
    FK_PT("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds),
    FK_PT("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds),
    FK_PT("cuMemsetD8", 3020, cuMemsetD8_v2, cuMemsetD8_v2_ptds),
    FK_P("cuEventCreate", 2000, cuEventCreate),
    FK_PT("cuEventRecord", 2000, cuEventRecord, cuEventRecord_ptsz),
    FK_P("cuEventQuery", 2000, cuEventQuery),
    FK_P("cuEventSynchronize", 2000, cuEventSynchronize),
    FK_P("cuEventDestroy", 4000, cuEventDestroy_v2),
    FK_PT("cuStreamWaitEvent", 3020, cuStreamWaitEvent, cuStreamWaitEvent_ptsz),
    FK_P("cuStreamBeginCapture", 10000, cuStreamBeginCapture),
    FK_PT("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2,
          cuStreamBeginCapture_v2_ptsz),
    FK_PT("cuStreamBeginCaptureToGraph", 12030, cuStreamBeginCaptureToGraph,
          cuStreamBeginCaptureToGraph_ptsz),
    FK_PT("cuStreamEndCapture", 10000, cuStreamEndCapture,
          cuStreamEndCapture_ptsz),
    FK_PT("cuStreamIsCapturing", 10000, cuStreamIsCapturing,
          cuStreamIsCapturing_ptsz),
    FK_PT("cuStreamGetCaptureInfo", 11030, cuStreamGetCaptureInfo_v2,
          cuStreamGetCaptureInfo_v2_ptsz),
    FK_PT("cuStreamGetCaptureInfo", 12030, cuStreamGetCaptureInfo_v3,
          cuStreamGetCaptureInfo_v3_ptsz),
    FK_P("cuThreadExchangeStreamCaptureMode", 10010,
         cuThreadExchangeStreamCaptureMode),
    FK_P("cuGraphCreate", 10000, cuGraphCreate),
    FK_P("cuGraphDestroy", 10000, cuGraphDestroy),
    FK_P("cuUserObjectCreate", 11030, cuUserObjectCreate),
    FK_P("cuUserObjectRelease", 11030, cuUserObjectRelease),
    FK_P("cuGraphRetainUserObject", 11030, cuGraphRetainUserObject),
    FK_P("cuGraphGetNodes", 10000, cuGraphGetNodes),
    FK_P("cuGraphNodeGetType", 10000, cuGraphNodeGetType),
    FK_P("cuGraphDestroyNode", 10000, cuGraphDestroyNode),
    FK_P("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
    /* cudaTypedefs.h: PFN_cuGraphInstantiate_v10000 and _v11000 (the error
     * node and log forms), then cuda.h's cuGraphInstantiate, since 12.0
     * cuGraphInstantiateWithFlags. */
    FK_P("cuGraphInstantiate", 10000, cuGraphInstantiate),
    FK_P("cuGraphInstantiate", 11000, cuGraphInstantiate_v2),
    FK_P("cuGraphInstantiate", 12000, cuGraphInstantiateWithFlags),
    FK_PT("cuGraphInstantiateWithParams", 12000, cuGraphInstantiateWithParams,
          cuGraphInstantiateWithParams_ptsz),
    FK_PT("cuGraphLaunch", 10000, cuGraphLaunch, cuGraphLaunch_ptsz),
    FK_P("cuGraphExecDestroy", 10000, cuGraphExecDestroy),
    FK_P("cuGraphExecGetFlags", 12000, cuGraphExecGetFlags),
    FK_P("cuGraphClone", 10000, cuGraphClone),
    FK_P("cuGraphAddChildGraphNode", 10000, cuGraphAddChildGraphNode),
    FK_P("cuGraphAddNode", 12020, cuGraphAddNode),
    FK_P("cuGraphAddNode", 12030, cuGraphAddNode_v2),
    FK_P("cuGraphChildGraphNodeGetGraph", 10000, cuGraphChildGraphNodeGetGraph),
    FK_P("cuGraphExecChildGraphNodeSetParams", 11010,
         cuGraphExecChildGraphNodeSetParams),
    FK_P("cuGraphExecNodeSetParams", 12020, cuGraphExecNodeSetParams),
    FK_P("cuGraphNodeSetParams", 12020, cuGraphNodeSetParams),
    FK_P("cuGraphNodeFindInClone", 10000, cuGraphNodeFindInClone),
    FK_P("cuGraphExecUpdate", 10020, cuGraphExecUpdate),
    FK_P("cuGraphExecUpdate", 12000, cuGraphExecUpdate_v2),
    FK_P("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    FK_P("cuMemAddressReserve", 10020, cuMemAddressReserve),
    FK_P("cuMemAddressFree", 10020, cuMemAddressFree),
    FK_P("cuMemCreate", 10020, cuMemCreate),
    FK_P("cuMemRelease", 10020, cuMemRelease),
    FK_P("cuMemMap", 10020, cuMemMap),
    FK_P("cuMemExportToShareableHandle", 10020, cuMemExportToShareableHandle),
    FK_P("cuMemImportFromShareableHandle", 10020,
         cuMemImportFromShareableHandle),
    FK_P("cuIpcGetMemHandle", 4010, cuIpcGetMemHandle),
    FK_P("cuIpcOpenMemHandle", 11000, cuIpcOpenMemHandle_v2),
    FK_P("cuIpcCloseMemHandle", 4010, cuIpcCloseMemHandle),
    FK_P("cuPointerGetAttribute", 4000, cuPointerGetAttribute),
    FK_P("cuPointerGetAttributes", 7000, cuPointerGetAttributes),
    FK_P("cuMemUnmap", 10020, cuMemUnmap),
    FK_P("cuMemSetAccess", 10020, cuMemSetAccess),
    FK_P("cuGetErrorName", 6000, cuGetErrorName),
    FK_P("cuGetErrorString", 6000, cuGetErrorString),
    FK_P("cuGetProcAddress", 11030, cuGetProcAddress),
    FK_P("cuGetProcAddress", 12000, cuGetProcAddress_v2),
};

static int fk_driver_version(void) {
  int v = 0;
  const char *s = getenv("FAKECUDA_DRIVER_VERSION");
  v = (s != NULL && atoi(s) > 0) ? atoi(s) : CUDA_VERSION;
  return v;
}

/* The newest ABI of symbol that version allows. */
static CUresult fk_lookup(const char *symbol, void **pfn, int version,
                          cuuint64_t flags,
                          CUdriverProcAddressQueryResult *status) {
  if (symbol == NULL || pfn == NULL ||
      (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                             CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)))
    return CUDA_ERROR_INVALID_VALUE;
  if (version > fk_driver_version())
    return CUDA_ERROR_INVALID_VALUE;
  const fk_proc_t *best = NULL;
  bool named = false;
  for (size_t i = 0; i < sizeof fk_procs / sizeof *fk_procs; i++) {
    if (strcmp(fk_procs[i].name, symbol) != 0)
      continue;
    named = true;
    if (fk_procs[i].since <= version &&
        (best == NULL || fk_procs[i].since > best->since))
      best = &fk_procs[i];
  }
  *pfn = NULL;
  if (status != NULL)
    *status = best    ? CU_GET_PROC_ADDRESS_SUCCESS
              : named ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                      : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (best == NULL)
    return CUDA_SUCCESS;
  void (*fn)(void) = best->fn;
  if ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) &&
      best->per_thread != NULL)
    fn = best->per_thread;
  memcpy(pfn, &fn, sizeof fn);
  return CUDA_SUCCESS;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                             cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
  FK_COUNT(cuGetProcAddress_v2);
  return fk_lookup(symbol, pfn, cudaVersion, flags, status);
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                          cuuint64_t flags) {
  FK_COUNT(cuGetProcAddress);
  return fk_lookup(symbol, pfn, cudaVersion, flags, NULL);
}
