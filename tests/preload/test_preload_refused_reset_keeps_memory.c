/* test_preload_refused_reset_keeps_memory.c - a cuDevicePrimaryCtxReset
 * made from a host function is refused by the driver (cuda.h,
 * cuLaunchHostFunc: "The host function must not make any CUDA API calls";
 * the driver answers CUDA_ERROR_NOT_PERMITTED) and destroys nothing, so
 * the blocks the program holds from the device's pool and from its host
 * pool stay its own: page-locked ones keep the flags asked for and their
 * content, and each cuMemFree or cuMemFreeHost succeeds once. The shim's
 * sources run in this process, on the fake driver, which refuses a host
 * function's calls. */
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

/* The driver's cuLaunchHostFunc and cuCtxSynchronize (the shim hooks
 * neither). */
static void host_fn_calls(mp__curesult (**launch)(void *, void (*)(void *),
                                                  void *),
                          mp__curesult (**sync)(void)) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  cr_assert_not_null(lib);
  *(void **)launch = dlsym(lib, "cuLaunchHostFunc");
  *(void **)sync = dlsym(lib, "cuCtxSynchronize");
  cr_assert(*launch != NULL && *sync != NULL);
}

static void reset_from_host_fn(void) {
  mp__curesult (*launch)(void *, void (*)(void *), void *) = NULL;
  mp__curesult (*sync)(void) = NULL;
  host_fn_calls(&launch, &sync);
  reset_arg_t arg = {.r = 0};
  cr_assert_eq(launch(NULL, reset_in_host_fn, &arg), 0);
  cr_assert_eq(sync(), 0);
  cr_assert_eq(arg.r, MP__CU_NOT_PERMITTED, "the reset answered %u", arg.r);
}

Test(preload_refused_reset_keeps_memory,
     a_reset_from_a_host_function_keeps_the_pinned_blocks, .init = quiet_cuda) {

  void *a = NULL, *b = NULL;
  cr_assert_eq(cuMemAllocHost_v2(&a, 1000), 0);
  cr_assert_eq(cuMemHostAlloc(&b, 3000, 0x01 /* PORTABLE */), 0);
  memset(a, 0x11, 1000);
  memset(b, 0x22, 3000);

  reset_from_host_fn();

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

/* Failed before: the device's pool was retired and its blocks forgotten,
 * so the program's free of one went to the driver, which never gave it. */
Test(preload_refused_reset_keeps_memory,
     a_reset_from_a_host_function_keeps_the_device_blocks, .init = quiet_cuda) {
  mp__cuptr a = 0, b = 0;
  cr_assert_eq(cuMemAlloc_v2(&a, 1000), 0);
  cr_assert_eq(cuMemAlloc_v2(&b, 3 << 20), 0);

  reset_from_host_fn();

  cr_expect_eq(cuMemFree_v2(a), 0, "a cannot be freed");
  cr_expect_eq(cuMemFree_v2(b), 0, "b cannot be freed");
  cr_expect_neq(cuMemFree_v2(b), 0, "b freed twice");
  mp__cuptr c = 0;
  cr_expect_eq(cuMemAlloc_v2(&c, 1000), 0);
  cr_expect_eq(c, a, "the pool did not serve the same block again");
  cr_expect_eq(cuMemFree_v2(c), 0);
}
