/* rules_prog.c - the issue-9 reproducer: a driver-API program that relies
 * on cuMemFree keeping CUDA's ordering, linked with the fake libcuda.so.1
 * (tests/fakecuda), run with or without the shim.
 *
 * A "kernel" (a host function on non-blocking stream n1) sleeps, then reads
 * its buffer; the program frees the buffer (cuMemFree waits for all work
 * of the context, or may: cuda.h), allocates the same size again and
 * memsets the new buffer on a second non-blocking stream n2. The kernel
 * must still read what was there before the free.
 * With the argument "streams" it instead creates, uses (cuMemAllocAsync and
 * cuMemFreeAsync) and destroys 70 000 streams one after another, more than
 * a pool's stream table holds at once, with a cuMemAlloc / cuMemFree pair
 * now and then, and checks with the fake's error counter that nobody used
 * a destroyed handle.
 * Prints "ok" and exits 0, or says what broke and exits 1. */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "prog_try.h"

#define MP_BYTES (1u << 20)

typedef struct {
  CUdeviceptr p;
  atomic_int seen;
} read_t;

static void slow_read(void *arg) {
  read_t *r = arg;
  usleep(150000);
  atomic_store(&r->seen, *(volatile unsigned char *)(uintptr_t)r->p);
}

/* The fake's test hook; absent from a real driver (the GPU run). */
__attribute__((weak)) long long cuFakeGetErrorCount(CUresult r);

static long long bad_handles(void) {
  return cuFakeGetErrorCount ? cuFakeGetErrorCount(CUDA_ERROR_INVALID_HANDLE)
                             : 0;
}

static int many_streams(void) {
  long long bad = bad_handles();
  for (int i = 0; i < 70000; i++) {
    CUstream s;
    CUdeviceptr p;
    MP_TRY(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    MP_TRY(cuMemAllocAsync(&p, 4096, s));
    MP_TRY(cuMemFreeAsync(p, s));
    MP_TRY(cuStreamDestroy(s));
    /* cuMemFree waits for every stream the pool knows: none of them may
     * be a destroyed one. */
    if (i % 1000 == 0) {
      MP_TRY(cuMemAlloc(&p, 4096));
      MP_TRY(cuMemFree(p));
    }
  }
  MP_TRY(cuCtxSynchronize());
  if (bad_handles() != bad) {
    printf("a destroyed stream's handle was used %lld times\n",
           bad_handles() - bad);
    return 1;
  }
  puts("ok");
  return 0;
}

int main(int argc, char **argv) {
  CUcontext ctx;
  CUstream n1, n2;
  CUdeviceptr q;
  read_t rd = {0};
  MP_TRY(cuInit(0));
  MP_TRY(cuDevicePrimaryCtxRetain(&ctx, 0));
  MP_TRY(cuCtxPushCurrent(ctx));
  if (argc > 1 && strcmp(argv[1], "streams") == 0)
    return many_streams();
  MP_TRY(cuStreamCreate(&n1, CU_STREAM_NON_BLOCKING));
  MP_TRY(cuStreamCreate(&n2, CU_STREAM_NON_BLOCKING));
  MP_TRY(cuMemAlloc(&rd.p, MP_BYTES));
  MP_TRY(cuMemsetD8(rd.p, 1, MP_BYTES));
  MP_TRY(cuLaunchHostFunc(n1, slow_read, &rd));
  MP_TRY(cuMemFree(rd.p));
  MP_TRY(cuMemAlloc(&q, MP_BYTES));
  MP_TRY(cuMemsetD8Async(q, 2, MP_BYTES, n2));
  MP_TRY(cuCtxSynchronize());
  if (atomic_load(&rd.seen) != 1) {
    printf("the kernel on n1 read %d, not 1: the freed buffer was reused "
           "(new buffer %s the old) and overwritten on n2 under it\n",
           atomic_load(&rd.seen), q == rd.p ? "==" : "!=");
    return 1;
  }
  MP_TRY(cuMemFree(q));
  MP_TRY(cuStreamDestroy(n1));
  MP_TRY(cuStreamDestroy(n2));
  MP_TRY(cuCtxPopCurrent(NULL));
  MP_TRY(cuDevicePrimaryCtxRelease(0));
  puts("ok");
  return 0;
}
