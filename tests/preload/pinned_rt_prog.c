/* pinned_rt_prog.c - page-locked staging buffers through the shared CUDA
 * runtime, for the preload tests: N cudaHostAlloc and N cudaMallocHost
 * allocations of assorted sizes, each filled and checked, then freed with
 * cudaFreeHost; one write-combined buffer too; cudaFreeHost(NULL) succeeds.
 * Prints "pinned=2N+1" and exits
 * 0, or names the failed call and exits 2.
 * "pinned_rt_prog N wrong-free" first frees a device buffer with
 * cudaFreeHost and a pinned one with cudaFree: each must be refused
 * (cudaErrorInvalidValue) and leave the buffer to its right free, which
 * must then succeed.
 * "pinned_rt_prog 1 zero" asks cudaMallocHost and cudaHostAlloc (plain and
 * write-combined) for 0 bytes: each must succeed with a NULL pointer, as
 * the runtime answers (its cudaMalloc too), and cudaFreeHost of it too;
 * prints "ok". */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check(cudaError_t e, const char *what) {
  if (e != cudaSuccess) {
    printf("FAILED %s: %s (%d)\n", what, cudaGetErrorName(e), (int)e);
    exit(2);
  }
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 32;
  if (n < 1 || n > 100000)
    n = 32;
  if (argc > 2 && strcmp(argv[2], "wrong-free") == 0) {
    void *d = NULL, *h = NULL;
    check(cudaMalloc(&d, 4096), "cudaMalloc");
    check(cudaMallocHost(&h, 4096), "cudaMallocHost");
    if (cudaFreeHost(d) != cudaErrorInvalidValue)
      check(cudaErrorUnknown, "cudaFreeHost of a device buffer");
    if (cudaFree(h) != cudaErrorInvalidValue)
      check(cudaErrorUnknown, "cudaFree of a pinned buffer");
    check(cudaFree(d), "cudaFree after a refused cudaFreeHost");
    check(cudaFreeHost(h), "cudaFreeHost after a refused cudaFree");
  }
  if (argc > 2 && strcmp(argv[2], "zero") == 0) {
    unsigned int flags[] = {cudaHostAllocDefault, cudaHostAllocMapped,
                            cudaHostAllocWriteCombined};
    for (int i = 0; i < 4; i++) {
      void *p = (void *)&n; /* not NULL: the call must write NULL */
      cudaError_t e =
          i == 3 ? cudaMallocHost(&p, 0) : cudaHostAlloc(&p, 0, flags[i]);
      printf("zero %d: %s (%d) %p\n", i, cudaGetErrorName(e), (int)e, p);
      check(e, i == 3 ? "cudaMallocHost(0)" : "cudaHostAlloc(0)");
      if (p != NULL) {
        printf("FAILED a 0-byte allocation is not NULL\n");
        return 2;
      }
      check(cudaFreeHost(p), "cudaFreeHost of a 0-byte allocation");
    }
    printf("ok\n");
    return 0;
  }
  int done = 0;
  for (int i = 0; i < 2 * n; i++) {
    size_t bytes = (size_t)(i % 7 + 1) * 9000 + (size_t)i;
    void *p = NULL;
    if (i % 2 == 0)
      check(cudaHostAlloc(&p, bytes, cudaHostAllocPortable), "cudaHostAlloc");
    else
      check(cudaMallocHost(&p, bytes), "cudaMallocHost");
    memset(p, i & 0xff, bytes);
    unsigned char *c = p;
    if (c[0] != (i & 0xff) || c[bytes - 1] != (i & 0xff)) {
      printf("FAILED contents of buffer %d\n", i);
      return 2;
    }
    check(cudaFreeHost(p), "cudaFreeHost");
    done++;
  }
  /* Write-combined: the driver's on a GPU; the host device serves it. */
  void *wc = NULL;
  check(cudaHostAlloc(&wc, 4096, cudaHostAllocWriteCombined),
        "cudaHostAlloc(write-combined)");
  check(cudaFreeHost(wc), "cudaFreeHost(write-combined)");
  done++;
  check(cudaFreeHost(NULL), "cudaFreeHost(NULL)");
  printf("pinned=%d\n", done);
  return 0;
}
