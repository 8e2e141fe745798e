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
 * With "many" it resets MP_RESETS times, each time after allocating (a
 * block kept live, one freed), and the process's heap (mallinfo2: what
 * malloc has handed out and not had back) must not grow with the number
 * of resets: nothing of a reset context is kept for good. With
 * "many_graph" each round also captures a graph on a non-blocking stream
 * (stream-ordered allocations freed inside the capture), instantiates and
 * launches it, resets with the graph and its executable alive, and only
 * then destroys them (the fake driver's graphs outlive the context; this
 * mode is not for a GPU).
 * Prints "ok" and exits 0, or says what broke and exits 1. */
#include <cuda.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "prog_try.h"

#define MP_BYTES (1u << 20)

static int start(CUcontext *ctx) {
  MP_TRY(cuDevicePrimaryCtxRetain(ctx, 0));
  MP_TRY(cuCtxSetCurrent(*ctx));
  return 0;
}

typedef CUresult (*reset_fn)(CUdevice);

#define MP_WARMUP 8
#define MP_RESETS 200
/* Heap growth allowed over MP_RESETS resets after the warm-up: what the
 * program and the driver keep of a reset for good must stay well below a
 * pool's own records (the fake driver keeps a small record of every stream
 * it ever made). */
#define MP_GROWTH_MAX ((size_t)MP_RESETS * 512u)

/* A graph captured on s: a temporary allocated, written and freed on s. */
static int capture(CUstream s, CUgraph *g, CUgraphExec *x) {
  CUdeviceptr tmp;
  MP_TRY(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  MP_TRY(cuMemAllocAsync(&tmp, MP_BYTES, s));
  MP_TRY(cuMemsetD8Async(tmp, 2, MP_BYTES, s));
  MP_TRY(cuMemFreeAsync(tmp, s));
  MP_TRY(cuStreamEndCapture(s, g));
  MP_TRY(cuGraphInstantiate(x, *g, 0));
  MP_TRY(cuGraphLaunch(*x, s));
  MP_TRY(cuStreamSynchronize(s));
  return 0;
}

static int many_resets(bool graph) {
  CUcontext ctx;
  size_t before = 0;
  for (int i = 0; i < MP_WARMUP + MP_RESETS; i++) {
    CUdeviceptr live, cached;
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

int main(int argc, char **argv) {
  static unsigned char seen[MP_BYTES];
  reset_fn reset = cuDevicePrimaryCtxReset;
  CUcontext ctx;
  CUdeviceptr live, cached, after;
  MP_TRY(cuInit(0));
  if (argc > 1 && strncmp(argv[1], "many", 4) == 0)
    return many_resets(strcmp(argv[1], "many_graph") == 0);
  if (start(&ctx) != 0)
    return 1;
  if (argc > 1 && strcmp(argv[1], "proc") == 0) {
    void *fn = NULL;
    MP_TRY(cuGetProcAddress("cuDevicePrimaryCtxReset", &fn, 11000,
                            CU_GET_PROC_ADDRESS_DEFAULT, NULL));
    reset = (reset_fn)fn;
  }
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
