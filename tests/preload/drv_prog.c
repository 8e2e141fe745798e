/* drv_prog.c - a driver-API program for the preload tests, linked with the
 * fake libcuda.so.1 (tests/fakecuda), so that its direct calls bind to the
 * driver unless the shim is preloaded.
 *
 *   drv_prog plain        no shim: direct calls reach the driver
 *   drv_prog preloaded D  under libmempool_preload.so with MEMPOOL_DEVICE=D
 *                         (host or cuda): every route to the allocation
 *                         entry points (direct call, dlsym, cuGetProcAddress
 *                         at the versions and flags the runtime uses) ends
 *                         in the shim; other names stay the driver's;
 *                         pointers the shim did not hand out go to the
 *                         driver; (D = cuda) allocations in another
 *                         device's context are served by that device's own
 *                         pool (FAKECUDA_DEVICE_COUNT=2 expected). The host
 *                         device serves every context.
 *                         With DRV_PROG_TOTAL=N, cuMemGetInfo_v2 must say
 *                         N bytes total (a cap in MEMPOOL_CONF).
 *   drv_prog preloaded cuda pause
 *                         mempool_preload_pause with device 0's pool only,
 *                         then device 1's first allocation (its pool is
 *                         made while 0's is paused): the resume must
 *                         resume device 0, and a second one is MP_EBUSY
 *                         (FAKECUDA_DEVICE_COUNT=2).
 *   drv_prog preloaded cuda undo
 *                         a resume that fails at device 1 (its memory
 *                         taken meanwhile) pauses device 0 again as it
 *                         was paused, without its content
 *                         (FAKECUDA_DEVICE_COUNT=2, FAKECUDA_DEVICE_1 small).
 *   drv_prog plain - cross, drv_prog preloaded cuda cross
 *                         cuMemAllocAsync / cuMemFreeAsync on another
 *                         device's stream (FAKECUDA_DEVICE_COUNT=2): the
 *                         stream's device serves the allocation.
 *   drv_prog preloaded cuda failed
 *                         device 1's pool cannot be made (the test's
 *                         MEMPOOL_CONF and FAKECUDA_DEVICE_1 see to it):
 *                         the driver serves its allocations, and the shim
 *                         asks nothing more of the driver per call than
 *                         where its context is (no primary context state,
 *                         no retain).
 * Prints "ok" and exits 0, or names each failed check and exits 1. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prog_check.h"

#undef cuGetProcAddress
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                          cuuint64_t flags);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream s);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s);
long long cuFakeGetCallCount(const char *name);

/* The answer of cuGetProcAddress_v2 (reached through dlsym). */
static void *proc(void *get_v2, const char *name, int version,
                  cuuint64_t flags) {
  CUresult (*get)(const char *, void **, int, cuuint64_t,
                  CUdriverProcAddressQueryResult *);
  memcpy(&get, &get_v2, sizeof get_v2);
  void *fn = NULL;
  CUdriverProcAddressQueryResult st;
  if (get(name, &fn, version, flags, &st) != CUDA_SUCCESS)
    return NULL;
  return fn;
}

static void check_lookups(void *h) {
  void *get_v2 = dlsym(h, "cuGetProcAddress_v2");
  expect(in_shim(get_v2), "dlsym cuGetProcAddress_v2 is the shim's");
  expect(in_shim(dlsym(h, "cuGetProcAddress")),
         "dlsym cuGetProcAddress is the shim's");
  expect(dlsym(h, "cuGetProcAddress_v2") == get_v2, "dlsym is stable");
  expect(proc(get_v2, "cuGetProcAddress", 12000, 0) == get_v2,
         "cuGetProcAddress(cuGetProcAddress, 12000) is the shim's _v2");
  static const struct {
    const char *base, *exported;
    int version;
    cuuint64_t flags;
  } hooked[] = {
      {"cuMemAlloc", "cuMemAlloc_v2", 3020, 0},
      {"cuMemFree", "cuMemFree_v2", 3020, 0},
      {"cuMemGetInfo", "cuMemGetInfo_v2", 3020, 0},
      {"cuMemGetAddressRange", "cuMemGetAddressRange_v2", 3020, 0},
      {"cuMemHostGetDevicePointer", "cuMemHostGetDevicePointer_v2", 3020, 0},
      {"cuPointerGetAttribute", "cuPointerGetAttribute", 4000, 0},
      {"cuPointerGetAttributes", "cuPointerGetAttributes", 7000, 0},
      {"cuIpcGetMemHandle", "cuIpcGetMemHandle", 4010, 0},
      {"cuMemAllocAsync", "cuMemAllocAsync", 11020, 0},
      {"cuMemAllocAsync", "cuMemAllocAsync_ptsz", 11020, 2},
      {"cuMemFreeAsync", "cuMemFreeAsync", 11020, 0},
      {"cuMemFreeAsync", "cuMemFreeAsync_ptsz", 11020, 2},
      {"cuMemAlloc", "cuMemAlloc_v2", 12000, 1},
      /* The graph hooks (graphs.c), at the versions cudaTypedefs.h gives
       * each form: a copy made through the driver's answer must hold the
       * graph pools as one made by a direct call does. */
      {"cuGraphClone", "cuGraphClone", 10000, 0},
      {"cuGraphAddChildGraphNode", "cuGraphAddChildGraphNode", 10000, 0},
      {"cuGraphExecUpdate", "cuGraphExecUpdate", 10020, 0},
      {"cuGraphExecUpdate", "cuGraphExecUpdate_v2", 12000, 0},
      {"cuGraphAddNode", "cuGraphAddNode", 12020, 0},
      {"cuGraphAddNode", "cuGraphAddNode_v2", 12030, 0},
      {"cuGraphChildGraphNodeGetGraph", "cuGraphChildGraphNodeGetGraph", 10000,
       0},
      {"cuGraphExecChildGraphNodeSetParams",
       "cuGraphExecChildGraphNodeSetParams", 11010, 0},
      {"cuGraphExecNodeSetParams", "cuGraphExecNodeSetParams", 12020, 0},
      {"cuGraphNodeSetParams", "cuGraphNodeSetParams", 12020, 0},
      {"cuGraphNodeFindInClone", "cuGraphNodeFindInClone", 10000, 0},
      {"cuGraphDestroyNode", "cuGraphDestroyNode", 10000, 0},
      {"cuGraphDestroy", "cuGraphDestroy", 10000, 0},
      {"cuGraphExecDestroy", "cuGraphExecDestroy", 10000, 0},
      {"cuGraphLaunch", "cuGraphLaunch", 10000, 0},
      {"cuGraphLaunch", "cuGraphLaunch_ptsz", 10000, 2},
      {"cuGraphInstantiate", "cuGraphInstantiateWithFlags", 12000, 0},
      {"cuGraphInstantiateWithParams", "cuGraphInstantiateWithParams", 12000,
       0},
      {"cuStreamBeginCaptureToGraph", "cuStreamBeginCaptureToGraph", 12030, 0},
      {"cuStreamEndCapture", "cuStreamEndCapture", 10000, 0},
  };
  for (size_t i = 0; i < sizeof hooked / sizeof *hooked; i++) {
    void *by_proc =
        proc(get_v2, hooked[i].base, hooked[i].version, hooked[i].flags);
    void *by_handle = dlsym(h, hooked[i].exported);
    void *by_default = dlsym(RTLD_DEFAULT, hooked[i].exported);
    expect(in_shim(by_proc), hooked[i].exported);
    expect(by_proc == by_handle && by_handle == by_default, hooked[i].exported);
  }
  /* Untouched: other names, and versions older than the _v2 forms. */
  void *init = proc(get_v2, "cuInit", 2000, 0);
  expect(init != NULL && !in_shim(init) && init == dlsym(h, "cuInit"),
         "cuInit stays the driver's");
  expect(!in_shim(dlsym(h, "cuCtxGetDevice")), "cuCtxGetDevice untouched");
  /* cuGraphExecGetFlags is only asked by the shim, not replaced. */
  void *flags = proc(get_v2, "cuGraphExecGetFlags", 12000, 0);
  expect(flags != NULL && !in_shim(flags), "cuGraphExecGetFlags untouched");
  expect(!in_shim(proc(get_v2, "cuMemAlloc", 2000, 0)),
         "cuMemAlloc below 3.2 untouched");
  expect(dlsym(h, "cuNoSuchFunction") == NULL, "unknown names stay unknown");
}

static long long calls(const char *name) {
  return cuFakeGetCallCount(name);
}

/* What the driver was asked about captures (cuda.h: cuStreamIsCapturing,
 * cuStreamGetCaptureInfo, each also _ptsz). */
static long long capture_queries(void) {
  return calls("cuStreamIsCapturing") + calls("cuStreamIsCapturing_ptsz") +
         calls("cuStreamGetCaptureInfo_v2") +
         calls("cuStreamGetCaptureInfo_v2_ptsz") +
         calls("cuStreamGetCaptureInfo_v3") +
         calls("cuStreamGetCaptureInfo_v3_ptsz");
}

static void check_serving(int preloaded, int cuda) {
  CUcontext ctx0 = NULL, ctx1 = NULL;
  CUdevice dev = 0;
  expect(cuInit(0) == CUDA_SUCCESS, "cuInit");
  expect(cuDeviceGet(&dev, 0) == CUDA_SUCCESS, "cuDeviceGet");
  expect(cuDevicePrimaryCtxRetain(&ctx0, dev) == CUDA_SUCCESS, "ctx 0");
  expect(cuCtxSetCurrent(ctx0) == CUDA_SUCCESS, "set ctx 0");

  /* A stream creation the driver refuses (flags cuda.h does not name)
   * leaves the shim serving this thread: under it, the refusal once left
   * the thread's hook depth unbalanced, and every later call on the thread
   * went to the driver (the checks below: the pool served nothing). */
  CUstream refused;
  expect(cuStreamCreate(&refused, 0x80) != CUDA_SUCCESS,
         "cuStreamCreate with unknown flags is refused");
  long long alloc0 = calls("cuMemAlloc_v2");
  long long async0 = calls("cuMemAllocAsync") + calls("cuMemAllocAsync_ptsz");
  CUdeviceptr d[4] = {0};
  expect(cuMemAlloc_v2(&d[0], 1 << 20) == CUDA_SUCCESS, "direct cuMemAlloc");
  expect(cuMemAllocAsync(&d[1], 3000, NULL) == CUDA_SUCCESS, "async alloc");
  expect(cuMemAllocAsync_ptsz(&d[2], 5000, NULL) == CUDA_SUCCESS, "ptsz alloc");
  void *via_proc = NULL;
  expect(cuGetProcAddress("cuMemAlloc", &via_proc, 3020, 0) == CUDA_SUCCESS,
         "direct cuGetProcAddress");
  CUresult (*alloc)(CUdeviceptr *, size_t);
  memcpy(&alloc, &via_proc, sizeof via_proc);
  expect(alloc != NULL && alloc(&d[3], 7000) == CUDA_SUCCESS,
         "cuMemAlloc through cuGetProcAddress");
  /* With the shim, the pool served them all (the cuda device's pool may
   * have made segments with cuMemAlloc_v2, never one per request). */
  long long direct_allocs = calls("cuMemAlloc_v2") - alloc0;
  long long direct_async =
      calls("cuMemAllocAsync") + calls("cuMemAllocAsync_ptsz") - async0;
  if (preloaded) {
    expect(direct_allocs < 2, "the pool served cuMemAlloc_v2");
    expect(direct_async == 0, "the pool served cuMemAllocAsync");
  } else {
    expect(direct_allocs == 2 && direct_async == 2, "the driver served all");
  }

  CUdeviceptr base = 0;
  size_t size = 0;
  expect(cuMemGetAddressRange_v2(&base, &size, d[0] + 4096) == CUDA_SUCCESS &&
             base == d[0] && size == 1 << 20,
         "address range of an interior pointer is its block");
  CUdeviceptr start = 0;
  size_t range = 0;
  expect(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                               d[0] + 4096) == CUDA_SUCCESS &&
             cuPointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                   d[0] + 4096) == CUDA_SUCCESS &&
             start == base && range == size,
         "cuPointerGetAttribute's range agrees with cuMemGetAddressRange");
  size_t free_b = 0, total_b = 0;
  expect(cuMemGetInfo_v2(&free_b, &total_b) == CUDA_SUCCESS && total_b > 0 &&
             free_b <= total_b,
         "cuMemGetInfo_v2");
  /* DRV_PROG_TOTAL: what the total must be (the pool's cap). */
  const char *want = getenv("DRV_PROG_TOTAL");
  expect(want == NULL || strtoull(want, NULL, 10) == total_b,
         "cuMemGetInfo_v2's total is the cap");
  long long asked0 = capture_queries();
  expect(cuMemFreeAsync(d[1], NULL) == CUDA_SUCCESS, "async free");
  long long asked = capture_queries() - asked0;
  /* The shim asks once whether the free's stream is captured (a host
   * function's refusal and the capture's graph pool both read that one
   * answer); the pool on the cuda device may ask once more, closing the
   * stream's epoch with a marker (stream.c). Before: the shim asked three
   * times. On the host device nothing asks the driver. */
  if (preloaded)
    expect(cuda ? asked <= 2 : asked == 0,
           "a stream-ordered free asks about captures once");
  expect(cuMemFreeAsync_ptsz(d[2], NULL) == CUDA_SUCCESS, "ptsz free");
  expect(cuMemFree_v2(d[0]) == CUDA_SUCCESS, "free");
  expect(cuMemFree_v2(d[3]) == CUDA_SUCCESS, "free");
  if (!preloaded)
    return;

  /* A pointer the shim never handed out is the driver's to judge. */
  long long free0 = calls("cuMemFree_v2");
  expect(cuMemFree_v2((CUdeviceptr)0xdead0000) != CUDA_SUCCESS,
         "unknown pointer rejected");
  expect(calls("cuMemFree_v2") == free0 + 1, "unknown pointer to driver");

  /* Another device's context: a pool of its own serves it (made on first
   * use, growing by cuMemCreate on device 1), not the driver's cuMemAlloc,
   * and the trace records it. */
  CUdeviceptr other = 0;
  if (cuda && cuDeviceGet(&dev, 1) == CUDA_SUCCESS &&
      cuDevicePrimaryCtxRetain(&ctx1, dev) == CUDA_SUCCESS) {
    expect(cuCtxSetCurrent(ctx1) == CUDA_SUCCESS, "set ctx 1");
    alloc0 = calls("cuMemAlloc_v2");
    free0 = calls("cuMemFree_v2");
    long long create0 = calls("cuMemCreate");
    expect(cuMemAlloc_v2(&other, 4096) == CUDA_SUCCESS, "alloc on device 1");
    expect(cuMemFree_v2(other) == CUDA_SUCCESS, "free on device 1");
    expect(calls("cuMemAlloc_v2") == alloc0 && calls("cuMemFree_v2") == free0,
           "device 1 not left to the driver");
    expect(calls("cuMemCreate") > create0, "device 1's pool grew");
    expect(cuCtxSetCurrent(ctx0) == CUDA_SUCCESS, "back to ctx 0");
  }
}

/* The shim's process-wide pause and resume, and the primary contexts of
 * devices 0 and 1; false (said) where any is missing. */
typedef struct {
  int (*pause_all)(unsigned);
  int (*resume_all)(void);
  CUcontext c0, c1;
} two_devices_t;

static bool two_devices(two_devices_t *t) {
  CUdevice d0, d1;
  *(void **)&t->pause_all = dlsym(RTLD_DEFAULT, "mempool_preload_pause");
  *(void **)&t->resume_all = dlsym(RTLD_DEFAULT, "mempool_preload_resume");
  bool ready = t->pause_all != NULL && t->resume_all != NULL &&
               cuInit(0) == CUDA_SUCCESS && cuDeviceGet(&d0, 0) == 0 &&
               cuDeviceGet(&d1, 1) == 0 &&
               cuDevicePrimaryCtxRetain(&t->c0, d0) == 0 &&
               cuDevicePrimaryCtxRetain(&t->c1, d1) == 0;
  expect(ready, "the shim's pause and two devices");
  return ready;
}

/* The process-wide pause of the shim across two devices' pools, one made
 * while the other was paused. */
static void check_pause_across_devices(void) {
  two_devices_t t;
  CUdeviceptr a = 0, b = 0;
  if (!two_devices(&t))
    return;
  expect(cuCtxSetCurrent(t.c0) == 0 && cuMemAlloc_v2(&a, 1 << 20) == 0,
         "alloc on device 0");
  expect(t.pause_all(1) == 0, "pause");
  expect(cuCtxSetCurrent(t.c1) == 0 && cuMemAlloc_v2(&b, 1 << 20) == 0 &&
             cuMemFree_v2(b) == 0,
         "device 1 served while device 0 is paused");
  expect(t.resume_all() == 0, "resume with device 1's pool made meanwhile");
  expect(t.resume_all() == 6 /* MP_EBUSY */, "a second resume is MP_EBUSY");
  expect(cuCtxSetCurrent(t.c0) == 0 && cuMemFree_v2(a) == 0 &&
             cuMemAlloc_v2(&a, 1 << 20) == 0 && cuMemFree_v2(a) == 0,
         "device 0 serves again after the resume");
}

/* A process-wide resume that fails at device 1 (another tenant holds
 * its memory: FAKECUDA_DEVICE_1=capacity=64M) undoes device 0's resume
 * with the flags device 0 was paused with: paused without its content,
 * it is paused again without copying it to page-locked host memory (the
 * undo copied it, content the caller had given up). Once the tenant lets
 * go, the resume brings both back. */
static void check_resume_undo(void) {
  two_devices_t t;
  CUdeviceptr a = 0, b = 0;
  if (!two_devices(&t))
    return;
  bool ready = cuCtxSetCurrent(t.c0) == 0 && cuMemAlloc_v2(&a, 1 << 20) == 0 &&
               cuCtxSetCurrent(t.c1) == 0 && cuMemAlloc_v2(&b, 1 << 20) == 0;
  expect(ready, "a block on each device");
  if (!ready)
    return;
  expect(t.pause_all(0) == 0, "pause without the content");
  CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                              .location = {CU_MEM_LOCATION_TYPE_DEVICE, 1}};
  CUmemGenericAllocationHandle tenant = 0;
  expect(cuMemCreate(&tenant, (size_t)64 << 20, &prop, 0) == CUDA_SUCCESS,
         "the tenant takes device 1");
  long long copies = calls("cuMemHostAlloc");
  expect(t.resume_all() != 0, "the resume fails at device 1");
  expect(calls("cuMemHostAlloc") == copies,
         "the undo copied device 0's given-up content to the host");
  expect(cuMemRelease(tenant) == CUDA_SUCCESS, "the tenant lets go");
  expect(t.resume_all() == 0, "the resume brings both back");
  expect(cuCtxSetCurrent(t.c0) == 0 && cuMemFree_v2(a) == 0 &&
             cuCtxSetCurrent(t.c1) == 0 && cuMemFree_v2(b) == 0,
         "both devices serve again");
}

static int ordinal_of(CUdeviceptr p) {
  int ord = -1;
  if (cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) !=
      CUDA_SUCCESS)
    return -1;
  return ord;
}

/* Stream-ordered calls on another device's stream, device 0 current:
 * cuMemAllocAsync takes from "the memory pool current to the stream's
 * device" (cuda.h), and cuMemFreeAsync orders a free on any stream. With
 * the shim, the stream's device's pool serves (never the driver's
 * cuMemAllocAsync) and both frees succeed, the current context left as it
 * was. The shim refused both (CUDA_ERROR_INVALID_VALUE) before. */
static void check_cross_device_streams(int preloaded) {
  CUdevice d0, d1;
  CUcontext c0 = NULL, c1 = NULL, now = NULL;
  CUstream s0 = NULL, s1 = NULL;
  bool ready =
      cuInit(0) == 0 && cuDeviceGet(&d0, 0) == 0 && cuDeviceGet(&d1, 1) == 0 &&
      cuDevicePrimaryCtxRetain(&c0, d0) == 0 &&
      cuDevicePrimaryCtxRetain(&c1, d1) == 0 && cuCtxSetCurrent(c1) == 0 &&
      cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING) == 0 &&
      cuCtxSetCurrent(c0) == 0 &&
      cuStreamCreate(&s0, CU_STREAM_NON_BLOCKING) == 0;
  expect(ready, "two devices, a stream on each");
  if (!ready)
    return;
  long long async0 = calls("cuMemAllocAsync");
  CUdeviceptr on1 = 0, on0 = 0, late = 0;
  expect(cuMemAllocAsync(&on1, 1 << 20, s1) == CUDA_SUCCESS,
         "alloc on device 1's stream with device 0 current");
  expect(cuMemAllocAsync(&on0, 1 << 20, s0) == CUDA_SUCCESS,
         "alloc on device 0's stream");
  expect(cuCtxGetCurrent(&now) == 0 && now == c0, "device 0 still current");
  expect(ordinal_of(on1) == 1, "the block on device 1's stream is device 1's");
  expect(ordinal_of(on0) == 0, "the block on device 0's stream is device 0's");
  if (preloaded)
    expect(calls("cuMemAllocAsync") == async0, "the pools served both");
  expect(cuCtxPushCurrent(c1) == 0 &&
             cuMemsetD8Async(on1, 7, 1 << 20, s1) == CUDA_SUCCESS &&
             cuCtxPopCurrent(NULL) == 0,
         "work on device 1's stream");
  expect(cuMemFreeAsync(on1, s0) == CUDA_SUCCESS,
         "device 1's block freed on device 0's stream");
  expect(cuMemFreeAsync(on0, s1) == CUDA_SUCCESS,
         "device 0's block freed on device 1's stream");
  expect(cuMemAllocAsync(&late, 1 << 20, s1) == CUDA_SUCCESS &&
             ordinal_of(late) == 1 && cuMemFreeAsync(late, s1) == 0,
         "device 1 serves again on its stream");
  expect(cuStreamSynchronize(s0) == 0 && cuCtxSetCurrent(c1) == 0 &&
             cuStreamSynchronize(s1) == 0 && cuStreamDestroy(s1) == 0 &&
             cuCtxSetCurrent(c0) == 0 && cuStreamDestroy(s0) == 0,
         "streams synchronized and destroyed");
}

static void check_failed_device(void) {
  CUdevice d1 = 0;
  CUcontext c1 = NULL;
  expect(cuInit(0) == CUDA_SUCCESS && cuDeviceGet(&d1, 1) == CUDA_SUCCESS &&
             cuDevicePrimaryCtxRetain(&c1, d1) == CUDA_SUCCESS &&
             cuCtxSetCurrent(c1) == CUDA_SUCCESS,
         "device 1's primary context current");
  /* The first call tries to make the pool; it fails and the driver
   * serves. */
  long long a0 = calls("cuMemAlloc_v2");
  CUdeviceptr p = 0;
  expect(cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS &&
             cuMemFree_v2(p) == CUDA_SUCCESS,
         "first allocation on device 1");
  expect(calls("cuMemAlloc_v2") - a0 == 1, "the driver served it");
  long long a1 = calls("cuMemAlloc_v2");
  long long g1 = calls("cuDevicePrimaryCtxGetState");
  long long r1 = calls("cuDevicePrimaryCtxRetain");
  enum { N = 100 };
  for (int i = 0; i < N; i++)
    expect(cuMemAlloc_v2(&p, 4096 + (size_t)i) == CUDA_SUCCESS &&
               cuMemFree_v2(p) == CUDA_SUCCESS,
           "allocation on device 1");
  expect(calls("cuMemAlloc_v2") - a1 == N, "the driver served every one");
  long long g = calls("cuDevicePrimaryCtxGetState") - g1;
  long long r = calls("cuDevicePrimaryCtxRetain") - r1;
  if (g != 0 || r != 0)
    printf("%d allocations on the failed device asked the primary context's "
           "state %lld times and retained it %lld times\n",
           N, g, r);
  expect(g == 0 && r == 0, "no per-call questions about device 1's context");
  expect(cuDevicePrimaryCtxRelease(d1) == CUDA_SUCCESS, "released");
}

int main(int argc, char **argv) {
  int preloaded = argc > 1 && strcmp(argv[1], "preloaded") == 0;
  int cuda = argc > 2 && strcmp(argv[2], "cuda") == 0;
  if (argc > 3 && strcmp(argv[3], "cross") == 0) {
    check_cross_device_streams(preloaded);
    if (failures == 0)
      printf("ok\n");
    return failures == 0 ? 0 : 1;
  }
  if (preloaded && cuda && argc > 3 && strcmp(argv[3], "failed") == 0) {
    check_failed_device();
    if (failures == 0)
      printf("ok\n");
    return failures == 0 ? 0 : 1;
  }
  if (preloaded && cuda && argc > 3 && strcmp(argv[3], "undo") == 0) {
    check_resume_undo();
    if (failures == 0)
      printf("ok\n");
    return failures == 0 ? 0 : 1;
  }
  if (preloaded && cuda && argc > 3 && strcmp(argv[3], "pause") == 0) {
    check_pause_across_devices();
    if (failures == 0)
      printf("ok\n");
    return failures == 0 ? 0 : 1;
  }
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  expect(h != NULL, "dlopen libcuda.so.1");
  if (h == NULL)
    return 1;
  if (preloaded)
    check_lookups(h);
  else
    expect(!in_shim(dlsym(h, "cuMemAlloc_v2")), "no shim: driver's own");
  check_serving(preloaded, cuda);
  if (failures == 0)
    printf("ok\n");
  return failures == 0 ? 0 : 1;
}
