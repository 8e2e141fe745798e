/* A plain import (ipc_open: cuIpcOpenMemHandle, then cuMemGetAddressRange
 * to check the handle's size) that fails after it opened is undone with
 * cuIpcCloseMemHandle in relaxed capture mode. Where that undo worked but
 * the restore of the thread's capture mode after it was refused, the
 * import still failed with the right status, but its message and driver
 * code were the restore's ("the call it was relaxed for succeeded"): the
 * caller lost why the import failed. Now the failure is said, with the
 * refused restore told after it. The refusals are the fake's
 * (cuFakeRefuse): no GPU twin. */
#include "ipc_exporter.h"

static void expect_failure_then_note(mp_status_t st, mp_status_t want, int code,
                                     const char *why) {
  const char *msg = mp_last_error();
  cr_expect_eq(st, want, "%s: %s", mp_status_name(st), msg);
  cr_expect_eq(mp_last_driver_error(), code,
               "the driver code is not the import's failure's: %d (%s)",
               mp_last_driver_error(), msg);
  const char *at = strstr(msg, why);
  cr_expect(at != NULL, "the import's failure is not said: %s", msg);
  cr_expect(at != NULL &&
                strstr(at, "cuThreadExchangeStreamCaptureMode") != NULL,
            "the refused restore is not told after it: %s", msg);
  cr_expect(strstr(msg, "succeeded") == NULL, "%s", msg);
}

Test(cuda_ipc_import_refused_restore, a_refused_address_range_is_still_said) {
  struct exporter e;
  start_exporter(&e);
  mp_device_t *dev = open_dev("cuda");
  long long closes = fk_calls("cuIpcCloseMemHandle");
  fk_refuse("cuMemGetAddressRange_v2", CUDA_ERROR_UNKNOWN, 1);
  /* the undo works, the restore after it is refused */
  fk_before_call("cuIpcCloseMemHandle", fk_refuse_next_exchange, NULL);
  void *out = NULL;
  mp_status_t st = dev->ops->ipc_open(dev, &e.h, &out);
  expect_failure_then_note(st, MP_EDRIVER, CUDA_ERROR_UNKNOWN,
                           "cuMemGetAddressRange");
  cr_expect_null(out);
  cr_expect_eq(fk_calls("cuIpcCloseMemHandle") - closes, 1,
               "what was opened was not closed");
  cr_expect_eq(fk_exchange_capture_mode(CU_STREAM_CAPTURE_MODE_GLOBAL),
               CU_STREAM_CAPTURE_MODE_RELAXED);
  mp_device_close(dev);
  stop_exporter(&e);
}

/* The handle claims more memory than the allocation it names: MP_EINVAL,
 * no driver code, said so. */
Test(cuda_ipc_import_refused_restore, a_handle_too_large_is_still_said) {
  struct exporter e;
  start_exporter(&e);
  mp_device_t *dev = open_dev("cuda");
  mp_ipc_handle_t h = e.h;
  h.mem_bytes = 2 * BYTES;
  /* the undo works, the restore after it is refused */
  fk_before_call("cuIpcCloseMemHandle", fk_refuse_next_exchange, NULL);
  void *out = NULL;
  mp_status_t st = dev->ops->ipc_open(dev, &h, &out);
  expect_failure_then_note(st, MP_EINVAL, 0, "the handle says");
  cr_expect_null(out);
  cr_expect_eq(fk_exchange_capture_mode(CU_STREAM_CAPTURE_MODE_GLOBAL),
               CU_STREAM_CAPTURE_MODE_RELAXED);
  mp_device_close(dev);
  stop_exporter(&e);
}
