/* A program that releases the primary context the cuda backend retained
 * (one cuDevicePrimaryCtxRelease too many) leaves the device with no live
 * context: the fake now refuses to make it current (cuda.h,
 * cuCtxPushCurrent: CUDA_ERROR_INVALID_CONTEXT; before, it pushed the dead
 * context and the call after the push failed). The backend copes: each
 * call fails with MP_EDRIVER naming the refused push, changing nothing,
 * and mp_device_close closes the device, saying what the driver refused.
 * The over-release is undefined on a real driver: no GPU twin. */
#include <string.h>

#include "../../support/device_helpers.h"
#include "fakecuda_test.h"

static void expect_push_refused(mp_status_t st, const char *what) {
  cr_expect_eq(st, MP_EDRIVER, "%s: %s", what, mp_last_error());
  cr_expect_eq(mp_last_driver_error(), CUDA_ERROR_INVALID_CONTEXT, "%s: %s",
               what, mp_last_error());
  cr_expect(strstr(mp_last_error(),
                   "cuCtxPushCurrent: CUDA_ERROR_INVALID_CONTEXT") != NULL,
            "%s: %s", what, mp_last_error());
}

Test(cuda_released_context, refuses_the_push_and_the_close_says_so) {
  mp_device_t *dev = open_dev("cuda");
  CUresult (*release)(CUdevice);
  FK_LOAD(release, "cuDevicePrimaryCtxRelease_v2");
  cr_assert_eq(release(0), CUDA_SUCCESS); /* the backend's retain, gone */
  void *p = NULL;
  expect_push_refused(mp_device_alloc(dev, 1 << 20, &p), "mp_device_alloc");
  cr_expect_null(p);
  mp_stream_t s = NULL;
  expect_push_refused(mp_stream_create(dev, &s), "mp_stream_create");
  cr_expect_null(s);
  expect_push_refused(mp_device_synchronize(dev), "mp_device_synchronize");
  int closed = 0;
  mp_status_t st = mp_device_close_checked(dev, &closed);
  cr_expect_eq(closed, 1);
  cr_expect_eq(st, MP_EDRIVER, "%s", mp_last_error());
  cr_expect(strstr(mp_last_error(), "cuCtxPushCurrent") != NULL, "%s",
            mp_last_error());
}
