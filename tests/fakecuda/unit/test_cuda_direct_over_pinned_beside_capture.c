/* test_cuda_direct_over_pinned_beside_capture.c - a direct allocator over
 * the pinned view of a device (src/device/pinned.c) never synchronizes the
 * device while a stream of it is being captured. Ending a session
 * synchronizes the device (cuCtxSynchronize: the view forwards its
 * synchronize to the device's), and during any capture of a stream of the
 * context that is invalid and invalidates the capture (the Programming
 * Guide, "Prohibited and Unhandled Operations"; the fake refuses it so, as
 * an H200 did). The direct allocator asks the device's capture_seen first
 * (src/direct.c, mp__direct_capture_check), which the view did not
 * forward: it saw no capture, synchronized, and lost the application's
 * capture. Now the view asks its device: MP_EBUSY, said, the block kept
 * until the capture has ended. The capture is this thread's, in global
 * mode, of a blocking stream the program made itself, which the legacy
 * stream tells of (cuda.h, cuStreamIsCapturing). */
#include "direct_capture.h"

Test(cuda_direct_over_pinned_beside_capture,
     a_session_over_the_pinned_view_waits_for_the_capture,
     .init = direct_capture_init) {
  mp_device_t *dev = open_dev("cuda"), *view = NULL;
  cr_assert_eq(mp__device_pinned_open(dev, &view), MP_OK, "%s",
               mp_last_error());
  mp_direct_t *d = one_deferred(view);

  CUstream c = capture_begin_with(0, CU_STREAM_CAPTURE_MODE_GLOBAL);
  char why[512];
  mp_status_t st = session_beside(d, "cuMemFreeHost", why, sizeof why);
  CUresult end = capture_end_here(c);
  cr_expect_eq(end, CUDA_SUCCESS, "the capture was invalidated (%d)", (int)end);
  cr_expect_eq(st, MP_EBUSY, "%s", why);
  cr_expect_neq(strstr(why, "being captured"), NULL, "%s", why);
  cr_expect_eq(deferred_blocks(d), 1, "the freed block stays deferred");

  cr_assert_eq(mp_direct_free_session(d), MP_OK, "%s", mp_last_error());
  cr_expect_eq(deferred_blocks(d), 0);
  cr_assert_eq(mp_direct_destroy(d), MP_OK, "%s", mp_last_error());
  mp_device_close(view);
  mp_device_close(dev);
}
