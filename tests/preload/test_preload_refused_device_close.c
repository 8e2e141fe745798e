/* test_preload_refused_device_close.c - a cuDevicePrimaryCtxReset whose
 * release of the device's pool meets a close the device refuses
 * (mp_device_close_ex: its wait for the device's work refused, from a host
 * function or beside a capture) keeps the device and says so, rather than
 * dropping it open (its memory, streams, events and retain of the primary
 * context leaked, without a word). The shim's sources run in this process
 * on the fake driver with two devices (device 1's pool is the one reset;
 * device 0's stays, the shim's first), mp_device_close_ex and
 * mp_device_close wrapped to refuse one close. */
#include <stdio.h>
#include <string.h>

#include "in_process.h"

/* After criterion.h (in_process.h). */
#include <criterion/redirect.h>

mp_status_t __real_mp_device_close_ex(mp_device_t *dev);
mp_status_t __wrap_mp_device_close_ex(mp_device_t *dev);
void __wrap_mp_device_close(mp_device_t *dev);

static int refusals; /* closes still to refuse */
static int closes;   /* closes that went through */

/* Only the CUDA devices the shim opened are refused and counted: where the
 * library is not one translation unit (Debug builds), its own calls are
 * wrapped too, such as the host pool's close of its page-locked view
 * ("pinned(cuda:1 ...)"), which must go through. */
mp_status_t __wrap_mp_device_close_ex(mp_device_t *dev) {
  if (dev == NULL || strncmp(mp_device_name(dev), "cuda:", 5) != 0)
    return __real_mp_device_close_ex(dev);
  if (refusals > 0) {
    refusals--;
    return mp__fail(MP_EBUSY, "mp_device_close: refused by the test");
  }
  closes++;
  return __real_mp_device_close_ex(dev);
}

/* The shim before the fix closed with the form without a status. */
void __wrap_mp_device_close(mp_device_t *dev) {
  (void)__wrap_mp_device_close_ex(dev);
}

static void two_devices(void) {
  setenv("FAKECUDA_DEVICE_COUNT", "2", 1);
  cr_redirect_stderr();
  mp_in_process_cuda();
}

/* Whether the shim said `what` on stderr (redirected) so far. */
static bool said(const char *what) {
  fflush(stderr);
  static char text[8192];
  static size_t n;
  FILE *f = cr_get_redirected_stderr();
  n += fread(text + n, 1, sizeof text - 1 - n, f);
  text[n] = '\0';
  return strstr(text, what) != NULL;
}

Test(preload_refused_device_close, a_refused_close_keeps_the_device_and_says_so,
     .init = two_devices) {
  const mp__pl_t *pl = mp__pl_get();
  cr_assert_not_null(mp__pl_pool_of(pl, 1), "no pool for device 1");
  refusals = 1;
  closes = 0;
  cr_assert_eq(cuDevicePrimaryCtxReset_v2(1), MP__CU_SUCCESS);
  cr_expect_eq(refusals, 0, "the shim did not close device 1");
  cr_expect_eq(closes, 0, "a refused close was tried again");
  cr_expect(said("device 'cuda:1"), "the refused close was not said");
  cr_expect(said("cannot be closed and is kept open until exit"),
            "the refused close was not said");
  /* The next pool of the device is a new one, and its reset closes its
   * device. */
  cr_assert_not_null(mp__pl_pool_of(pl, 1), "no new pool for device 1");
  cr_assert_eq(cuDevicePrimaryCtxReset_v2(1), MP__CU_SUCCESS);
  cr_expect_eq(closes, 1);
}

/* The same for the device of device 1's page-locked host pool (host.c),
 * which the reset destroys: its close refused, it is kept and said. */
Test(preload_refused_device_close, a_refused_close_keeps_the_host_pools_device,
     .init = two_devices) {
  cr_assert_not_null(mp__pl_get());
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  mp__curesult (*retain)(void **, int) = NULL;
  mp__curesult (*set)(void *) = NULL;
  *(void **)&retain = dlsym(lib, "cuDevicePrimaryCtxRetain");
  *(void **)&set = dlsym(lib, "cuCtxSetCurrent");
  void *ctx = NULL, *p = NULL;
  cr_assert(retain != NULL && set != NULL && retain(&ctx, 1) == 0 &&
            set(ctx) == 0);
  cr_assert_eq(cuMemAllocHost_v2(&p, 4096), MP__CU_SUCCESS);
  cr_assert_eq(cuMemFreeHost(p), MP__CU_SUCCESS);
  refusals = 1;
  closes = 0;
  cr_assert_eq(cuDevicePrimaryCtxReset_v2(1), MP__CU_SUCCESS);
  cr_expect_eq(refusals, 0, "the shim did not close the host pool's device");
  cr_expect_eq(closes, 0, "a refused close was tried again");
  cr_expect(said("page-locked host pool cannot be closed and is kept open"),
            "the refused close was not said");
}
