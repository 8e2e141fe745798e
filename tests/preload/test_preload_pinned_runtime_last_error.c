/* test_preload_pinned_runtime_last_error.c - a cudaMallocHost,
 * cudaHostAlloc or cudaFreeHost that the shim's page-locked host pool
 * answers with an error leaves that error as the runtime's last error, as
 * the runtime's own call would have: cuda_runtime_api.h, cudaGetLastError,
 * "Returns the last error that has been produced by any of the runtime
 * calls in the same instance of the CUDA Runtime library in the host
 * thread and resets it to cudaSuccess"; cudaPeekAtLastError returns it
 * without the reset. The shim's sources run in this process on the fake
 * driver, the stand-in runtime (stand_runtime.c, which keeps a last error)
 * loaded where the shim looks for the real one. */
#include <stdint.h>

#include "in_process.h"

/* cudaErrorInvalidValue, cudaErrorMemoryAllocation (driver_types.h). */
#define INVALID_VALUE     1u
#define MEMORY_ALLOCATION 2u

static unsigned (*get_last)(void);
static unsigned (*peek_last)(void);

static void cuda_mode(void) {
  cr_assert_not_null(dlopen(MP_STAND_RUNTIME, RTLD_NOW | RTLD_GLOBAL), "%s",
                     dlerror());
  mp_in_process_cuda();
  *(void **)&get_last = dlsym(RTLD_DEFAULT, "cudaGetLastError");
  *(void **)&peek_last = dlsym(RTLD_DEFAULT, "cudaPeekAtLastError");
  cr_assert(get_last != NULL && peek_last != NULL);
  (void)get_last(); /* whatever the start left */
}

/* The last error is want, peeked then got, and then cleared. */
static void last_error_is(unsigned want, const char *what) {
  unsigned peek = peek_last(), got = get_last(), after = get_last();
  cr_expect_eq(peek, want, "%s: cudaPeekAtLastError said %u", what, peek);
  cr_expect_eq(got, want, "%s: cudaGetLastError said %u", what, got);
  cr_expect_eq(after, 0u, "%s: then cudaGetLastError said %u", what, after);
}

Test(preload_pinned_runtime_last_error, a_refused_cudaHostAlloc,
     .init = cuda_mode) {
  void *p = NULL;
  cr_assert_eq(cudaHostAlloc(&p, 4096, 0x80u /* no such flag */),
               INVALID_VALUE);
  last_error_is(INVALID_VALUE, "cudaHostAlloc with an unknown flag");
}

Test(preload_pinned_runtime_last_error, a_cudaMallocHost_out_of_memory,
     .init = cuda_mode) {
  void *p = NULL;
  cr_assert_eq(cudaMallocHost(&p, SIZE_MAX / 2), MEMORY_ALLOCATION);
  last_error_is(MEMORY_ALLOCATION, "cudaMallocHost of SIZE_MAX / 2");
}

Test(preload_pinned_runtime_last_error, a_refused_cudaFreeHost,
     .init = cuda_mode) {
  void *p = NULL;
  cr_assert_eq(cudaMallocHost(&p, 4096), 0);
  cr_assert_eq(get_last(), 0u);
  cr_assert_eq(cudaFreeHost((char *)p + 64), INVALID_VALUE);
  last_error_is(INVALID_VALUE, "cudaFreeHost of an interior pointer");
  cr_assert_eq(cudaFreeHost(p), 0);
  cr_expect_eq(get_last(), 0u, "a good cudaFreeHost set an error");
  cr_assert_eq(cudaFreeHost(p), INVALID_VALUE);
  last_error_is(INVALID_VALUE, "cudaFreeHost twice");
}

/* Not pinned: a cudaMalloc block given to cudaFreeHost. */
Test(preload_pinned_runtime_last_error, cudaFreeHost_of_device_memory,
     .init = cuda_mode) {
  void *d = NULL;
  cr_assert_eq(cudaMalloc(&d, 4096), 0);
  cr_assert_eq(cudaFreeHost(d), INVALID_VALUE);
  last_error_is(INVALID_VALUE, "cudaFreeHost of a cudaMalloc block");
  cr_assert_eq(cudaFree(d), 0);
}
