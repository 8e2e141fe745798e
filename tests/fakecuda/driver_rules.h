/* driver_rules.h - what the rule tests that call the driver API themselves
 * share (test_fakecuda_rules.c, test_fakecuda_vmm_rules.c): they link the
 * fake libcuda.so.1, and their GPU twins (tests/gpu/gpu_twin.sh) run them
 * against a real one. */
#ifndef MEMPOOL_DRIVER_RULES_H
#define MEMPOOL_DRIVER_RULES_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include <cuda.h>

#include <criterion/criterion.h>

/* The fake's hook, weak: absent on a real driver, where fk_real() holds and
 * what only the fake promises is skipped. */
long long cuFakeGetErrorCount(CUresult code) __attribute__((weak));
static inline bool fk_real(void) {
  return cuFakeGetErrorCount == NULL;
}

/* Device 0's primary context, retained and made current (*c). */
static inline void fk_primary_open(CUcontext *c) {
  cr_assert_eq(cuInit(0), CUDA_SUCCESS);
  cr_assert_eq(cuDevicePrimaryCtxRetain(c, 0), CUDA_SUCCESS);
  cr_assert_eq(cuCtxPushCurrent(*c), CUDA_SUCCESS);
}

/* Its work finished, it is no longer current and let go. */
static inline void fk_primary_close(void) {
  (void)cuCtxSynchronize();
  (void)cuCtxPopCurrent(NULL);
  (void)cuDevicePrimaryCtxRelease(0);
}

/* A monotonic clock, in seconds. */
static inline double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

#endif /* MEMPOOL_DRIVER_RULES_H */
