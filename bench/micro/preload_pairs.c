/* preload_pairs - the cost of one free + alloc pair that an unmodified
 * program makes through the CUDA driver (cuMemFree / cuMemAlloc) and the
 * runtime (cudaFree / cudaMalloc), on bench_pool_pairs' plan of 100 live
 * blocks (pairs_plan.h: the same sizes and victims, log-uniform 512 B ..
 * 16 MiB). Run as it is, the calls reach the driver; run under
 * LD_PRELOAD=libmempool_preload.so, the shim serves them from its pools,
 * and each free takes the shim's pointer table's lock twice (its claim,
 * then its end: src/preload/free.c). bench/micro/preload_pairs.sh runs it
 * both ways, and under callgrind, in one command.
 *
 * The driver is tests/fakecuda's fake libcuda.so.1 (linked, so direct
 * calls bind to it unless the shim is preloaded, as the preload tests'
 * programs do); the runtime is tests/preload's stand-in
 * (stand_runtime.c: cudaMalloc is cuMemAlloc, cudaFree cuMemFree), loaded
 * into the global scope before any call, and its calls found with dlsym,
 * as a program linked with the runtime has them bound (the shim's under
 * LD_PRELOAD). Without the shim the figures are the fake's, a host
 * backend's mmap and munmap, not a GPU driver's.
 *
 * As in bench_pool_pairs: the live set is filled first, then a warm-up of
 * the same length as the timed phase, then the timed phase: free a random
 * live block, allocate a new random size in its place, in the primary
 * context of device 0, synchronous calls only.
 *
 *   bench_preload_pairs [pairs=200000] [driver|runtime: run only that]
 *
 * Each row names the object whose entry point served the calls ("served
 * by": libcuda.so.1 and the stand-in runtime without the shim,
 * libmempool_preload.so under it). Instructions per pair: under callgrind
 * with --instr-atstart=no, each timed phase alone is dumped as "driver
 * 100" or "runtime 100". */
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "pairs_plan.h"

typedef unsigned (*alloc_fn)(void **p, size_t bytes);
typedef unsigned (*free_fn)(void *p);

/* The driver's calls with the runtime's shape (CUdeviceptr is an integer
 * as wide as a pointer). Direct calls: they bind as the program's would. */
static unsigned drv_alloc(void **p, size_t bytes) {
  CUdeviceptr d = 0;
  CUresult r = cuMemAlloc(&d, bytes);
  *p = (void *)(uintptr_t)d;
  return (unsigned)r;
}

static unsigned drv_free(void *p) {
  return (unsigned)cuMemFree((CUdeviceptr)(uintptr_t)p);
}

/* The file name (its last part) of the object that defines sym. */
static const char *served_by(const char *sym) {
  Dl_info info;
  void *p = dlsym(RTLD_DEFAULT, sym);
  if (p == NULL || dladdr(p, &info) == 0 || info.dli_fname == NULL)
    return "?";
  const char *slash = strrchr(info.dli_fname, '/');
  return slash != NULL ? slash + 1 : info.dli_fname;
}

/* The plan through alloc/free: ns per pair of the timed phase, or a
 * negative value after a message naming the call that failed. */
static double run(const char *api, const plan_t *p, alloc_fn alloc,
                  free_fn release) {
  void **live = calloc(p->live, sizeof(void *));
  if (live == NULL) {
    fprintf(stderr, "%s: out of host memory\n", api);
    return -1;
  }
  unsigned r = 0;
  size_t i = 0;
  for (; r == 0 && i < p->live; i++)
    r = alloc(&live[i], p->init[i]);
  double t0 = 0, t1 = 0;
  for (int phase = 0; r == 0 && phase < 2; phase++) {
    if (phase == 1) {
      count_begin();
      t0 = now_ns();
    }
    for (i = 0; i < p->pairs; i++) {
      uint32_t v = p->victim[i];
      if ((r = release(live[v])) != 0)
        break;
      if ((r = alloc(&live[v], p->sizes[i])) != 0) {
        live[v] = NULL;
        break;
      }
    }
  }
  t1 = now_ns();
  if (r == 0)
    count_end(api, p->live);
  else
    fprintf(stderr, "%s: a call failed with %u\n", api, r);
  for (i = 0; i < p->live; i++)
    if (live[i] != NULL)
      (void)release(live[i]);
  free(live);
  return r == 0 ? (t1 - t0) / (double)p->pairs : -1;
}

/* The stand-in runtime's cudaMalloc and cudaFree, as the program binds
 * them; false after a message when it has none. */
static bool runtime_calls(alloc_fn *alloc, free_fn *release) {
#ifdef MP_BENCH_STAND_RUNTIME
  if (dlopen(MP_BENCH_STAND_RUNTIME, RTLD_NOW | RTLD_GLOBAL) == NULL) {
    fprintf(stderr, "cannot load %s: %s\n", MP_BENCH_STAND_RUNTIME, dlerror());
    return false;
  }
  void *m = dlsym(RTLD_DEFAULT, "cudaMalloc");
  void *f = dlsym(RTLD_DEFAULT, "cudaFree");
  if (m == NULL || f == NULL) {
    fprintf(stderr, "no cudaMalloc or cudaFree in %s\n",
            MP_BENCH_STAND_RUNTIME);
    return false;
  }
  memcpy(alloc, &m, sizeof m);
  memcpy(release, &f, sizeof f);
  /* The runtime's documented start, before the timed calls. */
  return (*release)(NULL) == 0;
#else
  (void)alloc;
  (void)release;
  fprintf(stderr, "built without the stand-in runtime (tests/preload): "
                  "no runtime row\n");
  return false;
#endif
}

int main(int argc, char **argv) {
  uint64_t npairs;
  if (!micro_count(argc, argv, 1, 200000, 1, 100000000, "pairs", &npairs))
    return 2;
  const char *only = argc > 2 ? argv[2] : "";
  if (strcmp(only, "") != 0 && strcmp(only, "driver") != 0 &&
      strcmp(only, "runtime") != 0) {
    fprintf(stderr, "%s: unknown mode '%s' (driver or runtime)\n", argv[0],
            only);
    return 2;
  }
  CUcontext ctx;
  CUresult cr = cuInit(0);
  if (cr == CUDA_SUCCESS)
    cr = cuDevicePrimaryCtxRetain(&ctx, 0);
  if (cr == CUDA_SUCCESS)
    cr = cuCtxSetCurrent(ctx);
  if (cr != CUDA_SUCCESS) {
    fprintf(stderr, "%s: no context on device 0 (CUresult %d)\n", argv[0],
            (int)cr);
    return 1;
  }
  /* bench_pool_pairs' plan of 100 live blocks (made first there too). */
  plan_t p = make_plan(100, (size_t)npairs);
  if (p.sizes == NULL) {
    fprintf(stderr, "%s: out of host memory for %llu pairs\n", argv[0],
            (unsigned long long)npairs);
    return 1;
  }
  printf("preload free+alloc pairs, sizes log-uniform 512 B .. 16 MiB, "
         "%zu pairs, %zu live\n",
         p.pairs, p.live);
  printf("%-8s %-32s %12s\n", "api", "served by", "ns/pair");
  int rc = 0;
  if (strcmp(only, "runtime") != 0) {
    double ns = run("driver", &p, drv_alloc, drv_free);
    if (ns >= 0)
      printf("%-8s %-32s %12.1f\n", "driver", served_by("cuMemAlloc_v2"), ns);
    rc |= ns < 0;
  }
  alloc_fn ra;
  free_fn rf;
  if (strcmp(only, "driver") != 0) {
    double ns = runtime_calls(&ra, &rf) ? run("runtime", &p, ra, rf) : -1;
    if (ns >= 0)
      printf("%-8s %-32s %12.1f\n", "runtime", served_by("cudaMalloc"), ns);
    rc |= ns < 0;
  }
  plan_free(&p);
  (void)cuDevicePrimaryCtxRelease(0);
  return rc;
}
