/* test_preload_driver_error.c - an allocation the pool cannot serve
 * because the driver refused one of the pool's own calls with an error the
 * pool has no status for (MP_EDRIVER: a sticky error after a kernel's
 * fault, CUDA_ERROR_ILLEGAL_ADDRESS, say) is answered by the driver (or
 * the runtime) itself, as without the shim: its own code, and for the
 * runtime its own last error, never the shim's CUDA_ERROR_UNKNOWN /
 * cudaErrorUnknown (999), which names no error (cuda.h: "This indicates
 * that an unknown internal error has occurred").
 *
 * The shim's sources run in this process on the fake driver, the stand-in
 * runtime (stand_runtime.c) loaded first; the link wraps mp_pool_alloc
 * (-Wl,--wrap) to answer MP_EDRIVER. The fake driver serves the same
 * request, so the driver's answer here is success with its own memory.
 * Failed before: cuMemAlloc_v2 and cudaMalloc answered 999. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdlib.h>

#include "preload/hooks.h"

mp_status_t __real_mp_pool_alloc(mp_pool_t *pool, size_t size,
                                 mp_stream_t stream, void **out);
mp_status_t __wrap_mp_pool_alloc(mp_pool_t *pool, size_t size,
                                 mp_stream_t stream, void **out);

static bool refuse;

mp_status_t __wrap_mp_pool_alloc(mp_pool_t *pool, size_t size,
                                 mp_stream_t stream, void **out) {
  return refuse ? MP_EDRIVER : __real_mp_pool_alloc(pool, size, stream, out);
}

/* Pooling on the fake driver, device 0's primary context current, the
 * stand-in runtime loaded where the shim looks for the real one. */
static void cuda_mode(void) {
  setenv("MEMPOOL_DEVICE", "cuda", 1);
  unsetenv("MEMPOOL_PRELOAD");
  unsetenv("MEMPOOL_CONF");
  cr_assert_not_null(dlopen(MP_STAND_RUNTIME, RTLD_NOW | RTLD_GLOBAL), "%s",
                     dlerror());
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  cr_assert_not_null(lib, "%s", dlerror());
  mp__curesult (*init)(unsigned) = NULL;
  mp__curesult (*retain)(void **, int) = NULL;
  mp__curesult (*set)(void *) = NULL;
  *(void **)&init = dlsym(lib, "cuInit");
  *(void **)&retain = dlsym(lib, "cuDevicePrimaryCtxRetain");
  *(void **)&set = dlsym(lib, "cuCtxSetCurrent");
  void *ctx = NULL;
  cr_assert(init != NULL && retain != NULL && set != NULL && init(0) == 0 &&
            retain(&ctx, 0) == 0 && set(ctx) == 0);
  const mp__pl_t *pl = mp__pl_get();
  cr_assert(pl->mode == MP__PL_POOL && !pl->host,
            "the shim is not pooling on the fake driver");
}

static unsigned long long pool_allocs(void) {
  mp_stats_t s;
  cr_assert_eq(mp_pool_get_stats(mp__pl_get()->pool, &s), MP_OK);
  return (unsigned long long)s.alloc_count;
}

Test(preload_driver_error, cuMemAlloc_gets_the_drivers_answer,
     .init = cuda_mode) {
  unsigned long long before = pool_allocs();
  refuse = true;
  mp__cuptr d = 0;
  mp__curesult r = cuMemAlloc_v2(&d, 4096);
  refuse = false;
  cr_assert_eq(r, MP__CU_SUCCESS, "the shim answered %u, not the driver", r);
  cr_assert_neq(d, 0);
  cr_expect_eq(pool_allocs(), before, "the pool served it");
  cr_expect_eq(cuMemFree_v2(d), MP__CU_SUCCESS, "the driver's memory");
  cr_expect_neq(cuMemFree_v2(d), MP__CU_SUCCESS, "freed twice");
}

Test(preload_driver_error, cudaMalloc_gets_the_runtimes_answer,
     .init = cuda_mode) {
  unsigned long long before = pool_allocs();
  refuse = true;
  void *p = NULL;
  mp__cudaerr r = cudaMalloc(&p, 4096);
  refuse = false;
  cr_assert_eq(r, MP__CUDA_SUCCESS, "the shim answered %u, not the runtime", r);
  cr_assert_not_null(p);
  cr_expect_eq(pool_allocs(), before, "the pool served it");
  cr_expect_eq(cudaFree(p), MP__CUDA_SUCCESS, "the runtime's memory");
}
