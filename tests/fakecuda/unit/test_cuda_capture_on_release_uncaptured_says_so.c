/* capture_on_release asks for a graph being captured to hold a user
 * object; a stream that is not being captured has none, and the cuda
 * backend said so as the driver's refusal, "cuStreamGetCaptureInfo(...):
 * CUDA_ERROR_INVALID_VALUE", though the driver had answered. The refusal
 * is the caller's (MP_EINVAL, saying the stream is not captured), nothing
 * is made, and fn is never called. */
#include <stdbool.h>
#include <string.h>

#include "../../support/device_helpers.h"
#include "device/backend.h"
#include "fakecuda_test.h"

static void never(void *arg) {
  *(bool *)arg = true;
}

Test(cuda_capture_on_release_uncaptured, the_refusal_says_no_capture) {
  mp_device_t *dev = open_dev("cuda");
  mp_stream_t s = NULL;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  bool called = false;
  mp_status_t st = mp__device_capture_on_release(dev, s, never, &called);
  if (st == MP_ENOTSUP)
    cr_skip_test("the driver has no user objects: %s", mp_last_error());
  cr_expect_eq(st, MP_EINVAL, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect(strstr(mp_last_error(), "not being captured") != NULL, "%s",
            mp_last_error());
  cr_expect(strstr(mp_last_error(), "CUDA_ERROR") == NULL,
            "said as the driver's refusal: %s", mp_last_error());
  cr_expect_eq(mp_last_driver_error(), 0);
  cr_expect_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
  cr_expect_not(called, "fn called though nothing holds it");
}
