/* hooks.h - the entry points libmempool_preload.so exports in place of
 * CUDA's (and dlsym). Spelled with preload.h's ABI types; sigcheck.c checks
 * them against the toolkit's headers. Keep this list, exports.map and the
 * name table of lookup.c in step. */
#ifndef MEMPOOL_PRELOAD_HOOKS_H
#define MEMPOOL_PRELOAD_HOOKS_H

#include "preload.h"

#define MP__EXPORT __attribute__((visibility("default")))

/* driver.c */
MP__EXPORT mp__curesult cuMemAlloc_v2(mp__cuptr *dptr, size_t bytesize);
MP__EXPORT mp__curesult cuMemFree_v2(mp__cuptr dptr);
MP__EXPORT mp__curesult cuMemAllocAsync(mp__cuptr *dptr, size_t bytesize,
                                        mp__custream hStream);
MP__EXPORT mp__curesult cuMemAllocAsync_ptsz(mp__cuptr *dptr, size_t bytesize,
                                             mp__custream hStream);
MP__EXPORT mp__curesult cuMemFreeAsync(mp__cuptr dptr, mp__custream hStream);
MP__EXPORT mp__curesult cuMemFreeAsync_ptsz(mp__cuptr dptr,
                                            mp__custream hStream);
MP__EXPORT mp__curesult cuMemGetInfo_v2(size_t *free, size_t *total);
MP__EXPORT mp__curesult cuMemGetAddressRange_v2(mp__cuptr *pbase, size_t *psize,
                                                mp__cuptr dptr);
MP__EXPORT mp__curesult cuPointerGetAttribute(void *data,
                                              unsigned int attribute,
                                              mp__cuptr ptr);
MP__EXPORT mp__curesult cuGetProcAddress(const char *symbol, void **pfn,
                                         int cudaVersion, uint64_t flags);
MP__EXPORT mp__curesult cuGetProcAddress_v2(const char *symbol, void **pfn,
                                            int cudaVersion, uint64_t flags,
                                            unsigned int *symbolStatus);

/* runtime.c */
MP__EXPORT mp__cudaerr cudaMalloc(void **devPtr, size_t size);
MP__EXPORT mp__cudaerr cudaFree(void *devPtr);
MP__EXPORT mp__cudaerr cudaMallocAsync(void **devPtr, size_t size,
                                       mp__custream hStream);
MP__EXPORT mp__cudaerr cudaMallocAsync_ptsz(void **devPtr, size_t size,
                                            mp__custream hStream);
MP__EXPORT mp__cudaerr cudaFreeAsync(void *devPtr, mp__custream hStream);
MP__EXPORT mp__cudaerr cudaFreeAsync_ptsz(void *devPtr, mp__custream hStream);
MP__EXPORT mp__cudaerr cudaMemGetInfo(size_t *free, size_t *total);
MP__EXPORT mp__cudaerr cudaMallocManaged(void **devPtr, size_t size,
                                         unsigned int flags);

/* streams.c */
MP__EXPORT mp__curesult cuStreamCreate(mp__custream *phStream,
                                       unsigned int Flags);
MP__EXPORT mp__curesult cuStreamCreateWithPriority(mp__custream *phStream,
                                                   unsigned int flags,
                                                   int priority);
MP__EXPORT mp__curesult cuStreamDestroy_v2(mp__custream hStream);

/* graphs.c */
MP__EXPORT mp__curesult cuStreamEndCapture(mp__custream hStream,
                                           mp__cugraph *phGraph);
MP__EXPORT mp__curesult cuStreamEndCapture_ptsz(mp__custream hStream,
                                                mp__cugraph *phGraph);
MP__EXPORT mp__curesult cuGraphInstantiateWithFlags(
    mp__cugraphexec *phGraphExec, mp__cugraph hGraph, unsigned long long flags);
MP__EXPORT mp__curesult cuGraphInstantiateWithParams(
    mp__cugraphexec *phGraphExec, mp__cugraph hGraph, mp__cugraphparams params);
MP__EXPORT mp__curesult cuGraphInstantiateWithParams_ptsz(
    mp__cugraphexec *phGraphExec, mp__cugraph hGraph, mp__cugraphparams params);
MP__EXPORT mp__curesult cuGraphExecDestroy(mp__cugraphexec hGraphExec);
MP__EXPORT mp__curesult cuGraphDestroy(mp__cugraph hGraph);

/* pause.c: not CUDA's, the shim's own (see the file) */
MP__EXPORT int mempool_preload_pause(unsigned flags);
MP__EXPORT int mempool_preload_resume(void);
/* record.c: the pool's snapshot pickle, now */
MP__EXPORT int mempool_preload_snapshot(const char *path);

/* host.c */
MP__EXPORT mp__cudaerr cudaMallocHost(void **ptr, size_t size);
MP__EXPORT mp__cudaerr cudaHostAlloc(void **pHost, size_t size,
                                     unsigned int flags);
MP__EXPORT mp__cudaerr cudaFreeHost(void *ptr);
MP__EXPORT mp__curesult cuMemHostAlloc(void **pp, size_t bytesize,
                                       unsigned int Flags);
MP__EXPORT mp__curesult cuMemAllocHost_v2(void **pp, size_t bytesize);
MP__EXPORT mp__curesult cuMemFreeHost(void *p);

#endif /* MEMPOOL_PRELOAD_HOOKS_H */
