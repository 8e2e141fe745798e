/* test_preload_refused_reset_keeps_pinned.c - a cuDevicePrimaryCtxReset
 * made from a host function is refused by the driver (cuda.h,
 * cuLaunchHostFunc: "The host function must not make any CUDA API calls";
 * the driver answers CUDA_ERROR_NOT_PERMITTED) and destroys nothing, so
 * the page-locked blocks the program holds from the device's host pool
 * stay its own: their flags are the ones asked for, their content is
 * theirs, and each cuMemFreeHost succeeds. The shim's sources run in this
 * process, on the fake driver, which refuses a host function's calls. */
#include <string.h>

#include "in_process.h"

/* After criterion.h (in_process.h). */
#include <criterion/redirect.h>

typedef struct {
  unsigned r;
} reset_arg_t;

static void reset_in_host_fn(void *arg) {
  ((reset_arg_t *)arg)->r = cuDevicePrimaryCtxReset_v2(0);
}

static void quiet_cuda(void) {
  cr_redirect_stderr(); /* what the shim says of the refused reset */
  mp_in_process_cuda();
}

Test(preload_refused_reset_keeps_pinned,
     a_reset_from_a_host_function_keeps_the_pinned_blocks, .init = quiet_cuda) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  cr_assert_not_null(lib);
  mp__curesult (*launch)(void *, void (*)(void *), void *) = NULL;
  mp__curesult (*sync)(void) = NULL;
  *(void **)&launch = dlsym(lib, "cuLaunchHostFunc");
  *(void **)&sync = dlsym(lib, "cuCtxSynchronize");
  cr_assert(launch != NULL && sync != NULL);

  void *a = NULL, *b = NULL;
  cr_assert_eq(cuMemAllocHost_v2(&a, 1000), 0);
  cr_assert_eq(cuMemHostAlloc(&b, 3000, 0x01 /* PORTABLE */), 0);
  memset(a, 0x11, 1000);
  memset(b, 0x22, 3000);

  reset_arg_t arg = {.r = 0};
  cr_assert_eq(launch(NULL, reset_in_host_fn, &arg), 0);
  cr_assert_eq(sync(), 0);
  cr_assert_eq(arg.r, MP__CU_NOT_PERMITTED, "the reset answered %u", arg.r);

  unsigned fa = 99, fb = 99;
  cr_expect_eq(cuMemHostGetFlags(&fa, a), 0);
  cr_expect_eq(cuMemHostGetFlags(&fb, b), 0);
  cr_expect_eq(fa, 0u, "a's flags %u", fa);
  cr_expect_eq(fb, 0x01u, "b's flags %u", fb);
  for (int i = 0; i < 1000; i++)
    cr_assert_eq(((unsigned char *)a)[i], 0x11, "a changed at %d", i);
  for (int i = 0; i < 3000; i++)
    cr_assert_eq(((unsigned char *)b)[i], 0x22, "b changed at %d", i);
  cr_expect_eq(cuMemFreeHost(a), 0, "a cannot be freed");
  cr_expect_eq(cuMemFreeHost(b), 0, "b cannot be freed");
  cr_expect_neq(cuMemFreeHost(b), 0, "b freed twice");
}
