/* Contexts as the fake driver keeps CUDA's rules (cuda.h, "Context
 * Management", "Primary Context Management"): a context made with
 * cuCtxCreate has its own streams, memory and work; each device of
 * FAKECUDA_DEVICE_COUNT has its own primary context; cuDevicePrimaryCtxReset
 * destroys what the context held; a destroyed context is invalid. */
#include <stdatomic.h>
#include <unistd.h>

#include <cuda.h>

#include "fakecuda_test.h"

/* The fake's hook, weak: tests/gpu runs this file against a real
 * libcuda.so.1 too (gpu_twin.sh), where it is absent and fk_real() holds;
 * what only the fake promises is then skipped. */
long long cuFakeGetErrorCount(CUresult code) __attribute__((weak));
static bool fk_real(void) {
  return cuFakeGetErrorCount == NULL;
}

static void two_devices(void) {
  if (!fk_real())
    cr_assert_eq(setenv("FAKECUDA_DEVICE_COUNT", "2", 1), 0);
  cr_assert_eq(cuInit(0), CUDA_SUCCESS);
}

TestSuite(fakecuda_contexts, .init = two_devices);

/* A kernel held until the test opens its gate (30 s at most), that then
 * raises its flag. It slept 150 ms instead, which a loaded machine's test
 * thread could outlast before it looked: the work then seemed waited for. */
typedef struct {
  atomic_int gate, flag;
} held_t;

static void held_set(void *p) {
  held_t *h = p;
  for (int ms = 0; ms < 30000 && !atomic_load(&h->gate); ms++)
    usleep(1000);
  atomic_store(&h->flag, 1);
}

static CUcontext primary(int dev) {
  CUcontext c;
  cr_assert_eq(cuDevicePrimaryCtxRetain(&c, dev), CUDA_SUCCESS);
  return c;
}

/* Work in `busy`'s stream; with `other` current, cuCtxSynchronize must not
 * wait for it and the stream is not a stream of `other`. */
static void contexts_are_apart(CUcontext busy, CUcontext other) {
  cr_assert_eq(cuCtxPushCurrent(busy), CUDA_SUCCESS);
  CUstream s;
  cr_assert_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  static held_t held;
  atomic_store(&held.gate, 0);
  atomic_store(&held.flag, 0);
  cr_assert_eq(cuLaunchHostFunc(s, held_set, &held), CUDA_SUCCESS);
  cr_assert_eq(cuCtxPushCurrent(other), CUDA_SUCCESS);
  cr_assert_eq(cuCtxSynchronize(), CUDA_SUCCESS);
  cr_assert_eq(atomic_load(&held.flag), 0, "another context's work was waited");
  /* The fake refuses another context's stream; an H200 (driver 580.159.04,
   * 2026-11-28) synchronized it, and answered cuStreamGetFlags for it. */
  if (!fk_real())
    cr_assert_eq(cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
  /* Asked about, the stream is answered from any context (cuda.h,
   * cuStreamGetCtx: "Returns the CUDA context that the stream is associated
   * with"): the fake answered only for other devices' primary contexts'
   * streams, and refused a made context's. */
  CUcontext owner = NULL;
  CUstreamCaptureStatus cap = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  unsigned int flags = 0;
  cr_assert_eq(cuStreamGetCtx(s, &owner), CUDA_SUCCESS);
  cr_assert_eq(owner, busy);
  cr_assert_eq(cuStreamIsCapturing(s, &cap), CUDA_SUCCESS);
  cr_assert_eq(cap, CU_STREAM_CAPTURE_STATUS_NONE);
  cr_assert_eq(cuStreamGetFlags(s, &flags), CUDA_SUCCESS);
  cr_assert_eq(flags, CU_STREAM_NON_BLOCKING);
  cr_assert_eq(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
  atomic_store(&held.gate, 1);
  cr_assert_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
  cr_assert_eq(atomic_load(&held.flag), 1);
  cr_assert_eq(cuStreamDestroy(s), CUDA_SUCCESS);
  cr_assert_eq(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
}

Test(fakecuda_contexts, a_created_context_has_its_own_streams_and_work) {
  CUcontext p = primary(0), c;
  cr_assert_eq(cuCtxCreate(&c, NULL, 0, 0), CUDA_SUCCESS);
  CUcontext cur;
  cr_assert_eq(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
  cr_assert_eq(cur, c, "cuCtxCreate makes the new context current");
  cr_assert_eq(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
  contexts_are_apart(p, c);
  contexts_are_apart(c, p);
  cr_assert_eq(cuCtxDestroy(c), CUDA_SUCCESS);
  cr_assert_eq(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
}

Test(fakecuda_contexts, each_device_has_its_own_primary_context) {
  int n = 0;
  cr_assert_eq(cuDeviceGetCount(&n), CUDA_SUCCESS);
  if (fk_real() && n < 2)
    cr_skip_test("one GPU");
  cr_assert_eq(n, fk_real() ? n : 2);
  CUcontext a = primary(0), b = primary(1);
  cr_assert_neq(a, b);
  cr_assert_eq(cuCtxPushCurrent(b), CUDA_SUCCESS);
  CUdevice d = -1;
  cr_assert_eq(cuCtxGetDevice(&d), CUDA_SUCCESS);
  cr_assert_eq(d, 1);
  cr_assert_eq(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
  contexts_are_apart(a, b);
  contexts_are_apart(b, a);
  cr_assert_eq(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
  cr_assert_eq(cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
}

Test(fakecuda_contexts, primary_context_reset_destroys_what_it_held) {
  CUcontext p = primary(0);
  cr_assert_eq(cuCtxPushCurrent(p), CUDA_SUCCESS);
  CUdeviceptr mem;
  CUstream s;
  cr_assert_eq(cuMemAlloc(&mem, 4096), CUDA_SUCCESS);
  cr_assert_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  cr_assert_eq(cuDevicePrimaryCtxReset(0), CUDA_SUCCESS);
  unsigned flags;
  int active = 1;
  cr_assert_eq(cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
  cr_assert_eq(active, 0);
  /* The fake's answer; an H200 (driver 580.159.04, 2026-11-28) answered
   * otherwise (the code was not kept): a reset context left current is not
   * something the library relies on. */
  if (!fk_real())
    cr_assert_eq(cuMemAlloc(&mem, 64), CUDA_ERROR_INVALID_CONTEXT);
  cr_assert_eq(cuDevicePrimaryCtxRetain(&p, 0), CUDA_SUCCESS);
  if (fk_real()) /* stale handles: undefined on a real driver */
    return;
  cr_assert_eq(cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
  cr_assert_eq(cuMemGetAddressRange(NULL, NULL, mem), CUDA_ERROR_NOT_FOUND);
  cr_assert_eq(cuMemFree(mem), CUDA_ERROR_INVALID_VALUE);
  cr_assert_eq(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
  cr_assert_eq(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
}

/* cuda.h, cuDevicePrimaryCtxReset: "Resetting the primary context does not
 * release it, an application that has retained the primary context should
 * explicitly release its usage", and "it is safe for other modules to call
 * cuDevicePrimaryCtxRelease() even after resetting the device": every
 * retain before the reset is still released (the shim's pool holds one). */
Test(fakecuda_contexts, a_reset_does_not_release_the_primary_context) {
  CUcontext p = primary(0);
  CUcontext q;
  cr_assert_eq(cuDevicePrimaryCtxRetain(&q, 0), CUDA_SUCCESS);
  cr_assert_eq(cuDevicePrimaryCtxReset(0), CUDA_SUCCESS);
  cr_assert_eq(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
  cr_assert_eq(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
  /* Used again after the reset: a retain makes it anew, and its release
   * is the last. */
  cr_assert_eq(cuDevicePrimaryCtxRetain(&p, 0), CUDA_SUCCESS);
  cr_assert_eq(cuCtxPushCurrent(p), CUDA_SUCCESS);
  CUdeviceptr mem;
  cr_assert_eq(cuMemAlloc(&mem, 4096), CUDA_SUCCESS);
  cr_assert_eq(cuMemFree(mem), CUDA_SUCCESS);
  cr_assert_eq(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
  cr_assert_eq(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
}

Test(fakecuda_contexts, a_destroyed_context_is_invalid) {
  /* On the last device: 1 on the fake's two, 0 on a one-GPU machine (an
   * H200 refused device 1, which it does not have, 2026-11-28). */
  int n = 0;
  CUdevice last;
  cr_assert_eq(cuDeviceGetCount(&n), CUDA_SUCCESS);
  cr_assert_eq(cuDeviceGet(&last, n - 1), CUDA_SUCCESS);
  CUcontext c;
  cr_assert_eq(cuCtxCreate(&c, NULL, 0, last), CUDA_SUCCESS);
  CUdeviceptr mem;
  cr_assert_eq(cuMemAlloc(&mem, 4096), CUDA_SUCCESS);
  cr_assert_eq(cuCtxDestroy(c), CUDA_SUCCESS);
  CUcontext cur = c;
  cr_assert_eq(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
  cr_assert_null(cur, "the destroyed current context was not popped");
  if (fk_real()) /* a destroyed handle: undefined on a real driver */
    return;
  cr_assert_eq(cuCtxDestroy(c), CUDA_ERROR_INVALID_CONTEXT);
  /* No context to make current (cuda.h, cuCtxPushCurrent:
   * CUDA_ERROR_INVALID_CONTEXT; test_fakecuda_push_checks_the_context.c). */
  cr_assert_eq(cuCtxPushCurrent(c), CUDA_ERROR_INVALID_CONTEXT);
  /* One still current when destroyed stays current, dead (cuda.h,
   * cuCtxDestroy: "attempting to access ctx from those threads" fails):
   * here current twice, of which the destroy pops one. */
  CUcontext d;
  cr_assert_eq(cuCtxCreate(&d, NULL, 0, last), CUDA_SUCCESS);
  cr_assert_eq(cuCtxPushCurrent(d), CUDA_SUCCESS);
  cr_assert_eq(cuCtxDestroy(d), CUDA_SUCCESS);
  cr_assert_eq(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
  cr_assert_eq(cur, d);
  cr_assert_eq(cuMemAlloc(&mem, 64), CUDA_ERROR_INVALID_CONTEXT);
  cr_assert_eq(cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
  cr_assert_eq(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
  CUcontext p = primary(0);
  cr_assert_eq(cuCtxDestroy(p), CUDA_ERROR_INVALID_CONTEXT,
               "a primary context is released, not destroyed");
  cr_assert_eq(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
}

static int ordinal_of(CUdeviceptr p) {
  int ord = -1;
  cr_assert_eq(
      cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p),
      CUDA_SUCCESS);
  return ord;
}

/* cuda.h, cuMemAllocAsync: "The allocation comes from the memory pool
 * current to the stream's device", whatever context is current; and
 * cuMemFreeAsync takes any stream as the one "establishing the stream
 * ordering contract": another device's memory is freed on it. The fake
 * refused both with CUDA_ERROR_INVALID_HANDLE. */
Test(fakecuda_contexts, stream_ordered_calls_follow_the_streams_device) {
  /* Device 1 must exist: on a one-GPU machine (the GPU twin) its primary
   * context is CUDA_ERROR_INVALID_DEVICE (cuda.h, cuDevicePrimaryCtxRetain
   * lists it; cuDeviceGetCount says how many there are). */
  int n = 0;
  cr_assert_eq(cuDeviceGetCount(&n), CUDA_SUCCESS);
  if (fk_real() && n < 2)
    cr_skip_test("one GPU");
  CUcontext c0 = primary(0), c1 = primary(1);
  CUstream s0, s1;
  cr_assert_eq(cuCtxSetCurrent(c1), CUDA_SUCCESS);
  cr_assert_eq(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  cr_assert_eq(cuCtxSetCurrent(c0), CUDA_SUCCESS);
  cr_assert_eq(cuStreamCreate(&s0, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  CUdeviceptr on1 = 0, on0 = 0;
  cr_assert_eq(cuMemAllocAsync(&on1, 1 << 20, s1), CUDA_SUCCESS);
  cr_assert_eq(cuMemAllocAsync(&on0, 1 << 20, s0), CUDA_SUCCESS);
  CUcontext now = NULL;
  cr_assert_eq(cuCtxGetCurrent(&now), CUDA_SUCCESS);
  cr_assert_eq(now, c0, "the current context changed");
  cr_assert_eq(ordinal_of(on1), 1);
  cr_assert_eq(ordinal_of(on0), 0);
  /* Each freed on the other device's stream. */
  cr_assert_eq(cuMemFreeAsync(on1, s0), CUDA_SUCCESS);
  cr_assert_eq(cuMemFreeAsync(on0, s1), CUDA_SUCCESS);
  cr_assert_eq(cuStreamSynchronize(s0), CUDA_SUCCESS);
  cr_assert_eq(cuCtxSetCurrent(c1), CUDA_SUCCESS);
  cr_assert_eq(cuStreamSynchronize(s1), CUDA_SUCCESS);
  cr_assert_eq(cuStreamDestroy(s1), CUDA_SUCCESS);
  cr_assert_eq(cuCtxSetCurrent(c0), CUDA_SUCCESS);
  cr_assert_eq(cuStreamDestroy(s0), CUDA_SUCCESS);
  if (!fk_real()) /* both gone: a second free is refused */
    cr_assert_eq(cuMemFree(on1), CUDA_ERROR_INVALID_VALUE);
  cr_assert_eq(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
  cr_assert_eq(cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
}

/* Page-locked memory is every context's (cuda.h, cuMemAllocHost: it is
 * "immediately accessible to all contexts on all devices which support
 * unified addressing"): with another device's context current,
 * cuMemFreeHost frees it (in the context that made it), as cuMemFree frees
 * another device's memory, and its flags and device pointer are found from
 * any address inside it. The fake refused the free (it looked for the
 * memory in the current context only). */
Test(fakecuda_contexts, page_locked_memory_is_freed_from_another_context) {
  int n = 0;
  cr_assert_eq(cuDeviceGetCount(&n), CUDA_SUCCESS);
  if (fk_real() && n < 2)
    cr_skip_test("one GPU");
  CUcontext a = primary(0), b = primary(1);
  cr_assert_eq(cuCtxPushCurrent(a), CUDA_SUCCESS);
  void *p = NULL, *q = NULL;
  cr_assert_eq(cuMemHostAlloc(&p, 8192, CU_MEMHOSTALLOC_DEVICEMAP),
               CUDA_SUCCESS);
  cr_assert_eq(cuMemAllocHost(&q, 8192), CUDA_SUCCESS);
  cr_assert_eq(cuCtxPushCurrent(b), CUDA_SUCCESS);
  unsigned flags = 0;
  cr_assert_eq(cuMemHostGetFlags(&flags, (char *)p + 100), CUDA_SUCCESS);
  cr_assert(flags & CU_MEMHOSTALLOC_DEVICEMAP, "flags %#x", flags);
  CUdeviceptr d = 0;
  cr_assert_eq(cuMemHostGetDevicePointer(&d, (char *)p + 100, 0), CUDA_SUCCESS);
  cr_assert_neq(d, 0);
  cr_assert_eq(cuMemFreeHost(p), CUDA_SUCCESS,
               "page-locked memory of device 0 not freed from device 1");
  cr_assert_eq(cuMemFreeHost(q), CUDA_SUCCESS);
  if (!fk_real()) { /* a second free: the fake's answer */
    cr_assert_eq(cuMemFreeHost(p), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuMemHostGetFlags(&flags, p), CUDA_ERROR_INVALID_VALUE);
  }
  cr_assert_eq(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
  cr_assert_eq(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
  cr_assert_eq(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
  cr_assert_eq(cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
}

/* With context a pushed, two page-aligned ranges of bytes registered
 * DEVICEMAP: *own without PORTABLE, *all with it. */
static void register_own_and_all(CUcontext a, size_t bytes, unsigned char **own,
                                 unsigned char **all) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  *own = aligned_alloc(page, bytes);
  *all = aligned_alloc(page, bytes);
  cr_assert(*own != NULL && *all != NULL);
  cr_assert_eq(cuCtxPushCurrent(a), CUDA_SUCCESS);
  cr_assert_eq(cuMemHostRegister(*own, bytes, CU_MEMHOSTREGISTER_DEVICEMAP),
               CUDA_SUCCESS);
  cr_assert_eq(cuMemHostRegister(*all, bytes,
                                 CU_MEMHOSTREGISTER_DEVICEMAP |
                                     CU_MEMHOSTREGISTER_PORTABLE),
               CUDA_SUCCESS);
}

/* register_own_and_all undone, with its context current; both devices'
 * primary contexts released. */
static void unregister_own_and_all(unsigned char *own, unsigned char *all) {
  cr_assert_eq(cuMemHostUnregister(own), CUDA_SUCCESS);
  cr_assert_eq(cuMemHostUnregister(all), CUDA_SUCCESS);
  cr_assert_eq(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
  cr_assert_eq(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
  cr_assert_eq(cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
  free(own);
  free(all);
}

/* cuda.h, cuMemHostRegister: "CU_MEMHOSTREGISTER_PORTABLE: The memory
 * returned by this call will be considered as pinned memory by all CUDA
 * contexts, not just the one that performed the allocation", and a
 * DEVICEMAP failure "is deferred to cuMemHostGetDevicePointer() because the
 * memory may be mapped into other CUDA contexts via the
 * CU_MEMHOSTREGISTER_PORTABLE flag": registered without it, memory is
 * pinned and mapped in the registering context only, so with another
 * context current it is no "mapped, pinned host buffer"
 * (cuMemHostGetDevicePointer, CUDA_ERROR_INVALID_VALUE; the fake's answer,
 * a GPU's not asked). Registered PORTABLE, every context has its device
 * pointer. (Unlike cuMemHostAlloc's memory, which with unified addressing
 * is every context's "regardless of whether or not the flags
 * CU_MEMHOSTALLOC_PORTABLE and CU_MEMHOSTALLOC_DEVICEMAP are specified",
 * cuda.h "Unified Addressing"; registered memory is one of that section's
 * exceptions.) Before, the fake gave the pointer in any context. */
Test(fakecuda_contexts,
     registered_memory_is_the_registering_contexts_unless_portable) {
  int n = 0;
  cr_assert_eq(cuDeviceGetCount(&n), CUDA_SUCCESS);
  if (fk_real() && n < 2)
    cr_skip_test("one GPU");
  CUcontext a = primary(0), b = primary(1);
  size_t bytes = 2 * (size_t)sysconf(_SC_PAGESIZE);
  unsigned char *own = NULL, *all = NULL;
  register_own_and_all(a, bytes, &own, &all);
  CUdeviceptr d = 0;
  cr_assert_eq(cuMemHostGetDevicePointer(&d, own + 8, 0), CUDA_SUCCESS,
               "in the registering context");
  cr_assert_eq(cuCtxPushCurrent(b), CUDA_SUCCESS);
  if (!fk_real()) {
    d = 0;
    cr_assert_eq(cuMemHostGetDevicePointer(&d, own + 8, 0),
                 CUDA_ERROR_INVALID_VALUE,
                 "a registration without PORTABLE mapped in another context");
    cr_assert_eq(d, 0, "a refused call wrote the pointer");
  }
  cr_assert_eq(cuMemHostGetDevicePointer(&d, all + 8, 0), CUDA_SUCCESS,
               "a PORTABLE registration in another context");
  cr_assert_neq(d, 0);
  cr_assert_eq(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
  unregister_own_and_all(own, all);
}

/* cuda.h, cuMemHostRegister: registered without CU_MEMHOSTREGISTER_PORTABLE,
 * memory is pinned and mapped "for the device(s)" by the registering context
 * only (the PORTABLE flag makes it "pinned memory by all CUDA contexts, not
 * just the one that performed the allocation"); to another context, of
 * another device or of the same one, it is plain pageable host memory. No
 * device reads pageable memory itself without
 * CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS ("without calling
 * cudaHostRegister on it"), so a memset of it there, whose dstDevice must be
 * a "Destination device pointer" (cuMemsetD8, cuMemsetD8Async), is
 * CUDA_ERROR_INVALID_VALUE, writing nothing. Copies take it as pageable
 * memory (cuMemcpy "infers the type of the transfer ... from the pointer
 * values"). A PORTABLE registration, and cuMemHostAlloc's memory (every
 * context's, cuda.h "Unified Addressing"), is set from any context. Before,
 * the fake ran the memset in every context. */
Test(fakecuda_contexts,
     another_context_cannot_memset_memory_registered_without_portable) {
  int n = 0, pageable = 0;
  cr_assert_eq(cuDeviceGetCount(&n), CUDA_SUCCESS);
  if (fk_real() && n < 2)
    cr_skip_test("one GPU");
  cr_assert_eq(cuDeviceGetAttribute(
                   &pageable, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, 1),
               CUDA_SUCCESS);
  if (pageable)
    cr_skip_test("the device reads pageable memory itself");
  CUcontext a = primary(0), b = primary(1), c = NULL;
  size_t page = (size_t)sysconf(_SC_PAGESIZE), bytes = 2 * page;
  unsigned char *own = NULL, *all = NULL;
  register_own_and_all(a, bytes, &own, &all);
  CUdeviceptr o = (CUdeviceptr)(uintptr_t)own, l = (CUdeviceptr)(uintptr_t)all;
  void *pin = NULL;
  cr_assert_eq(cuMemHostAlloc(&pin, bytes, 0), CUDA_SUCCESS);
  cr_assert_eq(cuMemsetD8(o, 0x22, bytes), CUDA_SUCCESS,
               "the registering context sets it");
  cr_assert(own[0] == 0x22 && own[bytes - 1] == 0x22);
  /* Another device's context, then another context of the same device. */
  cr_assert_eq(cuCtxCreate(&c, NULL, 0, 0), CUDA_SUCCESS);
  cr_assert_eq(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
  CUcontext others[] = {b, c};
  for (int k = 0; k < 2; k++) {
    cr_assert_eq(cuCtxPushCurrent(others[k]), CUDA_SUCCESS);
    if (!fk_real()) { /* the fake's answer; a GPU's not asked */
      cr_expect_eq(cuMemsetD8(o, 0x33, bytes), CUDA_ERROR_INVALID_VALUE,
                   "context %d set another's non-PORTABLE registration", k);
      cr_expect_eq(cuMemsetD8Async(o + page, 0x33, 1, NULL),
                   CUDA_ERROR_INVALID_VALUE, "context %d, async", k);
      cr_expect_eq(cuMemsetD8(o + bytes - 1, 0x33, 1), CUDA_ERROR_INVALID_VALUE,
                   "context %d, last byte", k);
      cr_assert_eq(cuCtxSynchronize(), CUDA_SUCCESS);
      cr_assert(own[0] == 0x22 && own[page] == 0x22 && own[bytes - 1] == 0x22,
                "a refused memset wrote in context %d", k);
    }
    cr_assert_eq(cuMemsetD8(l, 0x44 + k, bytes), CUDA_SUCCESS,
                 "a PORTABLE registration in context %d", k);
    cr_assert(all[0] == 0x44 + k && all[bytes - 1] == 0x44 + k);
    cr_assert_eq(cuMemsetD8((CUdeviceptr)(uintptr_t)pin, 0x55, bytes),
                 CUDA_SUCCESS, "cuMemHostAlloc's memory in context %d", k);
    /* Copies take it, both ways, as pageable memory. */
    CUdeviceptr d = 0;
    unsigned char back[2] = {0};
    cr_assert_eq(cuMemAlloc(&d, bytes), CUDA_SUCCESS);
    cr_assert_eq(cuMemcpyHtoD(d, own, bytes), CUDA_SUCCESS);
    cr_assert_eq(cuMemcpyDtoH(&back[0], d + bytes - 1, 1), CUDA_SUCCESS);
    cr_assert_eq(back[0], 0x22, "a copy from it in context %d", k);
    cr_assert_eq(cuMemsetD8(d, 0x66 + k, bytes), CUDA_SUCCESS);
    cr_assert_eq(cuMemcpyDtoH(own, d, bytes), CUDA_SUCCESS);
    cr_assert(own[0] == 0x66 + k && own[bytes - 1] == 0x66 + k,
              "a copy into it in context %d", k);
    cr_assert_eq(cuMemsetD8(d, 0x22, bytes), CUDA_SUCCESS);
    cr_assert_eq(cuMemcpy(o, d, bytes), CUDA_SUCCESS, "cuMemcpy, unified");
    cr_assert_eq(cuMemcpy((CUdeviceptr)(uintptr_t)back, o, 2), CUDA_SUCCESS);
    cr_assert(own[0] == 0x22 && back[1] == 0x22);
    cr_assert_eq(cuMemFree(d), CUDA_SUCCESS);
    cr_assert_eq(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
  }
  cr_assert_eq(cuCtxDestroy(c), CUDA_SUCCESS);
  CUcontext cur = NULL;
  cr_assert_eq(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
  cr_assert_eq(cur, a);
  cr_assert_eq(cuMemsetD8(o, 0x77, bytes), CUDA_SUCCESS,
               "still the registering context's");
  cr_assert(own[0] == 0x77);
  cr_assert_eq(cuMemFreeHost(pin), CUDA_SUCCESS);
  unregister_own_and_all(own, all);
}
