/* stream_capture_id is stream_capturing with the capture's id (backend.h):
 * -1 where the driver's refusal cannot be told from a capture (a capture's
 * own error, a bad handle), -2 with the driver's error recorded where it
 * failed on its own (a sticky error after a kernel's fault: "any further
 * CUDA work will return the same error", cuda.h). The cuda backend
 * answered -1 for every refusal of cuStreamGetCaptureInfo, so a dead
 * context looked like "cannot tell" and its error was nowhere. The sticky
 * error and the refusals are the fake's: no GPU twin. */
#include <string.h>

#include "../../support/device_helpers.h"
#include "device/backend.h"
#include "fakecuda_test.h"

Test(cuda_capture_id_error, a_sticky_error_is_the_drivers_failure) {
  if (fk_is_real())
    cr_skip_test("the sticky error is the fake driver's");
  mp_device_t *dev = open_dev("cuda");
  mp_stream_t s = NULL;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  uint64_t id = 7;
  fk_sticky_error(CUDA_ERROR_ILLEGAL_ADDRESS);
  int c = mp__device_stream_capture_id(dev, s, &id);
  int cu = mp_last_driver_error();
  mp_status_t st = mp_last_status();
  char msg[512];
  snprintf(msg, sizeof msg, "%s", mp_last_error());
  fk_sticky_error(0);
  cr_expect_eq(c, -2, "answered %d: %s", c, msg);
  cr_expect_eq(st, MP_EDRIVER, "%s", mp_status_name(st));
  cr_expect_eq(cu, CUDA_ERROR_ILLEGAL_ADDRESS, "%d", cu);
  cr_expect(strstr(msg, "cuStreamGetCaptureInfo") != NULL &&
                strstr(msg, "CUDA_ERROR_ILLEGAL_ADDRESS") != NULL,
            "%s", msg);
  cr_expect_eq(id, 0, "an id given for a failed question");
  /* The driver answering again: no capture. */
  cr_expect_eq(mp__device_stream_capture_id(dev, s, &id), 0, "%s",
               mp_last_error());
  cr_expect_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

/* A capture's own refusal cannot be told from a capture: -1, and the
 * caller's last error is left as it was (nothing failed of the caller's). */
Test(cuda_capture_id_error, a_captures_refusal_cannot_be_told) {
  if (fk_is_real())
    cr_skip_test("the refusal is the fake driver's");
  mp_device_t *dev = open_dev("cuda");
  mp_stream_t s = NULL;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, NULL), MP_EINVAL);
  char before[512];
  snprintf(before, sizeof before, "%s", mp_last_error());
  uint64_t id = 7;
  fk_refuse("cuStreamGetCaptureInfo_v2", CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, 1);
  int c = mp__device_stream_capture_id(dev, s, &id);
  fk_refuse("cuStreamGetCaptureInfo_v2", CUDA_SUCCESS, 0);
  cr_expect_eq(c, -1, "answered %d: %s", c, mp_last_error());
  cr_expect_eq(id, 0);
  cr_expect_eq(mp_last_status(), MP_EINVAL);
  cr_expect_str_eq(mp_last_error(), before);
  cr_expect_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}
