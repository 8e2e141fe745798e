/* lookup.c - dlsym and cuGetProcAddress: which names resolve to the shim.
 *
 * Programs reach the driver three ways: direct calls (bound to the shim by
 * LD_PRELOAD), dlsym on libcuda's handle (how the shared and the static
 * runtime start: dlopen("libcuda.so.1") then dlsym(h, "cuGetProcAddress_v2"))
 * and cuGetProcAddress (how the runtime then resolves every other entry
 * point, cuGetProcAddress itself included). This file answers the last two.
 *
 * dlsym is replaced by a function that stays cheap and predictable:
 *  - it only ever compares the name with the exact names of hooklist.h;
 *  - RTLD_NEXT lookups are never touched, and reach glibc by a tail call so
 *    that glibc still sees the original caller's return address and
 *    searches after the caller, not after the shim (the file is always built
 *    optimised for that; tests/preload checks it);
 *  - a hooked name resolves to the shim only when glibc finds it in the
 *    handle asked, so a library that lacks the symbol still lacks it;
 *  - lookups made from inside the shim itself go to glibc untouched. That is
 *    how mempool's cuda backend, compiled into the shim, gets the driver's
 *    real functions from its own dlopen handle (and the real
 *    cuGetProcAddress from there) without ever meeting a hook.
 * A sanitizer runtime preloaded before the shim (ASan, TSan: a sanitized
 * shim needs its runtime first in LD_PRELOAD) resolves its interceptors'
 * real functions with dlsym(RTLD_NEXT, ...) while it starts, before its
 * shadow memory and interceptors work: the path those lookups take here
 * calls nothing a sanitizer intercepts (no pthread_once, and the shim's
 * range comes from the linker, not from dl_iterate_phdr: real.c) and is built
 * without ASan's and TSan's instrumentation (MP__UNSANITIZED, which changes
 * nothing in other builds).
 * cuGetProcAddress asks the real driver first and only swaps the answer for
 * the shim's function when the driver found the variant the shim replaces
 * (cuMemAlloc at 3.2 or later is cuMemAlloc_v2, flags with the per-thread
 * bit select the _ptsz forms, cuGetProcAddress at 12.0 or later is _v2), so
 * versions and flags mean what the driver says they mean. */
/* dlfcn.h marks dlsym's name nonnull, which would let the compiler drop
 * the NULL check of the replacement below: its declaration is renamed away
 * while the header is read. */
#define dlsym mp__dlsym_as_glibc_declares_it
#include <dlfcn.h>
#undef dlsym
#include <string.h>

#include "hooks.h"

MP__EXPORT void *dlsym(void *handle, const char *name);

typedef struct mp__hook_name {
  const char *name;
  void *fn;
} mp__hook_name_t;

/* Every CUDA hook of hooklist.h (not the shim's own exports). */
#define MP__PL_NAMED(lib, result, name, params) MP__PL_NAMED_##lib(name)
#define MP__PL_NAMED_cu(name)                   {#name, (void *)&name},
#define MP__PL_NAMED_rt(name)                   {#name, (void *)&name},
#define MP__PL_NAMED_own(name)
static const mp__hook_name_t mp__hooks[] = {MP__PL_HOOKS(MP__PL_NAMED)};
#undef MP__PL_NAMED

/* Every hooked name starts "cu"; most names a program looks up do not, so
 * the common case costs two byte compares. */
MP__UNSANITIZED static void *mp__hook_for(const char *name) {
  if (name[0] != 'c' || name[1] != 'u')
    return NULL;
  for (size_t i = 0; i < sizeof mp__hooks / sizeof *mp__hooks; i++)
    if (strcmp(name, mp__hooks[i].name) == 0)
      return mp__hooks[i].fn;
  return NULL;
}

MP__UNSANITIZED void *dlsym(void *handle, const char *name) {
  mp__dlsym_fn real = mp__pl_glibc_dlsym();
  if (MP__UNLIKELY(real == NULL))
    return NULL;
  if (handle != RTLD_NEXT && name != NULL) {
    void *hook = mp__hook_for(name);
    if (hook != NULL && !mp__pl_from_self(__builtin_return_address(0)))
      return real(handle, name) != NULL ? hook : NULL;
  }
  return real(handle, name); /* a tail call: see the top of the file */
}

/* ---- cuGetProcAddress ------------------------------------------------- */

void *mp__pl_proc_hook(const char *symbol, int cuda_version, uint64_t flags) {
  bool ptsz = (flags & MP__CU_PROC_PER_THREAD) != 0;
  /* The _v2 forms of these came with CUDA 3.2 (64-bit CUdeviceptr); below
   * that the driver answers with the 32-bit originals, which stay real. */
  if (cuda_version >= 3020) {
    if (strcmp(symbol, "cuMemAlloc") == 0)
      return (void *)&cuMemAlloc_v2;
    if (strcmp(symbol, "cuMemFree") == 0)
      return (void *)&cuMemFree_v2;
    if (strcmp(symbol, "cuMemGetInfo") == 0)
      return (void *)&cuMemGetInfo_v2;
    if (strcmp(symbol, "cuMemGetAddressRange") == 0)
      return (void *)&cuMemGetAddressRange_v2;
    /* cudaTypedefs.h: PFN_cuMemAllocHost_v3020 takes a size_t, the
     * original (v2000) an unsigned int. */
    if (strcmp(symbol, "cuMemAllocHost") == 0)
      return (void *)&cuMemAllocHost_v2;
  }
  /* Page-locked memory (host.c): what the host pool hands out is freed
   * through the same answers, never the driver's cuMemFreeHost (which
   * would free the pool's chunk under it); PFN_cuMemHostAlloc_v2020 and
   * PFN_cuMemFreeHost_v2000 are the only forms. */
  if (strcmp(symbol, "cuMemHostAlloc") == 0)
    return (void *)&cuMemHostAlloc;
  if (strcmp(symbol, "cuMemFreeHost") == 0)
    return (void *)&cuMemFreeHost;
  /* Its flags are the request's, not the pool chunk's (host.c);
   * PFN_cuMemHostGetFlags_v2030 is the only form. */
  if (strcmp(symbol, "cuMemHostGetFlags") == 0)
    return (void *)&cuMemHostGetFlags;
  /* A freed block has none (host.c); cudaHostGetDevicePointer asks for
   * it. cudaTypedefs.h: PFN_cuMemHostGetDevicePointer_v3020 (64-bit
   * CUdeviceptr); below 3.2 the original, left real. */
  if (cuda_version >= 3020 && strcmp(symbol, "cuMemHostGetDevicePointer") == 0)
    return (void *)&cuMemHostGetDevicePointer_v2;
  /* cuDevicePrimaryCtxReset_v2 came with CUDA 11.0 (cudaTypedefs.h:
   * PFN_cuDevicePrimaryCtxReset_v11000; below it the original, _v7000,
   * hooked as well); cudaDeviceReset asks for it. */
  if (strcmp(symbol, "cuDevicePrimaryCtxReset") == 0)
    return cuda_version >= 11000 ? (void *)&cuDevicePrimaryCtxReset_v2
                                 : (void *)&cuDevicePrimaryCtxReset;
  /* cuStreamDestroy_v2 came with CUDA 4.0. */
  if (cuda_version >= 4000 && strcmp(symbol, "cuStreamDestroy") == 0)
    return (void *)&cuStreamDestroy_v2;
  if (strcmp(symbol, "cuStreamCreate") == 0)
    return (void *)&cuStreamCreate;
  if (strcmp(symbol, "cuPointerGetAttribute") == 0)
    return (void *)&cuPointerGetAttribute;
  if (strcmp(symbol, "cuPointerGetAttributes") == 0)
    return (void *)&cuPointerGetAttributes;
  if (strcmp(symbol, "cuIpcGetMemHandle") == 0)
    return (void *)&cuIpcGetMemHandle;
  if (strcmp(symbol, "cuStreamCreateWithPriority") == 0)
    return (void *)&cuStreamCreateWithPriority;
  if (strcmp(symbol, "cuMemAllocAsync") == 0)
    return ptsz ? (void *)&cuMemAllocAsync_ptsz : (void *)&cuMemAllocAsync;
  if (strcmp(symbol, "cuMemFreeAsync") == 0)
    return ptsz ? (void *)&cuMemFreeAsync_ptsz : (void *)&cuMemFreeAsync;
  /* cudaTypedefs.h: PFN_cuStreamBeginCapture_v10010 takes the mode; the
   * original (v10000) does not. A driver without the original's _ptsz
   * form answers with the plain one, and so does the shim. */
  if (cuda_version >= 10010 && strcmp(symbol, "cuStreamBeginCapture") == 0)
    return ptsz ? (void *)&cuStreamBeginCapture_v2_ptsz
                : (void *)&cuStreamBeginCapture_v2;
  if (strcmp(symbol, "cuStreamBeginCapture") == 0)
    return ptsz && mp__pl_real_cuda()->cuStreamBeginCapture_ptsz != NULL
               ? (void *)&cuStreamBeginCapture_ptsz
               : (void *)&cuStreamBeginCapture;
  /* cudaTypedefs.h: PFN_cuStreamBeginCaptureToGraph_v12030 (and _ptsz),
   * its only form, new in CUDA 12.3. */
  if (cuda_version >= 12030 &&
      strcmp(symbol, "cuStreamBeginCaptureToGraph") == 0)
    return ptsz ? (void *)&cuStreamBeginCaptureToGraph_ptsz
                : (void *)&cuStreamBeginCaptureToGraph;
  if (strcmp(symbol, "cuStreamEndCapture") == 0)
    return ptsz ? (void *)&cuStreamEndCapture_ptsz
                : (void *)&cuStreamEndCapture;
  /* cuGraphInstantiate at 12.0 or later is the flags form (cuda.h); below
   * it takes an error node and a log buffer (cudaTypedefs.h:
   * PFN_cuGraphInstantiate_v11000, and _v10000 before 11.0). */
  if (strcmp(symbol, "cuGraphInstantiateWithFlags") == 0 ||
      (cuda_version >= 12000 && strcmp(symbol, "cuGraphInstantiate") == 0))
    return (void *)&cuGraphInstantiateWithFlags;
  if (strcmp(symbol, "cuGraphInstantiate") == 0)
    return cuda_version >= 11000 ? (void *)&cuGraphInstantiate_v2
                                 : (void *)&cuGraphInstantiate;
  if (strcmp(symbol, "cuGraphInstantiateWithParams") == 0)
    return ptsz ? (void *)&cuGraphInstantiateWithParams_ptsz
                : (void *)&cuGraphInstantiateWithParams;
  if (strcmp(symbol, "cuGraphExecDestroy") == 0)
    return (void *)&cuGraphExecDestroy;
  /* cudaTypedefs.h: PFN_cuGraphLaunch_v10000 and its _ptsz, the only forms
   * (cudaGraphLaunch asks for it). */
  if (strcmp(symbol, "cuGraphLaunch") == 0)
    return ptsz ? (void *)&cuGraphLaunch_ptsz : (void *)&cuGraphLaunch;
  if (strcmp(symbol, "cuGraphDestroy") == 0)
    return (void *)&cuGraphDestroy;
  /* cudaTypedefs.h: PFN_cuGraphClone_v10000 and
   * PFN_cuGraphAddChildGraphNode_v10000, the only forms; cuGraphExecUpdate
   * at 12.0 or later is the form with a result info
   * (PFN_cuGraphExecUpdate_v12000), below it the one with an error node
   * and a result (_v10020). */
  if (strcmp(symbol, "cuGraphClone") == 0)
    return (void *)&cuGraphClone;
  if (strcmp(symbol, "cuGraphAddChildGraphNode") == 0)
    return (void *)&cuGraphAddChildGraphNode;
  if (strcmp(symbol, "cuGraphExecUpdate") == 0)
    return cuda_version >= 12000 ? (void *)&cuGraphExecUpdate_v2
                                 : (void *)&cuGraphExecUpdate;
  /* cudaTypedefs.h: PFN_cuGraphAddNode_v12020, and _v12030 with edge data
   * (cuda.h's cuGraphAddNode_v2) at 12.3 or later;
   * PFN_cuGraphChildGraphNodeGetGraph_v10000,
   * PFN_cuGraphExecChildGraphNodeSetParams_v11010 and
   * PFN_cuGraphExecNodeSetParams_v12020 and
   * PFN_cuGraphNodeSetParams_v12020 and PFN_cuGraphNodeFindInClone_v10000,
   * the only forms (cudaGraphNodeSetParams and cudaGraphNodeFindInClone ask
   * for the last two). */
  if (strcmp(symbol, "cuGraphAddNode") == 0)
    return cuda_version >= 12030 ? (void *)&cuGraphAddNode_v2
                                 : (void *)&cuGraphAddNode;
  if (strcmp(symbol, "cuGraphChildGraphNodeGetGraph") == 0)
    return (void *)&cuGraphChildGraphNodeGetGraph;
  if (strcmp(symbol, "cuGraphExecChildGraphNodeSetParams") == 0)
    return (void *)&cuGraphExecChildGraphNodeSetParams;
  if (strcmp(symbol, "cuGraphExecNodeSetParams") == 0)
    return (void *)&cuGraphExecNodeSetParams;
  if (strcmp(symbol, "cuGraphNodeSetParams") == 0)
    return (void *)&cuGraphNodeSetParams;
  if (strcmp(symbol, "cuGraphNodeFindInClone") == 0)
    return (void *)&cuGraphNodeFindInClone;
  /* cudaTypedefs.h: PFN_cuGraphDestroyNode_v10000, the only form
   * (cudaGraphDestroyNode asks for it). */
  if (strcmp(symbol, "cuGraphDestroyNode") == 0)
    return (void *)&cuGraphDestroyNode;
  if (strcmp(symbol, "cuGetProcAddress") == 0)
    return cuda_version >= 12000 ? (void *)&cuGetProcAddress_v2
                                 : (void *)&cuGetProcAddress;
  return NULL;
}

/* The real driver's answer r, with the shim's function in place of the
 * one it replaces. */
static mp__curesult mp__swap_answer(mp__curesult r, const char *symbol,
                                    void **pfn, int cuda_version,
                                    uint64_t flags) {
  if (r == MP__CU_SUCCESS && symbol != NULL && pfn != NULL && *pfn != NULL) {
    void *hook = mp__pl_proc_hook(symbol, cuda_version, flags);
    if (hook != NULL)
      *pfn = hook;
  }
  return r;
}

mp__curesult cuGetProcAddress_v2(const char *symbol, void **pfn,
                                 int cudaVersion, uint64_t flags,
                                 unsigned int *symbolStatus) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  if (rc->cuGetProcAddress_v2 != NULL)
    return mp__swap_answer(
        rc->cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus),
        symbol, pfn, cudaVersion, flags);
  if (rc->cuGetProcAddress != NULL)
    return mp__swap_answer(
        rc->cuGetProcAddress(symbol, pfn, cudaVersion, flags), symbol, pfn,
        cudaVersion, flags);
  return MP__CU_NOT_INITIALIZED;
}

mp__curesult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                              uint64_t flags) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  if (rc->cuGetProcAddress != NULL)
    return mp__swap_answer(
        rc->cuGetProcAddress(symbol, pfn, cudaVersion, flags), symbol, pfn,
        cudaVersion, flags);
  return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}
