/* The cuda backend relaxes the calling thread's capture mode around the
 * calls a capture of another thread would otherwise forbid (cuda.h,
 * cuThreadExchangeStreamCaptureMode) and gives the thread its own mode
 * back after. Where the driver refused that restore, the thread was left
 * relaxed, and nothing said so: its own captures no longer stopped the
 * unsafe calls of other threads. Now a call that failed tells it in its
 * message; one that succeeded (its memory made, the caller's) still
 * succeeds and the refusal is the thread's last error with the driver's
 * code; close counts it among its refusals. The refused restore is the
 * fake driver's: no GPU twin. */
#include <string.h>

#include "../../support/device_helpers.h"
#include "fakecuda_test.h"

/* The thread's capture mode, as the driver has it (exchanged and put
 * back). */
static CUstreamCaptureMode thread_mode(void) {
  CUresult (*xchg)(CUstreamCaptureMode *);
  FK_LOAD(xchg, "cuThreadExchangeStreamCaptureMode");
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_GLOBAL;
  cr_assert_eq(xchg(&m), CUDA_SUCCESS);
  CUstreamCaptureMode back = m;
  cr_assert_eq(xchg(&back), CUDA_SUCCESS);
  return m;
}

static void set_thread_mode(CUstreamCaptureMode m) {
  CUresult (*xchg)(CUstreamCaptureMode *);
  FK_LOAD(xchg, "cuThreadExchangeStreamCaptureMode");
  cr_assert_eq(xchg(&m), CUDA_SUCCESS);
}

/* Run before the call made in relaxed mode: the next exchange (the
 * restore) is refused. */
static void refuse_restore(void *arg) {
  (void)arg;
  fk_refuse("cuThreadExchangeStreamCaptureMode", CUDA_ERROR_INVALID_VALUE, 1);
}

Test(cuda_capture_mode_restore,
     a_succeeded_alloc_says_the_thread_stays_relaxed) {
  if (fk_is_real())
    cr_skip_test("the refused restore is the fake driver's");
  mp_device_t *dev = open_dev("cuda");
  cr_assert_eq(thread_mode(), CU_STREAM_CAPTURE_MODE_GLOBAL);
  cr_assert_eq(mp_device_free(dev, (void *)16), MP_EINVAL); /* a last error */
  fk_before_call("cuMemAlloc_v2", refuse_restore, NULL);
  void *p = NULL;
  mp_status_t st = mp_device_alloc(dev, 1 << 20, &p);
  /* The allocation was made: it is the caller's, not lost. */
  cr_assert_eq(st, MP_OK, "%s: %s", mp_status_name(st), mp_last_error());
  cr_assert_not_null(p);
  cr_expect_eq(thread_mode(), CU_STREAM_CAPTURE_MODE_RELAXED,
               "the fake restored the mode after all");
  cr_expect_eq(mp_last_status(), MP_EDRIVER, "%s", mp_last_error());
  cr_expect_eq(mp_last_driver_error(), CUDA_ERROR_INVALID_VALUE, "%d",
               mp_last_driver_error());
  cr_expect(strstr(mp_last_error(), "cuThreadExchangeStreamCaptureMode") !=
                    NULL &&
                strstr(mp_last_error(), "global") != NULL &&
                strstr(mp_last_error(), "left in relaxed") != NULL,
            "%s", mp_last_error());
  set_thread_mode(CU_STREAM_CAPTURE_MODE_GLOBAL);
  cr_expect_eq(mp_device_free(dev, p), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

Test(cuda_capture_mode_restore, a_failed_alloc_says_it_in_its_message) {
  if (fk_is_real())
    cr_skip_test("the refused restore is the fake driver's");
  mp_device_t *dev = open_dev("cuda");
  fk_before_call("cuMemAlloc_v2", refuse_restore, NULL);
  fk_refuse("cuMemAlloc_v2", CUDA_ERROR_OUT_OF_MEMORY, 1);
  void *p = NULL;
  mp_status_t st = mp_device_alloc(dev, 1 << 20, &p);
  fk_refuse("cuMemAlloc_v2", CUDA_SUCCESS, 0);
  fk_refuse("cuThreadExchangeStreamCaptureMode", CUDA_SUCCESS, 0);
  cr_expect_eq(st, MP_ENOMEM, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect_null(p);
  cr_expect(strstr(mp_last_error(), "cuMemAlloc") != NULL &&
                strstr(mp_last_error(), "CUDA_ERROR_OUT_OF_MEMORY") != NULL &&
                strstr(mp_last_error(), "cuThreadExchangeStreamCaptureMode") !=
                    NULL &&
                strstr(mp_last_error(), "left in relaxed") != NULL,
            "%s", mp_last_error());
  cr_expect_eq(thread_mode(), CU_STREAM_CAPTURE_MODE_RELAXED);
  set_thread_mode(CU_STREAM_CAPTURE_MODE_GLOBAL);
  /* The note is the failed call's: the next failure does not repeat it. */
  cr_assert_eq(mp_device_free(dev, (void *)16), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "CaptureMode") == NULL, "%s",
            mp_last_error());
  mp_device_close(dev);
}

/* A query that answers "not ready" did not fail: the restore's refusal is
 * the last error, as after a success. */
Test(cuda_capture_mode_restore, a_free_says_it_too) {
  if (fk_is_real())
    cr_skip_test("the refused restore is the fake driver's");
  mp_device_t *dev = open_dev("cuda");
  void *p = NULL;
  cr_assert_eq(mp_device_alloc(dev, 1 << 20, &p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_device_free(dev, (void *)16), MP_EINVAL);
  fk_before_call("cuMemFree_v2", refuse_restore, NULL);
  mp_status_t st = mp_device_free(dev, p);
  cr_expect_eq(st, MP_OK, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect_eq(mp_last_status(), MP_EDRIVER, "%s", mp_last_error());
  cr_expect(strstr(mp_last_error(), "cuThreadExchangeStreamCaptureMode") !=
                NULL,
            "%s", mp_last_error());
  cr_expect_eq(thread_mode(), CU_STREAM_CAPTURE_MODE_RELAXED);
  set_thread_mode(CU_STREAM_CAPTURE_MODE_GLOBAL);
  mp_device_close(dev);
}

/* Close goes on, and names the refused restore among its refusals. */
Test(cuda_capture_mode_restore, close_counts_it_as_a_refusal) {
  if (fk_is_real())
    cr_skip_test("the refused restore is the fake driver's");
  mp_device_t *dev = open_dev("cuda");
  void *p = NULL;
  cr_assert_eq(mp_device_alloc(dev, 1 << 20, &p), MP_OK, "%s", mp_last_error());
  fk_before_call("cuMemFree_v2", refuse_restore, NULL);
  int closed = 0;
  mp_status_t st = mp_device_close_checked(dev, &closed);
  cr_expect(closed, "%s", mp_last_error());
  cr_expect_eq(st, MP_EDRIVER, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect(strstr(mp_last_error(), "cuThreadExchangeStreamCaptureMode") !=
                NULL,
            "%s", mp_last_error());
  cr_expect_eq(thread_mode(), CU_STREAM_CAPTURE_MODE_RELAXED);
  set_thread_mode(CU_STREAM_CAPTURE_MODE_GLOBAL);
}
