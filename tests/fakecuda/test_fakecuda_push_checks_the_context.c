/* cuCtxPushCurrent and cuCtxSetCurrent of the fake took any non-NULL
 * pointer as a context and made it current; the next call that works in
 * a context then read it (its device, its streams): a forged or freed
 * handle was read as a context, and a destroyed or released one was
 * current as if alive. cuda.h lists CUDA_ERROR_INVALID_CONTEXT for both
 * calls: now the fake answers it for a pointer that is not a context it
 * made, a context cuCtxDestroy destroyed, and a primary context no one
 * retains, without reading the pointer, and leaves the thread's stack as
 * it was. A forged handle is undefined on a real driver: no GPU twin. */
#include <cuda.h>

#include "fakecuda_test.h"

static void init(void) {
  cr_assert_eq(cuInit(0), CUDA_SUCCESS);
}

TestSuite(fakecuda_push_checks_the_context, .init = init);

/* c is refused by both calls, and the thread's current context is still
 * cur. */
static void refused(CUcontext c, CUcontext cur, const char *what) {
  cr_expect_eq(cuCtxPushCurrent(c), CUDA_ERROR_INVALID_CONTEXT,
               "cuCtxPushCurrent took %s", what);
  CUcontext now = NULL;
  cr_assert_eq(cuCtxGetCurrent(&now), CUDA_SUCCESS);
  cr_assert_eq(now, cur, "a refused push changed the stack (%s)", what);
  cr_expect_eq(cuCtxSetCurrent(c), CUDA_ERROR_INVALID_CONTEXT,
               "cuCtxSetCurrent took %s", what);
  cr_assert_eq(cuCtxGetCurrent(&now), CUDA_SUCCESS);
  cr_assert_eq(now, cur, "a refused set changed the stack (%s)", what);
}

Test(fakecuda_push_checks_the_context, a_pointer_it_never_made) {
  /* Readable memory (the fake read it before; a wild pointer would
   * crash the old fake rather than fail the test), but no context. */
  static unsigned char junk[256];
  memset(junk, 0xff, sizeof junk);
  refused((CUcontext)(void *)junk, NULL, "a forged pointer");
  CUdeviceptr mem;
  cr_expect_eq(cuMemAlloc(&mem, 64), CUDA_ERROR_INVALID_CONTEXT);
}

Test(fakecuda_push_checks_the_context, a_destroyed_context) {
  CUcontext c;
  cr_assert_eq(cuCtxCreate(&c, NULL, 0, 0), CUDA_SUCCESS);
  cr_assert_eq(cuCtxDestroy(c), CUDA_SUCCESS);
  refused(c, NULL, "a destroyed context");
}

Test(fakecuda_push_checks_the_context, a_released_primary_context) {
  CUcontext p;
  cr_assert_eq(cuDevicePrimaryCtxRetain(&p, 0), CUDA_SUCCESS);
  cr_assert_eq(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
  refused(p, NULL, "a primary context no one retains");
}

/* What it made and is alive is taken, as before; a refusal leaves a
 * context current below it current. */
Test(fakecuda_push_checks_the_context, live_contexts_are_taken) {
  CUcontext p, c;
  cr_assert_eq(cuDevicePrimaryCtxRetain(&p, 0), CUDA_SUCCESS);
  cr_assert_eq(cuCtxPushCurrent(p), CUDA_SUCCESS);
  static unsigned char junk[256];
  refused((CUcontext)(void *)junk, p, "a forged pointer");
  CUdeviceptr mem;
  cr_assert_eq(cuMemAlloc(&mem, 64), CUDA_SUCCESS);
  cr_assert_eq(cuMemFree(mem), CUDA_SUCCESS);
  cr_assert_eq(cuCtxCreate(&c, NULL, 0, 0), CUDA_SUCCESS);
  cr_assert_eq(cuCtxPushCurrent(p), CUDA_SUCCESS);
  cr_assert_eq(cuCtxSetCurrent(c), CUDA_SUCCESS);
  cr_assert_eq(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
  cr_assert_eq(cuCtxDestroy(c), CUDA_SUCCESS);
  cr_assert_eq(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
  cr_assert_eq(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
}
