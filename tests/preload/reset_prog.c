/* reset_prog.c - a driver-API program that resets the device's primary
 * context (cuDevicePrimaryCtxReset, what cudaDeviceReset does) while it
 * holds device memory, linked with the fake libcuda.so.1 (tests/fakecuda),
 * run with or without the shim (and on a GPU by tests/preload/gpu).
 *
 * cuda.h, cuDevicePrimaryCtxReset: "Destroy all allocations and reset all
 * state on the primary context." So a block allocated before the reset is
 * no longer the program's: cuMemFree of it is refused, as for any pointer
 * the driver does not know; and what the program allocates after it (in
 * the primary context retained again) is memory that holds what is
 * written to it, never the destroyed memory of before.
 * With the argument "proc" the reset is the one cuGetProcAddress answers
 * for "cuDevicePrimaryCtxReset" at CUDA 11.0, as cudaDeviceReset finds it.
 * With "old" the reset is the unversioned symbol cuDevicePrimaryCtxReset
 * (the original, before CUDA 11.0's _v2: cuda.h maps the name to _v2 by a
 * macro, so only a binary built before 11.0 calls it), linked directly,
 * and with "proc_old" the one cuGetProcAddress answers at CUDA 10.0.
 * With "many" it resets MP_RESETS times, each time after allocating (a
 * block kept live, one freed), and the process's heap (mallinfo2: what
 * malloc has handed out and not had back) must not grow with the number
 * of resets: nothing of a reset context is kept for good. With
 * "many_graph" each round also captures a graph on a non-blocking stream
 * (stream-ordered allocations freed inside the capture, and an output the
 * program frees after the launch), instantiates and launches it, resets with
 * the graph and its executable alive, and only then destroys them (the fake
 * driver's graphs outlive the context; this mode is not for a GPU). Every
 * "many" round also holds page-locked memory (cuMemHostAlloc) across the reset,
 * one block live and one freed. With "pinned" the reset destroys page-locked
 * memory too (cuda_runtime_api.h, cudaDeviceReset: the resources destroyed
 * "also include memory allocations by ::cudaMalloc, ::cudaMallocHost, ..."): a
 * page-locked block from before is no longer the program's (on the fake,
 * its cuMemFreeHost is refused), and a page-locked allocation after the
 * reset is new memory of the driver's (on the fake, the first one costs a
 * cuMemHostAlloc of its own: none from before is left to serve it) that
 * carries what is written to it through a copy to the device and back.
 * With "pinned_wc" the page-locked block held across the reset is
 * write-combined (CU_MEMHOSTALLOC_WRITECOMBINED), which the shim leaves to
 * the driver: after the reset its cuMemFreeHost is refused too (on the
 * fake), and another write-combined block is allocated, written and freed.
 * With "real_dev" the block held across the reset is device memory from
 * cuMemAlloc (under MEMPOOL_PRELOAD=passthrough, the driver's own): after
 * the reset its cuMemFree is refused, and another block is allocated,
 * written and freed.
 * Prints "ok" and exits 0, or says what broke and exits 1. */
#include <cuda.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "prog_try.h"

/* The fake's count of its own entry point; absent on a real driver (the
 * GPU twin in gpu/run_gpu.sh), where the checks on counts are left out. */
__attribute__((weak)) long long cuFakeGetCallCount(const char *name);

#define MP_BYTES (1u << 20)

static int start(CUcontext *ctx) {
  MP_TRY(cuDevicePrimaryCtxRetain(ctx, 0));
  MP_TRY(cuCtxSetCurrent(*ctx));
  return 0;
}

typedef CUresult (*reset_fn)(CUdevice);
/* The original symbol, as a binary built before CUDA 11.0 links it. */
CUresult old_reset(CUdevice dev) __asm__("cuDevicePrimaryCtxReset");

#define MP_WARMUP 8
#define MP_RESETS 200
/* Heap growth allowed over MP_RESETS resets after the warm-up: what the
 * program and the driver keep of a reset for good must stay well below a
 * pool's own records (a host pool kept at each reset grows the heap by
 * some 57 KiB a reset on the fake). The fake driver keeps a record of every
 * stream it ever made (under 300 bytes): a round makes up to two, the
 * program's (many_graph) and the shim's host pool's. */
#define MP_GROWTH_MAX ((size_t)MP_RESETS * 1024u)

/* A graph captured on s: a temporary allocated, written and freed on s,
 * and an output allocated and written, which the program frees after the
 * launch (a graph allocation: cuda.h, cuGraphLaunch), so that the graph
 * lives across the reset with its output not allocated. The shim kept the
 * device's pool for good at such a reset before 2026-12-01 (the graph
 * pool still held the output's block): the heap grew with every reset. */
static int capture(CUstream s, CUgraph *g, CUgraphExec *x) {
  CUdeviceptr tmp, out;
  MP_TRY(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  MP_TRY(cuMemAllocAsync(&out, MP_BYTES / 4, s));
  MP_TRY(cuMemAllocAsync(&tmp, MP_BYTES, s));
  MP_TRY(cuMemsetD8Async(tmp, 2, MP_BYTES, s));
  MP_TRY(cuMemsetD8Async(out, 4, MP_BYTES / 4, s));
  MP_TRY(cuMemFreeAsync(tmp, s));
  MP_TRY(cuStreamEndCapture(s, g));
  MP_TRY(cuGraphInstantiate(x, *g, 0));
  MP_TRY(cuGraphLaunch(*x, s));
  MP_TRY(cuMemFreeAsync(out, s));
  MP_TRY(cuStreamSynchronize(s));
  return 0;
}

static int many_resets(bool graph) {
  CUcontext ctx;
  size_t before = 0;
  for (int i = 0; i < MP_WARMUP + MP_RESETS; i++) {
    CUdeviceptr live, cached;
    void *pinned_live, *pinned_cached;
    CUstream s;
    CUgraph g = NULL;
    CUgraphExec x = NULL;
    if (i == MP_WARMUP)
      before = mallinfo2().uordblks;
    if (start(&ctx) != 0)
      return 1;
    MP_TRY(cuMemAlloc(&live, MP_BYTES));
    MP_TRY(cuMemAlloc(&cached, MP_BYTES / 2));
    MP_TRY(cuMemsetD8(live, 1, MP_BYTES));
    MP_TRY(cuMemFree(cached));
    MP_TRY(cuMemHostAlloc(&pinned_live, MP_BYTES / 4, 0));
    MP_TRY(cuMemHostAlloc(&pinned_cached, MP_BYTES / 4, 0));
    memset(pinned_live, 3, MP_BYTES / 4);
    MP_TRY(cuMemFreeHost(pinned_cached));
    if (graph) {
      MP_TRY(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
      if (capture(s, &g, &x) != 0)
        return 1;
      MP_TRY(cuStreamDestroy(s));
    }
    MP_TRY(cuDevicePrimaryCtxReset(0));
    if (graph) {
      if (start(&ctx) != 0)
        return 1;
      MP_TRY(cuGraphExecDestroy(x));
      MP_TRY(cuGraphDestroy(g));
      MP_TRY(cuDevicePrimaryCtxRelease(0));
    }
    MP_TRY(cuDevicePrimaryCtxRelease(0));
  }
  size_t after = mallinfo2().uordblks;
  /* 0 and 0: an allocator that does not say (a sanitizer's). */
  if (after > before && after - before > MP_GROWTH_MAX) {
    printf("the heap grew by %zu bytes over %d resets (at most %zu "
           "allowed)\n",
           after - before, MP_RESETS, MP_GROWTH_MAX);
    return 1;
  }
  puts("ok");
  return 0;
}

/* The fake's page-locked allocations so far (cuMemHostAlloc and
 * cuMemAllocHost_v2 calls); 0 on a real driver. */
static long long driver_pins(void) {
  return cuFakeGetCallCount ? cuFakeGetCallCount("cuMemHostAlloc") +
                                  cuFakeGetCallCount("cuMemAllocHost_v2")
                            : 0;
}

/* Page-locked memory across a reset (see "pinned" above). */
static int pinned_reset(void) {
  static unsigned char seen[MP_BYTES];
  CUcontext ctx;
  CUdeviceptr dev;
  void *live, *cached, *after;
  if (start(&ctx) != 0)
    return 1;
  MP_TRY(cuMemHostAlloc(&live, MP_BYTES / 4, CU_MEMHOSTALLOC_PORTABLE));
  MP_TRY(cuMemHostAlloc(&cached, MP_BYTES / 4, 0));
  memset(live, 1, MP_BYTES / 4);
  MP_TRY(cuMemFreeHost(cached)); /* a pool keeps it */
  MP_TRY(cuDevicePrimaryCtxReset(0));
  if (start(&ctx) != 0)
    return 1;
  if (cuFakeGetCallCount != NULL) {
    CUresult r = cuMemFreeHost(live);
    if (r != CUDA_ERROR_INVALID_VALUE) {
      printf("cuMemFreeHost of page-locked memory the reset destroyed: "
             "error %d, not refused\n",
             (int)r);
      return 1;
    }
  }
  MP_TRY(cuMemAlloc(&dev, MP_BYTES));
  for (int i = 0; i < 4; i++) {
    long long before = driver_pins();
    MP_TRY(cuMemAllocHost(&after, MP_BYTES));
    if (i == 0 && cuFakeGetCallCount != NULL && driver_pins() == before) {
      printf("the first page-locked allocation after the reset (%p) was "
             "served without the driver: from memory the reset "
             "destroyed\n",
             after);
      return 1;
    }
    memset(after, 0x50 + i, MP_BYTES);
    MP_TRY(cuMemcpyHtoD(dev, after, MP_BYTES));
    memset(after, 0, MP_BYTES);
    MP_TRY(cuMemcpyDtoH(after, dev, MP_BYTES));
    memcpy(seen, after, MP_BYTES);
    for (size_t k = 0; k < MP_BYTES; k++)
      if (seen[k] != (unsigned char)(0x50 + i)) {
        printf("byte %zu of page-locked memory after the reset reads %d\n", k,
               seen[k]);
        return 1;
      }
    MP_TRY(cuMemFreeHost(after));
  }
  MP_TRY(cuMemFree(dev));
  MP_TRY(cuCtxSynchronize());
  MP_TRY(cuDevicePrimaryCtxRelease(0));
  puts("ok");
  return 0;
}

/* Write-combined page-locked memory across a reset (see "pinned_wc"). */
static int pinned_wc_reset(void) {
  CUcontext ctx;
  void *wc, *again;
  if (start(&ctx) != 0)
    return 1;
  MP_TRY(cuMemHostAlloc(&wc, MP_BYTES, CU_MEMHOSTALLOC_WRITECOMBINED));
  memset(wc, 1, MP_BYTES);
  MP_TRY(cuDevicePrimaryCtxReset(0));
  if (start(&ctx) != 0)
    return 1;
  if (cuFakeGetCallCount != NULL) {
    CUresult r = cuMemFreeHost(wc);
    if (r != CUDA_ERROR_INVALID_VALUE) {
      printf("cuMemFreeHost of write-combined memory the reset destroyed: "
             "error %d, not refused\n",
             (int)r);
      return 1;
    }
  }
  MP_TRY(cuMemHostAlloc(&again, MP_BYTES, CU_MEMHOSTALLOC_WRITECOMBINED));
  memset(again, 2, MP_BYTES);
  MP_TRY(cuMemFreeHost(again));
  MP_TRY(cuCtxSynchronize());
  MP_TRY(cuDevicePrimaryCtxRelease(0));
  puts("ok");
  return 0;
}

/* Device memory across a reset, with nothing else live (see "real_dev"). */
static int real_dev_reset(void) {
  CUcontext ctx;
  CUdeviceptr live, again;
  if (start(&ctx) != 0)
    return 1;
  MP_TRY(cuMemAlloc(&live, MP_BYTES));
  MP_TRY(cuMemsetD8(live, 1, MP_BYTES));
  MP_TRY(cuDevicePrimaryCtxReset(0));
  if (start(&ctx) != 0)
    return 1;
  CUresult r = cuMemFree(live);
  if (r != CUDA_ERROR_INVALID_VALUE && r != CUDA_ERROR_INVALID_CONTEXT) {
    printf("cuMemFree of device memory the reset destroyed: error %d, not "
           "refused\n",
           (int)r);
    return 1;
  }
  MP_TRY(cuMemAlloc(&again, MP_BYTES));
  MP_TRY(cuMemsetD8(again, 2, MP_BYTES));
  MP_TRY(cuMemFree(again));
  MP_TRY(cuCtxSynchronize());
  MP_TRY(cuDevicePrimaryCtxRelease(0));
  puts("ok");
  return 0;
}

int main(int argc, char **argv) {
  static unsigned char seen[MP_BYTES];
  reset_fn reset = cuDevicePrimaryCtxReset;
  CUcontext ctx;
  CUdeviceptr live, cached, after;
  MP_TRY(cuInit(0));
  if (argc > 1 && strncmp(argv[1], "many", 4) == 0)
    return many_resets(strcmp(argv[1], "many_graph") == 0);
  if (argc > 1 && strcmp(argv[1], "pinned") == 0)
    return pinned_reset();
  if (argc > 1 && strcmp(argv[1], "pinned_wc") == 0)
    return pinned_wc_reset();
  if (argc > 1 && strcmp(argv[1], "real_dev") == 0)
    return real_dev_reset();
  if (start(&ctx) != 0)
    return 1;
  if (argc > 1 &&
      (strcmp(argv[1], "proc") == 0 || strcmp(argv[1], "proc_old") == 0)) {
    void *fn = NULL;
    MP_TRY(cuGetProcAddress("cuDevicePrimaryCtxReset", &fn,
                            strcmp(argv[1], "proc") == 0 ? 11000 : 10000,
                            CU_GET_PROC_ADDRESS_DEFAULT, NULL));
    reset = (reset_fn)fn;
  }
  if (argc > 1 && strcmp(argv[1], "old") == 0)
    reset = old_reset;
  MP_TRY(cuMemAlloc(&live, MP_BYTES));
  MP_TRY(cuMemAlloc(&cached, MP_BYTES));
  MP_TRY(cuMemFree(cached)); /* a pool keeps it */
  MP_TRY(reset(0));
  if (start(&ctx) != 0)
    return 1;
  CUresult r = cuMemFree(live);
  if (r != CUDA_ERROR_INVALID_VALUE && r != CUDA_ERROR_INVALID_CONTEXT) {
    printf("cuMemFree of a block the reset destroyed: error %d, not "
           "refused\n",
           (int)r);
    return 1;
  }
  for (int i = 0; i < 4; i++) {
    MP_TRY(cuMemAlloc(&after, MP_BYTES));
    MP_TRY(cuMemsetD8(after, (unsigned char)(0x40 + i), MP_BYTES));
    memset(seen, 0, sizeof seen);
    MP_TRY(cuMemcpyDtoH(seen, after, MP_BYTES));
    for (size_t k = 0; k < MP_BYTES; k++)
      if (seen[k] != (unsigned char)(0x40 + i)) {
        printf("byte %zu of an allocation after the reset reads %d\n", k,
               seen[k]);
        return 1;
      }
    CUdeviceptr base = 0;
    size_t size = 0;
    MP_TRY(cuMemGetAddressRange(&base, &size, after));
    MP_TRY(cuMemFree(after));
  }
  MP_TRY(cuCtxSynchronize());
  MP_TRY(cuDevicePrimaryCtxRelease(0));
  puts("ok");
  return 0;
}
