/* pinned_drv_prog.c - page-locked memory through the driver API, linked
 * with the fake libcuda.so.1 (tests/fakecuda), for the preload tests:
 *
 *   pinned_drv_prog N
 * makes N cuMemHostAlloc and N cuMemAllocHost_v2 allocations of assorted
 * sizes (each filled and checked) and frees them with cuMemFreeHost; then
 * one write-combined cuMemHostAlloc and its free, which must reach the
 * driver (one call each); then a malloc'd buffer registered with
 * cuMemHostRegister, copied to device memory and back, and unregistered,
 * all of which must reach the driver (the shim leaves registered memory
 * alone). Prints "driver_host_allocs=A driver_host_frees=F" (the fake's
 * counts of its own entry points), "registered=ADDRESS" and "ok", or names
 * each failed check and exits 1.
 *   pinned_drv_prog 1 double_free | bad_flags
 * a second cuMemFreeHost of one block; cuMemHostAlloc with flags no
 * driver knows: each must be the driver's error.
 *   pinned_drv_prog 1 proc
 * six page-locked blocks from cuMemAllocHost called and from the
 * cuMemAllocHost and cuMemHostAlloc cuGetProcAddress answers, freed in
 * turn with the cuMemFreeHost it answers and the one called: each free
 * succeeds; prints "driver_host_allocs=A".
 *   pinned_drv_prog 1 other_device
 * (two devices, FAKECUDA_DEVICE_COUNT=2) a page-locked block that a copy
 * on a stream of device 1 reads late is freed (cuMemFreeHost), and a block
 * of the same size allocated and overwritten at once: the copy must read
 * what was there before the free (page-locked memory is any device's).
 *   pinned_drv_prog 1 other_reset
 * (two devices) a page-locked block asked for while device 0's primary
 * context is current, and one, filled, while device 1's is; then
 * cuDevicePrimaryCtxReset of device 0: the reset destroys only device 0's
 * block (cuda.h, cuDevicePrimaryCtxReset: "Destroy all allocations ... on
 * the primary context"; page-locked memory is the context's that
 * allocated it), so device 1's is still page-locked memory
 * (cuMemHostGetFlags), keeps its content and its cuMemFreeHost succeeds,
 * while device 0's free is CUDA_ERROR_INVALID_VALUE; prints "ok".
 *   pinned_drv_prog 1 mapped
 * page-locked blocks asked for with CU_MEMHOSTALLOC_DEVICEMAP (alone and
 * with PORTABLE), each given its device pointer by
 * cuMemHostGetDevicePointer (the driver refuses memory allocated without
 * the flag), at its start and inside it; prints "ok".
 *   pinned_drv_prog 1 flags
 * page-locked blocks from cuMemHostAlloc with flags 0, PORTABLE and
 * DEVICEMAP and from cuMemAllocHost: cuMemHostGetFlags gives each (at its
 * start and inside it) the flags it was asked for (cuMemAllocHost: none);
 * once the first is freed, while the others stay live, its address is
 * CUDA_ERROR_INVALID_VALUE; prints "ok".
 *   pinned_drv_prog 1 range
 * two page-locked blocks of 4096 bytes: cuPointerGetAttribute and
 * cuPointerGetAttributes give an address inside each the range of its own
 * allocation (RANGE_START_ADDR its start, RANGE_SIZE at least 4096 and
 * under 64 KiB), not memory around it; once the first is freed (the
 * second live) its address is CUDA_ERROR_INVALID_VALUE; prints "ok".
 *   pinned_drv_prog 1 devptr
 * two live page-locked blocks of 4096 bytes from cuMemHostAlloc with
 * CU_MEMHOSTALLOC_DEVICEMAP: cuMemHostGetDevicePointer, called and as
 * cuGetProcAddress answers it at CUDA 3.2 (how the runtime's
 * cudaHostGetDevicePointer reaches it), gives each (at its start and 100
 * bytes inside) a device pointer, the inner one 100 bytes past the
 * start's, the two blocks' apart by at least 4096; once the first is
 * freed (the second live) its address is CUDA_ERROR_INVALID_VALUE through
 * both, as cuda.h's refusal of memory that is no such allocation; prints
 * "ok".
 *   pinned_drv_prog 1 addr_range
 * two live page-locked blocks of 4096 bytes (cuMemHostAlloc, DEVICEMAP):
 * cuMemGetAddressRange, called and as cuGetProcAddress answers it at CUDA
 * 3.2, gives an address 100 bytes inside each its own allocation (base
 * its start, size at least 4096 and under 64 KiB, as
 * cuPointerGetAttribute's RANGE_START_ADDR / RANGE_SIZE say), not memory
 * around it; once the first is freed (the second live) its address is
 * CUDA_ERROR_NOT_FOUND through both, as for freed device memory; prints
 * "ok".
 *   pinned_drv_prog 1 capture relaxed | global
 * a page-locked block allocated, then a capture begun in that mode on a
 * stream of its own, and, while it is under way, cuMemAllocHost and
 * cuMemFreeHost of the first block: in relaxed mode both succeed and the
 * capture ends valid; in global mode both are
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and the capture ends invalidated.
 * After it the blocks are freed (once) and the memory serves again;
 * prints "ok".
 *   pinned_drv_prog 1 capture_exit
 * a page-locked block allocated, then freed during a relaxed capture on a
 * stream of its own; after the capture the program exits without another
 * page-locked call; prints "ok".
 *   pinned_drv_prog 1 device_free [LIBRARY]
 * the device-memory frees (cuMemFree, cuMemFreeAsync; with LIBRARY, a
 * stand-in runtime over the driver, its cudaFree too) given a pointer
 * inside a live page-locked block and a page-locked block already freed:
 * each must be CUDA_ERROR_INVALID_VALUE, the block must stay intact and
 * its cuMemFreeHost must then succeed. Prints "driver_frees=F" (the
 * fake's count of its cuMemFree_v2 and cuMemFreeAsync calls meanwhile)
 * and "ok".
 *   pinned_drv_prog 1 late_runtime LIBRARY
 * a write-combined cuMemHostAlloc and its free, then LIBRARY (a stand-in
 * runtime, late_runtime.c) loaded and its cudaMalloc called through dlsym:
 * the runtime loaded after the first pinned call must answer it. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "prog_check.h"

/* The fake's count of its own entry point; absent on a real driver (the
 * GPU twin in gpu/run_gpu.sh), where the checks on counts are left out. */
__attribute__((weak)) long long cuFakeGetCallCount(const char *name);

static long long calls(const char *name) {
  return cuFakeGetCallCount ? cuFakeGetCallCount(name) : -1;
}

static int counted(void) {
  return cuFakeGetCallCount != NULL;
}

static void slow_start(void *arg) {
  (void)arg;
  usleep(150000);
}

#define MP_OTHER_BYTES 4096

/* Device 1's context is current while its stream's copy reads device 0's
 * page-locked block, freed meanwhile. */
static int other_device(void) {
  CUdevice d1;
  CUcontext c1;
  CUstream s1;
  CUdeviceptr dst;
  unsigned char *h = NULL, *h2 = NULL, b = 0;
  expect(cuMemAllocHost((void **)&h, MP_OTHER_BYTES) == CUDA_SUCCESS,
         "cuMemAllocHost");
  if (h == NULL)
    return 1;
  memset(h, 1, MP_OTHER_BYTES);
  expect(cuDeviceGet(&d1, 1) == CUDA_SUCCESS, "device 1");
  expect(cuDevicePrimaryCtxRetain(&c1, d1) == CUDA_SUCCESS, "device 1 ctx");
  expect(cuCtxSetCurrent(c1) == CUDA_SUCCESS, "set device 1 ctx");
  expect(cuMemAlloc(&dst, MP_OTHER_BYTES) == CUDA_SUCCESS, "cuMemAlloc");
  expect(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "stream");
  if (failures != 0)
    return 1;
  expect(cuLaunchHostFunc(s1, slow_start, NULL) == CUDA_SUCCESS, "host fn");
  expect(cuMemcpyAsync(dst, (CUdeviceptr)(uintptr_t)h, MP_OTHER_BYTES, s1) ==
             CUDA_SUCCESS,
         "copy on device 1");
  expect(cuMemFreeHost(h) == CUDA_SUCCESS, "cuMemFreeHost");
  expect(cuMemAllocHost((void **)&h2, MP_OTHER_BYTES) == CUDA_SUCCESS,
         "cuMemAllocHost again");
  if (h2 != NULL)
    memset(h2, 2, MP_OTHER_BYTES);
  expect(cuStreamSynchronize(s1) == CUDA_SUCCESS, "sync");
  expect(cuMemcpyDtoH(&b, dst + MP_OTHER_BYTES - 1, 1) == CUDA_SUCCESS,
         "read back");
  if (b != 1)
    printf("device 1's copy read %d, not 1: the freed page-locked block "
           "(%s the new one) was handed out and overwritten under it\n",
           b, h2 == h ? "is" : "is not");
  expect(b == 1, "device 1's copy read the block before its free");
  expect(cuMemFreeHost(h2) == CUDA_SUCCESS, "cuMemFreeHost again");
  expect(cuMemFree(dst) == CUDA_SUCCESS, "cuMemFree");
  expect(cuStreamDestroy(s1) == CUDA_SUCCESS, "stream destroy");
  if (failures == 0)
    printf("ok\n");
  return failures == 0 ? 0 : 1;
}

/* Device 1's page-locked block outlives device 0's reset; device 0's does
 * not. */
static int other_reset(void) {
  CUdevice d1;
  CUcontext c1;
  unsigned char *h0 = NULL, *h1 = NULL;
  unsigned flags = 99;
  expect(cuMemAllocHost((void **)&h0, MP_OTHER_BYTES) == CUDA_SUCCESS,
         "cuMemAllocHost on device 0");
  expect(cuDeviceGet(&d1, 1) == CUDA_SUCCESS, "device 1");
  expect(cuDevicePrimaryCtxRetain(&c1, d1) == CUDA_SUCCESS, "device 1 ctx");
  expect(cuCtxSetCurrent(c1) == CUDA_SUCCESS, "set device 1 ctx");
  expect(cuMemAllocHost((void **)&h1, MP_OTHER_BYTES) == CUDA_SUCCESS,
         "cuMemAllocHost on device 1");
  if (failures != 0 || h1 == NULL)
    return 1;
  memset(h1, 5, MP_OTHER_BYTES);
  expect(cuDevicePrimaryCtxReset(0) == CUDA_SUCCESS, "reset device 0");
  CUresult f = cuMemHostGetFlags(&flags, h1);
  if (f != CUDA_SUCCESS)
    printf("cuMemHostGetFlags of device 1's block after device 0's reset: "
           "%d\n",
           (int)f);
  expect(f == CUDA_SUCCESS,
         "device 1's block is still page-locked memory after device 0's "
         "reset");
  if (f == CUDA_SUCCESS) { /* else gone: not read */
    size_t bad = 0;
    for (size_t i = 0; i < MP_OTHER_BYTES; i++)
      bad += h1[i] != 5;
    expect(bad == 0, "device 1's block keeps its content");
    memset(h1, 6, MP_OTHER_BYTES);
  }
  CUresult r1 = cuMemFreeHost(h1);
  if (r1 != CUDA_SUCCESS)
    printf("cuMemFreeHost of device 1's block after device 0's reset: %d\n",
           (int)r1);
  expect(r1 == CUDA_SUCCESS,
         "device 1's block is freed after device 0's reset");
  expect(cuMemFreeHost(h0) == CUDA_ERROR_INVALID_VALUE,
         "device 0's block went with its reset");
  expect(cuDevicePrimaryCtxRelease(d1) == CUDA_SUCCESS, "release device 1");
  if (failures == 0)
    printf("ok\n");
  return failures == 0 ? 0 : 1;
}

/* The host memory still serves after a refused call: a page-locked
 * block is allocated, filled with fill and freed. */
static void still_serves(int fill) {
  void *q = NULL;
  expect(cuMemAllocHost(&q, 4096) == CUDA_SUCCESS, "cuMemAllocHost again");
  if (q != NULL) {
    memset(q, fill, 4096);
    expect(cuMemFreeHost(q) == CUDA_SUCCESS, "cuMemFreeHost again");
  }
}

/* The device-memory frees of page-locked memory the program holds: an
 * address inside a live block, and a block freed already. With runtime (a
 * stand-in runtime's path), its cudaFree is tried as well. */
static int device_free(const char *runtime) {
  unsigned int (*rt_free)(void *) = NULL;
  if (runtime != NULL) {
    void *h = dlopen(runtime, RTLD_NOW | RTLD_GLOBAL);
    expect(h != NULL, "dlopen of the stand-in runtime");
    if (h != NULL)
      *(void **)&rt_free = dlsym(h, "cudaFree");
    expect(rt_free != NULL, "dlsym(cudaFree)");
  }
  unsigned char *p = NULL, *q = NULL;
  expect(cuMemAllocHost((void **)&p, 4096) == CUDA_SUCCESS, "cuMemAllocHost");
  expect(cuMemAllocHost((void **)&q, 4096) == CUDA_SUCCESS, "cuMemAllocHost");
  if (p == NULL || q == NULL)
    return 1;
  memset(p, 0x6b, 4096);
  expect(cuMemFreeHost(q) == CUDA_SUCCESS, "cuMemFreeHost");
  long long f0 = calls("cuMemFree_v2") + calls("cuMemFreeAsync");
  CUdeviceptr inside = (CUdeviceptr)(uintptr_t)(p + 64);
  CUdeviceptr freed = (CUdeviceptr)(uintptr_t)q;
  expect(cuMemFree(inside) == CUDA_ERROR_INVALID_VALUE,
         "cuMemFree inside a page-locked block is invalid value");
  expect(cuMemFree(freed) == CUDA_ERROR_INVALID_VALUE,
         "cuMemFree of a freed page-locked block is invalid value");
  expect(cuMemFreeAsync(inside, NULL) == CUDA_ERROR_INVALID_VALUE,
         "cuMemFreeAsync inside a page-locked block is invalid value");
  if (rt_free != NULL) {
    expect(rt_free(p + 64) == CUDA_ERROR_INVALID_VALUE,
           "cudaFree inside a page-locked block is invalid value");
    expect(rt_free(q) == CUDA_ERROR_INVALID_VALUE,
           "cudaFree of a freed page-locked block is invalid value");
  }
  printf("driver_frees=%lld\n",
         calls("cuMemFree_v2") + calls("cuMemFreeAsync") - f0);
  expect(p[0] == 0x6b && p[4095] == 0x6b, "the block is intact");
  memset(p, 0x2e, 4096);
  expect(cuMemFreeHost(p) == CUDA_SUCCESS, "the block's own free after");
  still_serves(0x1f);
  if (failures == 0)
    printf("ok\n");
  return failures == 0 ? 0 : 1;
}

/* Two live DEVICEMAP blocks of MP_QUERY_BYTES for the devptr and
 * addr_range modes, and the entry point cuGetProcAddress answers for name
 * at CUDA 3.2 (as the runtime looks it up) in *looked; false when any is
 * missing. */
#define MP_QUERY_BYTES 4096
static bool query_setup(const char *name, unsigned char *p[2], void **looked) {
  for (int i = 0; i < 2; i++)
    expect(cuMemHostAlloc((void **)&p[i], MP_QUERY_BYTES,
                          CU_MEMHOSTALLOC_DEVICEMAP) == CUDA_SUCCESS &&
               p[i] != NULL,
           "cuMemHostAlloc(DEVICEMAP)");
  expect(cuGetProcAddress(name, looked, 3020, CU_GET_PROC_ADDRESS_DEFAULT,
                          NULL) == CUDA_SUCCESS &&
             *looked != NULL,
         name);
  return p[0] != NULL && p[1] != NULL && *looked != NULL;
}

/* The rest of both modes, once the first block is freed: the second's
 * free, and "ok". */
static int query_done(unsigned char *live) {
  expect(cuMemFreeHost(live) == CUDA_SUCCESS, "cuMemFreeHost");
  if (failures == 0)
    printf("ok\n");
  return failures == 0 ? 0 : 1;
}

/* cuMemHostGetDevicePointer of live and freed page-locked blocks. */
static int devptr(void) {
  typedef CUresult (*fn_t)(CUdeviceptr *, void *, unsigned int);
  unsigned char *p[2] = {NULL, NULL};
  void *looked = NULL;
  if (!query_setup("cuMemHostGetDevicePointer", p, &looked))
    return 1;
  CUdeviceptr d[2] = {0, 0};
  for (int i = 0; i < 2; i++) {
    for (int via = 0; via < 2; via++) {
      fn_t get = via ? (fn_t)looked : cuMemHostGetDevicePointer;
      CUdeviceptr at = 0, in = 0;
      CUresult r1 = get(&at, p[i], 0), r2 = get(&in, p[i] + 100, 0);
      bool ok = r1 == CUDA_SUCCESS && r2 == CUDA_SUCCESS && at != 0 &&
                in == at + 100 && (via == 0 || at == d[i]);
      if (!ok)
        printf("block %d at %p (%s): %d %#llx, +100: %d %#llx\n", i,
               (void *)p[i], via ? "looked up" : "called", (int)r1,
               (unsigned long long)at, (int)r2, (unsigned long long)in);
      expect(ok, "a live mapped block's device pointer");
      if (via == 0)
        d[i] = at;
    }
  }
  /* Unsigned: each difference is either the distance or wraps past it. */
  expect(d[1] - d[0] >= MP_QUERY_BYTES && d[0] - d[1] >= MP_QUERY_BYTES,
         "two live blocks have device pointers of their own");
  expect(cuMemFreeHost(p[0]) == CUDA_SUCCESS, "cuMemFreeHost");
  for (int via = 0; via < 2; via++) {
    CUdeviceptr at = 0;
    fn_t get = via ? (fn_t)looked : cuMemHostGetDevicePointer;
    CUresult r = get(&at, p[0], 0);
    if (r != CUDA_ERROR_INVALID_VALUE)
      printf("device pointer of a freed block (%s): %d %#llx\n",
             via ? "looked up" : "called", (int)r, (unsigned long long)at);
    expect(r == CUDA_ERROR_INVALID_VALUE,
           "a freed block has no device pointer (CUDA_ERROR_INVALID_VALUE)");
  }
  return query_done(p[1]);
}

/* cuMemGetAddressRange of live and freed page-locked blocks. */
static int addr_range(void) {
  typedef CUresult (*fn_t)(CUdeviceptr *, size_t *, CUdeviceptr);
  unsigned char *p[2] = {NULL, NULL};
  void *looked = NULL;
  if (!query_setup("cuMemGetAddressRange", p, &looked))
    return 1;
  for (int i = 0; i < 2; i++) {
    CUdeviceptr in = (CUdeviceptr)(uintptr_t)(p[i] + 100), start = 0;
    size_t attr_size = 0;
    expect(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                 in) == CUDA_SUCCESS &&
               cuPointerGetAttribute(&attr_size,
                                     CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                     in) == CUDA_SUCCESS,
           "cuPointerGetAttribute's range");
    for (int via = 0; via < 2; via++) {
      fn_t range = via ? (fn_t)looked : cuMemGetAddressRange;
      CUdeviceptr base = 0;
      size_t size = 0;
      CUresult r = range(&base, &size, in);
      bool ok = r == CUDA_SUCCESS && base == (CUdeviceptr)(uintptr_t)p[i] &&
                size >= MP_QUERY_BYTES && size < 65536 && base == start &&
                size == attr_size;
      if (!ok)
        printf("block %d at %p (%s): %d base %#llx size %zu; attribute "
               "start %#llx size %zu\n",
               i, (void *)p[i], via ? "looked up" : "called", (int)r,
               (unsigned long long)base, size, (unsigned long long)start,
               attr_size);
      expect(ok, "a page-locked block's address range is its allocation");
    }
  }
  expect(cuMemFreeHost(p[0]) == CUDA_SUCCESS, "cuMemFreeHost");
  for (int via = 0; via < 2; via++) {
    fn_t range = via ? (fn_t)looked : cuMemGetAddressRange;
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult r = range(&base, &size, (CUdeviceptr)(uintptr_t)p[0]);
    if (r != CUDA_ERROR_NOT_FOUND)
      printf("address range of a freed block (%s): %d base %#llx size %zu\n",
             via ? "looked up" : "called", (int)r, (unsigned long long)base,
             size);
    expect(r == CUDA_ERROR_NOT_FOUND,
           "a freed block has no address range (CUDA_ERROR_NOT_FOUND)");
  }
  return query_done(p[1]);
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 32;
  if (n < 1 || n > 100000)
    n = 32;
  CUdevice dev;
  CUcontext ctx;
  expect(cuInit(0) == CUDA_SUCCESS, "cuInit");
  expect(cuDeviceGet(&dev, 0) == CUDA_SUCCESS, "cuDeviceGet");
  expect(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS, "ctx");
  expect(cuCtxSetCurrent(ctx) == CUDA_SUCCESS, "set ctx");
  if (argc > 2 && strcmp(argv[2], "bad_flags") == 0) {
    /* Flags no driver knows are its invalid value, and nothing is
     * allocated. */
    void *p = (void *)0x1;
    expect(cuMemHostAlloc(&p, 4096, 0x80) == CUDA_ERROR_INVALID_VALUE,
           "cuMemHostAlloc with unknown flags is invalid value");
    expect(p == (void *)0x1, "nothing was written to *pp");
    if (failures == 0)
      printf("ok\n");
    return failures == 0 ? 0 : 1;
  }
  if (argc > 2 && strcmp(argv[2], "free_null") == 0) {
    /* cuMemFreeHost(NULL) is the driver's invalid value (the fake's, as
     * cuda.h lists no success for it), also where the shim serves pinned
     * memory from the host device. */
    expect(cuMemFreeHost(NULL) == CUDA_ERROR_INVALID_VALUE,
           "cuMemFreeHost(NULL) is invalid value");
    if (failures == 0)
      printf("ok\n");
    return failures == 0 ? 0 : 1;
  }
  if (argc > 2 && strcmp(argv[2], "other_device") == 0)
    return other_device();
  if (argc > 2 && strcmp(argv[2], "other_reset") == 0)
    return other_reset();
  if (argc > 2 && strcmp(argv[2], "devptr") == 0)
    return devptr();
  if (argc > 2 && strcmp(argv[2], "addr_range") == 0)
    return addr_range();
  if (argc > 2 && strcmp(argv[2], "capture_exit") == 0) {
    CUstream s;
    CUgraph g = NULL;
    void *h0 = NULL;
    expect(cuMemAllocHost(&h0, 4096) == CUDA_SUCCESS,
           "cuMemAllocHost before the capture");
    expect(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS,
           "stream");
    if (failures != 0)
      return 1;
    expect(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) ==
               CUDA_SUCCESS,
           "begin capture");
    expect(cuMemFreeHost(h0) == CUDA_SUCCESS, "cuMemFreeHost in the capture");
    expect(cuStreamEndCapture(s, &g) == CUDA_SUCCESS, "end capture");
    if (g != NULL)
      expect(cuGraphDestroy(g) == CUDA_SUCCESS, "graph destroy");
    expect(cuStreamDestroy(s) == CUDA_SUCCESS, "stream destroy");
    if (failures == 0)
      printf("ok\n");
    return failures == 0 ? 0 : 1;
  }
  if (argc > 3 && strcmp(argv[2], "capture") == 0) {
    bool global = strcmp(argv[3], "global") == 0;
    CUstream s;
    CUgraph g = NULL;
    unsigned char *h0 = NULL, *h = NULL, *h2 = NULL;
    expect(cuMemAllocHost((void **)&h0, 4096) == CUDA_SUCCESS,
           "cuMemAllocHost before the capture");
    expect(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS,
           "stream");
    if (failures != 0)
      return 1;
    memset(h0, 7, 4096);
    expect(cuStreamBeginCapture(s, global ? CU_STREAM_CAPTURE_MODE_GLOBAL
                                          : CU_STREAM_CAPTURE_MODE_RELAXED) ==
               CUDA_SUCCESS,
           "begin capture");
    CUresult a = cuMemAllocHost((void **)&h, 4096);
    CUresult f = cuMemFreeHost(h0);
    CUresult e = cuStreamEndCapture(s, &g);
    printf("in capture: alloc %d free %d, end %d\n", (int)a, (int)f, (int)e);
    CUresult want =
        global ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
    expect(a == want, "cuMemAllocHost during the capture");
    expect(f == want, "cuMemFreeHost during the capture");
    expect(e == (global ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS),
           "the capture's end");
    if (g != NULL)
      expect(cuGraphDestroy(g) == CUDA_SUCCESS, "graph destroy");
    if (h != NULL) {
      memset(h, 8, 4096);
      expect(cuMemFreeHost(h) == CUDA_SUCCESS, "free after the capture");
    }
    /* h0 once: freed in the capture (relaxed), or still live (global). */
    expect((cuMemFreeHost(h0) == CUDA_SUCCESS) == global,
           "h0 is freed exactly once");
    expect(cuMemAllocHost((void **)&h2, 4096) == CUDA_SUCCESS,
           "cuMemAllocHost after the capture");
    if (h2 != NULL) {
      memset(h2, 9, 4096);
      expect(cuMemFreeHost(h2) == CUDA_SUCCESS, "cuMemFreeHost after");
    }
    expect(cuStreamDestroy(s) == CUDA_SUCCESS, "stream destroy");
    if (failures == 0)
      printf("ok\n");
    return failures == 0 ? 0 : 1;
  }
  if (argc > 2 && strcmp(argv[2], "range") == 0) {
    unsigned char *p[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
      expect(cuMemHostAlloc((void **)&p[i], 4096, 0) == CUDA_SUCCESS &&
                 p[i] != NULL,
             "cuMemHostAlloc");
      if (p[i] == NULL)
        return 1;
    }
    for (int i = 0; i < 2; i++) {
      CUdeviceptr start = 0, start2 = 0;
      size_t size = 0, size2 = 0;
      CUresult r1 =
          cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                (CUdeviceptr)(uintptr_t)(p[i] + 100));
      CUresult r2 =
          cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                (CUdeviceptr)(uintptr_t)(p[i] + 100));
      CUpointer_attribute at[2] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                   CU_POINTER_ATTRIBUTE_RANGE_SIZE};
      void *data[2] = {&start2, &size2};
      CUresult r3 = cuPointerGetAttributes(
          2, at, data, (CUdeviceptr)(uintptr_t)(p[i] + 100));
      bool ok = r1 == CUDA_SUCCESS && r2 == CUDA_SUCCESS &&
                r3 == CUDA_SUCCESS && start == (CUdeviceptr)(uintptr_t)p[i] &&
                start2 == start && size >= 4096 && size < 65536 &&
                size2 == size;
      if (!ok)
        printf("block %d at %p: range %d/%d start %#llx size %zu, plural %d "
               "start %#llx size %zu\n",
               i, (void *)p[i], (int)r1, (int)r2, (unsigned long long)start,
               size, (int)r3, (unsigned long long)start2, size2);
      expect(ok, "a page-locked block's range is its allocation");
    }
    expect(cuMemFreeHost(p[0]) == CUDA_SUCCESS, "cuMemFreeHost");
    CUdeviceptr start = 0;
    CUresult r =
        cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                              (CUdeviceptr)(uintptr_t)p[0]);
    if (r != CUDA_ERROR_INVALID_VALUE)
      printf("range of a freed block: %d start %#llx\n", (int)r,
             (unsigned long long)start);
    expect(r == CUDA_ERROR_INVALID_VALUE,
           "a freed block has no range (CUDA_ERROR_INVALID_VALUE)");
    expect(cuMemFreeHost(p[1]) == CUDA_SUCCESS, "cuMemFreeHost");
    if (failures == 0)
      printf("ok\n");
    return failures == 0 ? 0 : 1;
  }
  if (argc > 2 && strcmp(argv[2], "flags") == 0) {
    unsigned int asked[] = {0, CU_MEMHOSTALLOC_PORTABLE,
                            CU_MEMHOSTALLOC_DEVICEMAP, 0};
    unsigned char *p[4] = {NULL};
    for (int i = 0; i < 4; i++) {
      CUresult r = i < 3 ? cuMemHostAlloc((void **)&p[i], 4096, asked[i])
                         : cuMemAllocHost((void **)&p[i], 4096);
      expect(r == CUDA_SUCCESS && p[i] != NULL, "page-locked allocation");
      if (p[i] == NULL)
        return 1;
    }
    for (int i = 0; i < 4; i++) {
      unsigned int f = 99, g = 99;
      CUresult r = cuMemHostGetFlags(&f, p[i]);
      CUresult r2 = cuMemHostGetFlags(&g, p[i] + 100);
      if (r != CUDA_SUCCESS || f != asked[i] || g != asked[i])
        printf("block %d asked for flags %u: cuMemHostGetFlags %d gives %u, "
               "inside %d gives %u\n",
               i, asked[i], (int)r, f, (int)r2, g);
      expect(r == CUDA_SUCCESS && r2 == CUDA_SUCCESS && f == asked[i] &&
                 g == asked[i],
             "cuMemHostGetFlags gives the flags asked for");
    }
    expect(cuMemFreeHost(p[0]) == CUDA_SUCCESS, "cuMemFreeHost");
    unsigned int f = 99;
    CUresult r = cuMemHostGetFlags(&f, p[0]);
    if (r != CUDA_ERROR_INVALID_VALUE)
      printf("cuMemHostGetFlags of a freed block: %d (flags %u)\n", (int)r, f);
    expect(r == CUDA_ERROR_INVALID_VALUE,
           "a freed block has no flags (CUDA_ERROR_INVALID_VALUE)");
    for (int i = 1; i < 4; i++)
      expect(cuMemFreeHost(p[i]) == CUDA_SUCCESS, "cuMemFreeHost");
    if (failures == 0)
      printf("ok\n");
    return failures == 0 ? 0 : 1;
  }
  if (argc > 2 && strcmp(argv[2], "mapped") == 0) {
    unsigned int flags[] = {CU_MEMHOSTALLOC_DEVICEMAP,
                            CU_MEMHOSTALLOC_DEVICEMAP |
                                CU_MEMHOSTALLOC_PORTABLE};
    for (int i = 0; i < 2; i++) {
      unsigned char *p = NULL;
      expect(cuMemHostAlloc((void **)&p, 4096, flags[i]) == CUDA_SUCCESS,
             "cuMemHostAlloc(DEVICEMAP)");
      if (p == NULL)
        return 1;
      CUdeviceptr d = 0;
      CUresult r = cuMemHostGetDevicePointer(&d, p, 0);
      if (r != CUDA_SUCCESS)
        printf("cuMemHostGetDevicePointer: error %d\n", (int)r);
      expect(r == CUDA_SUCCESS && d != 0,
             "a mapped block has a device pointer");
      r = cuMemHostGetDevicePointer(&d, p + 100, 0);
      expect(r == CUDA_SUCCESS && d != 0,
             "an address inside a mapped block has a device pointer");
      expect(cuMemFreeHost(p) == CUDA_SUCCESS, "cuMemFreeHost");
    }
    if (failures == 0)
      printf("ok\n");
    return failures == 0 ? 0 : 1;
  }
  if (argc > 3 && strcmp(argv[2], "late_runtime") == 0) {
    void *p = NULL, *q = NULL;
    expect(cuMemHostAlloc(&p, 4096, CU_MEMHOSTALLOC_WRITECOMBINED) ==
               CUDA_SUCCESS,
           "cuMemHostAlloc (write-combined)");
    expect(cuMemFreeHost(p) == CUDA_SUCCESS, "cuMemFreeHost");
    void *h = dlopen(argv[3], RTLD_NOW | RTLD_GLOBAL);
    expect(h != NULL, "dlopen of the late runtime");
    unsigned int (*rt_malloc)(void **, size_t) = NULL;
    if (h != NULL)
      *(void **)&rt_malloc = dlsym(h, "cudaMalloc");
    expect(rt_malloc != NULL, "dlsym(cudaMalloc)");
    if (rt_malloc != NULL) {
      unsigned int e = rt_malloc(&q, 16);
      printf("late_cudaMalloc=%u\n", e);
      expect(e == 0 && q != NULL,
             "cudaMalloc of the runtime loaded late reached it");
    }
    if (failures == 0)
      printf("ok\n");
    return failures == 0 ? 0 : 1;
  }
  if (argc > 2 && strcmp(argv[2], "proc") == 0) {
    /* The page-locked entry points cuGetProcAddress answers (as nvcc's
     * static runtime and cuda-python find every driver function) free what
     * the directly called ones allocated, and the other way round. */
    typedef CUresult (*alloc_fn)(void **, size_t);
    typedef CUresult (*halloc_fn)(void **, size_t, unsigned int);
    typedef CUresult (*free_fn)(void *);
    void *fa = NULL, *fh = NULL, *ff = NULL;
    expect(cuGetProcAddress("cuMemAllocHost", &fa, 3020,
                            CU_GET_PROC_ADDRESS_DEFAULT,
                            NULL) == CUDA_SUCCESS &&
               fa != NULL,
           "cuGetProcAddress(cuMemAllocHost)");
    expect(cuGetProcAddress("cuMemHostAlloc", &fh, 2020,
                            CU_GET_PROC_ADDRESS_DEFAULT,
                            NULL) == CUDA_SUCCESS &&
               fh != NULL,
           "cuGetProcAddress(cuMemHostAlloc)");
    expect(cuGetProcAddress("cuMemFreeHost", &ff, 2000,
                            CU_GET_PROC_ADDRESS_DEFAULT,
                            NULL) == CUDA_SUCCESS &&
               ff != NULL,
           "cuGetProcAddress(cuMemFreeHost)");
    if (failures != 0)
      return 1;
    void *p[6] = {NULL};
    for (int i = 0; i < 6; i++) {
      CUresult r = i % 3 == 0   ? cuMemAllocHost(&p[i], 4096)
                   : i % 3 == 1 ? ((alloc_fn)fa)(&p[i], 4096)
                                : ((halloc_fn)fh)(&p[i], 4096, 0);
      expect(r == CUDA_SUCCESS && p[i] != NULL, "page-locked allocation");
      if (p[i] != NULL)
        memset(p[i], 0x11 * (i + 1), 4096);
    }
    for (int i = 0; i < 6; i++) {
      if (p[i] == NULL)
        continue;
      expect(((unsigned char *)p[i])[4095] == 0x11 * (i + 1), "contents");
      /* the even ones with the looked-up free, the odd ones called */
      CUresult r = i % 2 == 0 ? ((free_fn)ff)(p[i]) : cuMemFreeHost(p[i]);
      if (r != CUDA_SUCCESS)
        printf("free %d: error %d\n", i, (int)r);
      expect(r == CUDA_SUCCESS, "cuMemFreeHost of a page-locked block");
    }
    printf("driver_host_allocs=%lld\n",
           calls("cuMemHostAlloc") + calls("cuMemAllocHost_v2"));
    if (failures == 0)
      printf("ok\n");
    return failures == 0 ? 0 : 1;
  }
  if (argc > 2 && strcmp(argv[2], "device_free") == 0)
    return device_free(argc > 3 ? argv[3] : NULL);
  if (argc > 2 && strcmp(argv[2], "double_free") == 0) {
    /* A second cuMemFreeHost is the driver's error, and what comes next
     * still works. */
    void *p = NULL;
    expect(cuMemAllocHost(&p, 4096) == CUDA_SUCCESS, "cuMemAllocHost");
    expect(cuMemFreeHost(p) == CUDA_SUCCESS, "cuMemFreeHost");
    expect(cuMemFreeHost(p) != CUDA_SUCCESS,
           "a second cuMemFreeHost of the same block is refused");
    still_serves(0x3d);
    if (failures == 0)
      printf("ok\n");
    return failures == 0 ? 0 : 1;
  }
  const char *pre = getenv("LD_PRELOAD");
  expect(in_shim(dlsym(RTLD_DEFAULT, "cuMemHostAlloc")) ==
             (pre != NULL && pre[0] != '\0'),
         "cuMemHostAlloc resolves to the shim exactly when it is preloaded");
  for (int i = 0; i < 2 * n && failures == 0; i++) {
    size_t bytes = (size_t)(i % 5 + 1) * 12345;
    void *p = NULL;
    CUresult r = i % 2 ? cuMemAllocHost(&p, bytes)
                       : cuMemHostAlloc(&p, bytes, CU_MEMHOSTALLOC_PORTABLE);
    expect(r == CUDA_SUCCESS && p != NULL, "page-locked allocation");
    if (p == NULL)
      break;
    memset(p, 0x5c, bytes);
    expect(((unsigned char *)p)[bytes - 1] == 0x5c, "contents");
    expect(cuMemFreeHost(p) == CUDA_SUCCESS, "cuMemFreeHost");
  }
  long long a0 = calls("cuMemHostAlloc"), f0 = calls("cuMemFreeHost");
  void *wc = NULL;
  expect(cuMemHostAlloc(&wc, 4096, CU_MEMHOSTALLOC_WRITECOMBINED) ==
             CUDA_SUCCESS,
         "write-combined cuMemHostAlloc");
  expect(!counted() || calls("cuMemHostAlloc") == a0 + 1,
         "write-combined memory comes from the driver");
  expect(cuMemFreeHost(wc) == CUDA_SUCCESS, "cuMemFreeHost(write-combined)");
  expect(!counted() || calls("cuMemFreeHost") == f0 + 1,
         "a pointer the pool did not hand out goes to the driver");
  size_t rn = 3 * 4096;
  unsigned char *reg = aligned_alloc(4096, rn);
  CUdeviceptr d = 0;
  long long r0 = calls("cuMemHostRegister_v2"),
            u0 = calls("cuMemHostUnregister");
  expect(reg != NULL &&
             cuMemHostRegister(reg, rn, CU_MEMHOSTREGISTER_PORTABLE) ==
                 CUDA_SUCCESS,
         "cuMemHostRegister");
  expect(!counted() || calls("cuMemHostRegister_v2") == r0 + 1,
         "cuMemHostRegister reaches the driver");
  expect(cuMemHostRegister(reg, rn, 0) ==
             CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
         "registering twice is the driver's error");
  memset(reg, 0xa7, rn);
  expect(cuMemAlloc(&d, rn) == CUDA_SUCCESS, "cuMemAlloc");
  expect(cuMemcpyHtoD(d, reg, rn) == CUDA_SUCCESS, "copy from registered");
  memset(reg, 0, rn);
  expect(cuMemcpyDtoH(reg, d, rn) == CUDA_SUCCESS, "copy to registered");
  expect(reg[0] == 0xa7 && reg[rn - 1] == 0xa7, "registered contents");
  expect(cuMemFree(d) == CUDA_SUCCESS, "cuMemFree");
  expect(cuMemHostUnregister(reg) == CUDA_SUCCESS, "cuMemHostUnregister");
  expect(!counted() || calls("cuMemHostUnregister") == u0 + 1,
         "cuMemHostUnregister reaches the driver");
  printf("registered=%llu ", (unsigned long long)(uintptr_t)reg);
  free(reg);
  printf("driver_host_allocs=%lld driver_host_frees=%lld\n",
         calls("cuMemHostAlloc") + calls("cuMemAllocHost_v2"),
         calls("cuMemFreeHost"));
  if (failures == 0)
    printf("ok\n");
  return failures == 0 ? 0 : 1;
}
