/* hooklist.h - every entry point libmempool_preload.so exports, and every
 * real one it calls, one line each. Everything else is made from these
 * lists: the hooks' prototypes (hooks.h), the exported symbol set (the
 * linker version script, preprocessed at build time from exports.map.in),
 * dlsym's table of hooked names (lookup.c) and the tables of the real
 * entry points with their resolution (real.c).
 *
 *   X(lib, result, name, (parameter types))
 *
 * lib: cu (the driver, libcuda.so.1; resolved into mp__real_cuda_t),
 * rt (the shared runtime, libcudart.so; mp__real_cudart_t) or own (the
 * shim's own, exported but neither resolved nor answered by dlsym).
 * MP__PL_HOOKS are exported (and defined by the file named beside them);
 * MP__PL_REAL are real entry points the hooks call but do not replace.
 * Every hooked CUDA name starts "cu" (lookup.c relies on it). A new hook:
 * one line in MP__PL_HOOKS, and its definition. Whether cuGetProcAddress
 * answers with it too (how the runtime reaches the driver) is a choice per
 * name, with the driver's version rules: lookup.c's mp__pl_proc_hook.
 *
 * No #include and nothing but macros here: exports.map.in is preprocessed
 * with this file alone. */
#ifndef MEMPOOL_PRELOAD_HOOKLIST_H
#define MEMPOOL_PRELOAD_HOOKLIST_H

#define MP__PL_HOOKS(X)                                                        \
  /* driver.c */                                                               \
  X(cu, mp__curesult, cuMemAlloc_v2, (mp__cuptr *, size_t))                    \
  X(cu, mp__curesult, cuMemFree_v2, (mp__cuptr))                               \
  X(cu, mp__curesult, cuMemAllocAsync, (mp__cuptr *, size_t, mp__custream))    \
  X(cu, mp__curesult, cuMemAllocAsync_ptsz,                                    \
    (mp__cuptr *, size_t, mp__custream))                                       \
  X(cu, mp__curesult, cuMemFreeAsync, (mp__cuptr, mp__custream))               \
  X(cu, mp__curesult, cuMemFreeAsync_ptsz, (mp__cuptr, mp__custream))          \
  X(cu, mp__curesult, cuMemGetInfo_v2, (size_t *, size_t *))                   \
  X(cu, mp__curesult, cuMemGetAddressRange_v2,                                 \
    (mp__cuptr *, size_t *, mp__cuptr))                                        \
  X(cu, mp__curesult, cuPointerGetAttribute,                                   \
    (void *, unsigned int, mp__cuptr))                                         \
  X(cu, mp__curesult, cuPointerGetAttributes,                                  \
    (unsigned int, unsigned int *, void **, mp__cuptr))                        \
  X(cu, mp__curesult, cuIpcGetMemHandle, (mp__cuipcmemhandle *, mp__cuptr))    \
  X(cu, mp__curesult, cuDevicePrimaryCtxReset, (int))                          \
  X(cu, mp__curesult, cuDevicePrimaryCtxReset_v2, (int))                       \
  /* lookup.c */                                                               \
  X(cu, mp__curesult, cuGetProcAddress,                                        \
    (const char *, void **, int, uint64_t))                                    \
  X(cu, mp__curesult, cuGetProcAddress_v2,                                     \
    (const char *, void **, int, uint64_t, unsigned int *))                    \
  /* runtime.c */                                                              \
  X(rt, mp__cudaerr, cudaMalloc, (void **, size_t))                            \
  X(rt, mp__cudaerr, cudaFree, (void *))                                       \
  X(rt, mp__cudaerr, cudaMallocAsync, (void **, size_t, mp__custream))         \
  X(rt, mp__cudaerr, cudaMallocAsync_ptsz, (void **, size_t, mp__custream))    \
  X(rt, mp__cudaerr, cudaFreeAsync, (void *, mp__custream))                    \
  X(rt, mp__cudaerr, cudaFreeAsync_ptsz, (void *, mp__custream))               \
  X(rt, mp__cudaerr, cudaMemGetInfo, (size_t *, size_t *))                     \
  X(rt, mp__cudaerr, cudaMallocManaged, (void **, size_t, unsigned int))       \
  /* streams.c */                                                              \
  X(cu, mp__curesult, cuStreamCreate, (mp__custream *, unsigned int))          \
  X(cu, mp__curesult, cuStreamCreateWithPriority,                              \
    (mp__custream *, unsigned int, int))                                       \
  X(cu, mp__curesult, cuStreamDestroy_v2, (mp__custream))                      \
  /* graphs.c */                                                               \
  X(cu, mp__curesult, cuStreamBeginCapture, (mp__custream))                    \
  X(cu, mp__curesult, cuStreamBeginCapture_ptsz, (mp__custream))               \
  X(cu, mp__curesult, cuStreamBeginCapture_v2, (mp__custream, unsigned int))   \
  X(cu, mp__curesult, cuStreamBeginCapture_v2_ptsz,                            \
    (mp__custream, unsigned int))                                              \
  X(cu, mp__curesult, cuStreamBeginCaptureToGraph,                             \
    (mp__custream, mp__cugraph, const mp__cugraphnode *,                       \
     const mp__cugraphedgedata *, size_t, unsigned int))                       \
  X(cu, mp__curesult, cuStreamBeginCaptureToGraph_ptsz,                        \
    (mp__custream, mp__cugraph, const mp__cugraphnode *,                       \
     const mp__cugraphedgedata *, size_t, unsigned int))                       \
  X(cu, mp__curesult, cuStreamEndCapture, (mp__custream, mp__cugraph *))       \
  X(cu, mp__curesult, cuStreamEndCapture_ptsz, (mp__custream, mp__cugraph *))  \
  X(cu, mp__curesult, cuGraphInstantiate,                                      \
    (mp__cugraphexec *, mp__cugraph, mp__cugraphnode *, char *, size_t))       \
  X(cu, mp__curesult, cuGraphInstantiate_v2,                                   \
    (mp__cugraphexec *, mp__cugraph, mp__cugraphnode *, char *, size_t))       \
  X(cu, mp__curesult, cuGraphInstantiateWithFlags,                             \
    (mp__cugraphexec *, mp__cugraph, unsigned long long))                      \
  X(cu, mp__curesult, cuGraphInstantiateWithParams,                            \
    (mp__cugraphexec *, mp__cugraph, mp__cugraphparams))                       \
  X(cu, mp__curesult, cuGraphInstantiateWithParams_ptsz,                       \
    (mp__cugraphexec *, mp__cugraph, mp__cugraphparams))                       \
  X(cu, mp__curesult, cuGraphExecDestroy, (mp__cugraphexec))                   \
  X(cu, mp__curesult, cuGraphLaunch, (mp__cugraphexec, mp__custream))          \
  X(cu, mp__curesult, cuGraphLaunch_ptsz, (mp__cugraphexec, mp__custream))     \
  X(cu, mp__curesult, cuGraphDestroy, (mp__cugraph))                           \
  X(cu, mp__curesult, cuGraphClone, (mp__cugraph *, mp__cugraph))              \
  X(cu, mp__curesult, cuGraphAddChildGraphNode,                                \
    (mp__cugraphnode *, mp__cugraph, const mp__cugraphnode *, size_t,          \
     mp__cugraph))                                                             \
  X(cu, mp__curesult, cuGraphExecUpdate,                                       \
    (mp__cugraphexec, mp__cugraph, mp__cugraphnode *,                          \
     mp__cugraphupdateresult *))                                               \
  X(cu, mp__curesult, cuGraphExecUpdate_v2,                                    \
    (mp__cugraphexec, mp__cugraph, mp__cugraphupdateinfo *))                   \
  X(cu, mp__curesult, cuGraphAddNode,                                          \
    (mp__cugraphnode *, mp__cugraph, const mp__cugraphnode *, size_t,          \
     mp__cugraphnodeparams *))                                                 \
  X(cu, mp__curesult, cuGraphAddNode_v2,                                       \
    (mp__cugraphnode *, mp__cugraph, const mp__cugraphnode *,                  \
     const mp__cugraphedgedata *, size_t, mp__cugraphnodeparams *))            \
  X(cu, mp__curesult, cuGraphChildGraphNodeGetGraph,                           \
    (mp__cugraphnode, mp__cugraph *))                                          \
  X(cu, mp__curesult, cuGraphExecChildGraphNodeSetParams,                      \
    (mp__cugraphexec, mp__cugraphnode, mp__cugraph))                           \
  X(cu, mp__curesult, cuGraphExecNodeSetParams,                                \
    (mp__cugraphexec, mp__cugraphnode, mp__cugraphnodeparams *))               \
  X(cu, mp__curesult, cuGraphNodeSetParams,                                    \
    (mp__cugraphnode, mp__cugraphnodeparams *))                                \
  X(cu, mp__curesult, cuGraphNodeFindInClone,                                  \
    (mp__cugraphnode *, mp__cugraphnode, mp__cugraph))                         \
  X(cu, mp__curesult, cuGraphDestroyNode, (mp__cugraphnode))                   \
  /* host.c */                                                                 \
  X(rt, mp__cudaerr, cudaMallocHost, (void **, size_t))                        \
  X(rt, mp__cudaerr, cudaHostAlloc, (void **, size_t, unsigned int))           \
  X(rt, mp__cudaerr, cudaFreeHost, (void *))                                   \
  X(cu, mp__curesult, cuMemHostAlloc, (void **, size_t, unsigned int))         \
  X(cu, mp__curesult, cuMemAllocHost_v2, (void **, size_t))                    \
  X(cu, mp__curesult, cuMemFreeHost, (void *))                                 \
  X(cu, mp__curesult, cuMemHostGetFlags, (unsigned int *, void *))             \
  X(cu, mp__curesult, cuMemHostGetDevicePointer_v2,                            \
    (mp__cuptr *, void *, unsigned int))                                       \
  /* pause.c: not CUDA's, the shim's own (see the file) */                     \
  X(own, int, mempool_preload_pause, (unsigned))                               \
  X(own, int, mempool_preload_resume, (void))                                  \
  /* report.c: the pools' snapshot pickle, now */                              \
  X(own, int, mempool_preload_snapshot, (const char *))

#define MP__PL_REAL(X)                                                         \
  X(cu, mp__curesult, cuGetErrorName, (mp__curesult, const char **))           \
  X(cu, mp__curesult, cuCtxGetDevice, (int *))                                 \
  X(cu, mp__curesult, cuCtxGetCurrent, (mp__cuctx *))                          \
  X(cu, mp__curesult, cuDeviceGet, (int *, int))                               \
  X(cu, mp__curesult, cuDevicePrimaryCtxRetain, (mp__cuctx *, int))            \
  X(cu, mp__curesult, cuDevicePrimaryCtxRelease_v2, (int))                     \
  X(cu, mp__curesult, cuDevicePrimaryCtxGetState,                              \
    (int, unsigned int *, int *))                                              \
  X(cu, mp__curesult, cuStreamIsCapturing, (mp__custream, unsigned int *))     \
  X(cu, mp__curesult, cuStreamIsCapturing_ptsz,                                \
    (mp__custream, unsigned int *))                                            \
  X(cu, mp__curesult, cuStreamGetCaptureInfo_v2,                               \
    (mp__custream, unsigned int *, unsigned long long *, mp__cugraph *,        \
     const void **, size_t *))                                                 \
  X(cu, mp__curesult, cuStreamGetCaptureInfo_v2_ptsz,                          \
    (mp__custream, unsigned int *, unsigned long long *, mp__cugraph *,        \
     const void **, size_t *))                                                 \
  X(cu, mp__curesult, cuThreadExchangeStreamCaptureMode, (unsigned int *))     \
  X(cu, mp__curesult, cuStreamGetCtx, (mp__custream, mp__cuctx *))             \
  X(cu, mp__curesult, cuCtxPushCurrent_v2, (mp__cuctx))                        \
  X(cu, mp__curesult, cuCtxPopCurrent_v2, (mp__cuctx *))                       \
  X(cu, mp__curesult, cuStreamSynchronize, (mp__custream))                     \
  X(cu, mp__curesult, cuGraphExecGetFlags, (mp__cugraphexec, uint64_t *))      \
  X(rt, mp__cudaerr, cudaGetDevice, (int *))                                   \
  X(rt, mp__cudaerr, cudaStreamIsCapturing, (mp__custream, unsigned int *))

#endif /* MEMPOOL_PRELOAD_HOOKLIST_H */
