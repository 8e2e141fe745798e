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
#include <string.h>

#include "in_process.h"

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
  cr_assert_not_null(dlopen(MP_STAND_RUNTIME, RTLD_NOW | RTLD_GLOBAL), "%s",
                     dlerror());
  mp_in_process_cuda();
}

/* The shim's pool's statistics. */
static mp_stats_t pool_stats(void) {
  mp_stats_t s;
  cr_assert_eq(mp_pool_get_stats(mp__pl_get()->pool, &s), MP_OK);
  return s;
}

static unsigned long long pool_allocs(void) {
  return (unsigned long long)pool_stats().alloc_count;
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

/* The driver's table the shim calls (real.c), wrapped: while sync_code is
 * set, cuStreamSynchronize answers it, as the driver does after a
 * kernel's fault ("any further CUDA work will return the same error",
 * cuda.h, CUDA_ERROR_ILLEGAL_ADDRESS). */
const mp__real_cuda_t *__real_mp__pl_real_cuda(void);
const mp__real_cuda_t *__wrap_mp__pl_real_cuda(void);

static mp__curesult sync_code;
static mp__real_cuda_t refusing;

static mp__curesult refused_sync(mp__custream s) {
  (void)s;
  return sync_code;
}

const mp__real_cuda_t *__wrap_mp__pl_real_cuda(void) {
  const mp__real_cuda_t *real = __real_mp__pl_real_cuda();
  if (sync_code == 0)
    return real;
  refusing = *real;
  refusing.cuStreamSynchronize = refused_sync;
  return &refusing;
}

/* A stream of device 1 (the fake driver with two devices), which device
 * 0's pool cannot order on: the shim waits for it before a free on it
 * (free.c). Device 0's primary context is current again after. */
static mp__custream other_device_stream(void) {
  mp__curesult (*retain)(void **, int) = NULL;
  mp__curesult (*push)(void *) = NULL;
  mp__curesult (*stream)(mp__custream *, unsigned) = NULL;
  mp__curesult (*pop)(void **) = NULL;
  *(void **)&retain = dlsym(RTLD_DEFAULT, "cuDevicePrimaryCtxRetain");
  *(void **)&push = dlsym(RTLD_DEFAULT, "cuCtxPushCurrent_v2");
  *(void **)&stream = dlsym(RTLD_DEFAULT, "cuStreamCreate");
  *(void **)&pop = dlsym(RTLD_DEFAULT, "cuCtxPopCurrent_v2");
  cr_assert(retain != NULL && push != NULL && stream != NULL && pop != NULL);
  void *ctx1 = NULL, *popped = NULL;
  mp__custream s = NULL;
  cr_assert_eq(retain(&ctx1, 1), 0, "the fake has one device");
  cr_assert_eq(push(ctx1), 0);
  cr_assert_eq(stream(&s, 0), 0);
  cr_assert_eq(pop(&popped), 0);
  cr_assert_eq(popped, ctx1);
  return s;
}

static void two_devices(void) {
  setenv("FAKECUDA_DEVICE_COUNT", "2", 1);
  cuda_mode();
}

static unsigned long long pool_frees(void) {
  return (unsigned long long)pool_stats().free_count;
}

/* A free the shim cannot make because the driver refuses the wait it
 * needs (for another device's stream) answers the driver's own code,
 * as the driver would, and leaves the block the program's. Failed before:
 * 999, CUDA_ERROR_UNKNOWN, which names no error. */
Test(preload_driver_error, cuMemFreeAsync_answers_the_drivers_code,
     .init = two_devices) {
  mp__cuptr d = 0;
  cr_assert_eq(cuMemAlloc_v2(&d, 4096), MP__CU_SUCCESS);
  mp__custream s = other_device_stream();
  unsigned long long before = pool_frees();
  sync_code = 700; /* CUDA_ERROR_ILLEGAL_ADDRESS */
  mp__curesult r = cuMemFreeAsync(d, s);
  sync_code = 0;
  cr_assert_eq(r, 700, "the shim answered %u, not the driver's 700 (%s)", r,
               mp_last_error());
  cr_expect(strstr(mp_last_error(), "CUDA_ERROR_ILLEGAL_ADDRESS") != NULL,
            "the message names no error: %s", mp_last_error());
  cr_expect_eq(pool_frees(), before, "the pool took the block");
  cr_expect_eq(cuMemFreeAsync(d, s), MP__CU_SUCCESS, "not the program's");
  cr_expect_eq(pool_frees(), before + 1);
}

/* The same through the runtime: cudaErrorIllegalAddress is 700 too
 * (driver_types.h), and a driver code the runtime does not name (202,
 * CUDA_ERROR_CONTEXT_ALREADY_CURRENT) is cudaErrorUnknown. */
Test(preload_driver_error, cudaFreeAsync_answers_the_runtimes_code,
     .init = two_devices) {
  void *p = NULL;
  cr_assert_eq(cudaMalloc(&p, 4096), MP__CUDA_SUCCESS);
  mp__custream s = other_device_stream();
  sync_code = 700;
  mp__cudaerr r = cudaFreeAsync(p, s);
  sync_code = 202;
  mp__cudaerr r2 = cudaFreeAsync(p, s);
  sync_code = 0;
  cr_assert_eq(r, 700, "the shim answered %u, not the runtime's 700", r);
  cr_assert_eq(r2, MP__CUDA_UNKNOWN, "answered %u", r2);
  cr_expect_eq(cudaFreeAsync(p, s), MP__CUDA_SUCCESS, "not the program's");
}
