/* The cuda backend's import of a plain allocation's handle (ipc_open:
 * cuIpcOpenMemHandle, then cuMemGetAddressRange to check the handle's size
 * against what it maps) when the driver refuses a step. A refused
 * cuMemGetAddressRange is the driver's failure, said as such (before, it
 * was reported as a handle claiming more memory than its allocation has,
 * "has 0"); and where the undoing cuIpcCloseMemHandle is refused too, the
 * memory stays mapped: ipc_open says so and hands back where (*out), for
 * mp_ipc_import to keep for mp_device_close (before, it was forgotten,
 * mapped). The exporter is a forked child by the handle's word (the
 * driver opens no handle in the process that made it). The refusals are the
 * fake's (cuFakeRefuse): no GPU twin. */
#include "ipc_exporter.h"

/* An open that works, closed again: the handle itself was good. */
static void open_and_close(mp_device_t *dev, const mp_ipc_handle_t *h) {
  void *out = NULL;
  cr_assert_eq(dev->ops->ipc_open(dev, h, &out), MP_OK, "%s", mp_last_error());
  bool unmapped = false;
  cr_assert_eq(dev->ops->ipc_close(dev, out, BYTES, MP_IPC_CUDA, &unmapped),
               MP_OK, "%s", mp_last_error());
  cr_assert(unmapped);
}

Test(cuda_ipc_open_refusals, a_refused_address_range_is_the_drivers_failure) {
  struct exporter e;
  start_exporter(&e);
  mp_device_t *dev = open_dev("cuda");
  long long closes = fk_calls("cuIpcCloseMemHandle");
  fk_refuse("cuMemGetAddressRange_v2", CUDA_ERROR_UNKNOWN, 1);
  void *out = NULL;
  mp_status_t st = dev->ops->ipc_open(dev, &e.h, &out);
  cr_expect_eq(st, MP_EDRIVER, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect(strstr(mp_last_error(), "cuMemGetAddressRange") != NULL &&
                strstr(mp_last_error(), "CUDA_ERROR_UNKNOWN") != NULL,
            "the refusal is not named: %s", mp_last_error());
  cr_expect_null(out);
  cr_expect_eq(fk_calls("cuIpcCloseMemHandle") - closes, 1,
               "what was opened was not closed");
  open_and_close(dev, &e.h);
  mp_device_close(dev);
  stop_exporter(&e);
}

Test(cuda_ipc_open_refusals, a_refused_undoing_close_says_what_stays_mapped) {
  struct exporter e;
  start_exporter(&e);
  mp_device_t *dev = open_dev("cuda");
  fk_refuse("cuMemGetAddressRange_v2", CUDA_ERROR_UNKNOWN, 1);
  fk_refuse("cuIpcCloseMemHandle", CUDA_ERROR_UNKNOWN, 1);
  void *out = NULL;
  mp_status_t st = dev->ops->ipc_open(dev, &e.h, &out);
  cr_expect_neq(st, MP_OK);
  cr_expect(strstr(mp_last_error(), "stays mapped") != NULL, "%s",
            mp_last_error());
  cr_assert_not_null(out, "what stays mapped was not handed back");
  long long closes = fk_calls("cuIpcCloseMemHandle");
  bool unmapped = false;
  cr_expect_eq(dev->ops->ipc_close(dev, out, BYTES, MP_IPC_CUDA, &unmapped),
               MP_OK, "%s", mp_last_error());
  cr_expect(unmapped);
  cr_expect_eq(fk_calls("cuIpcCloseMemHandle") - closes, 1);
  open_and_close(dev, &e.h);
  mp_device_close(dev);
  stop_exporter(&e);
}

/* Run in cuIpcCloseMemHandle, the undoing close made in relaxed capture
 * mode: the restore of the thread's mode after it is refused. */
static void refuse_restore(void *arg) {
  (void)arg;
  fk_refuse("cuThreadExchangeStreamCaptureMode", CUDA_ERROR_INVALID_VALUE, 1);
}

/* The restore of the thread's capture mode refused after the undoing
 * close, refused too: the message says the thread stays relaxed (before,
 * the note was kept for the next failure of another call, which told it
 * as its own). */
Test(cuda_ipc_open_refusals, a_refused_restore_after_the_undo_is_told_here) {
  struct exporter e;
  start_exporter(&e);
  mp_device_t *dev = open_dev("cuda");
  fk_refuse("cuMemGetAddressRange_v2", CUDA_ERROR_UNKNOWN, 1);
  fk_refuse("cuIpcCloseMemHandle", CUDA_ERROR_UNKNOWN, 1);
  fk_before_call("cuIpcCloseMemHandle", refuse_restore, NULL);
  void *out = NULL;
  mp_status_t st = dev->ops->ipc_open(dev, &e.h, &out);
  cr_expect_neq(st, MP_OK);
  cr_expect(strstr(mp_last_error(), "stays mapped") != NULL &&
                strstr(mp_last_error(), "cuThreadExchangeStreamCaptureMode") !=
                    NULL,
            "%s", mp_last_error());
  CUresult (*xchg)(CUstreamCaptureMode *);
  FK_LOAD(xchg, "cuThreadExchangeStreamCaptureMode");
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_GLOBAL;
  cr_assert_eq(xchg(&m), CUDA_SUCCESS);
  cr_expect_eq(m, CU_STREAM_CAPTURE_MODE_RELAXED);
  /* Another call's failure is its own. */
  void *p = NULL;
  fk_refuse("cuMemAlloc_v2", CUDA_ERROR_OUT_OF_MEMORY, 1);
  cr_expect_eq(mp_device_alloc(dev, BYTES, &p), MP_ENOMEM);
  cr_expect(strstr(mp_last_error(), "CaptureMode") == NULL, "%s",
            mp_last_error());
  bool unmapped = false;
  cr_expect_eq(dev->ops->ipc_close(dev, out, BYTES, MP_IPC_CUDA, &unmapped),
               MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
  stop_exporter(&e);
}
