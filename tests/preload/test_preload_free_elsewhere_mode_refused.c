/* test_preload_free_elsewhere_mode_refused.c - a stream-ordered free of a
 * pool block on another device's stream waits for that stream
 * (cuStreamSynchronize, free.c's mp__stream_wait) in relaxed capture mode,
 * a call of the shim's own. Where the driver refuses the switch to relaxed
 * mode (cuThreadExchangeStreamCaptureMode, cuFakeRefuse) while a capture
 * is begun, the free is refused with the switch's code and the block
 * stays the program's: waiting in the caller's mode is a potentially
 * unsafe call (cuda.h, cuThreadExchangeStreamCaptureMode: "prohibited from
 * potentially unsafe API calls") that a global-mode capture prohibits, and
 * the driver then invalidates that capture (seen on an H200, driver
 * 580.159.04, 2026-11-28: the fake's fk_lookup_stream).
 *
 * Before, the wait went ahead in the caller's mode: the free was refused
 * (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) and the capture, the program's
 * own, was invalidated with it. The shim's sources run in this process on
 * the fake driver with two devices. */
#include "two_devices.h"

#include "mempool/status.h"

#define UNKNOWN             999u /* cuda.h, CUDA_ERROR_UNKNOWN */
#define CAPTURE_INVALIDATED 901u /* CUDA_ERROR_STREAM_CAPTURE_INVALIDATED */

static void mode_switch_refused(unsigned code) {
  bool (*refuse)(const char *, int, long) = NULL;
  *(void **)&refuse = fake("cuFakeRefuse");
  cr_assert(
      refuse("cuThreadExchangeStreamCaptureMode", (int)code, code ? -1 : 0));
}

/* Device 0's block freed on device 1's stream while this thread captures
 * in global mode on a stream of device 0. */
Test(preload_free_elsewhere_mode_refused, capture_stays_valid,
     .init = mp_two_devices) {
  mp__cuptr p = 0;
  cr_assert_eq(cuMemAlloc_v2(&p, 4096), 0);
  mp__custream s1 = mp_stream_of_device(1);
  mp__custream c = mp_stream_of_device(0);
  cr_assert_eq(cuStreamBeginCapture_v2(c, 0 /* GLOBAL */), 0);
  mode_switch_refused(UNKNOWN);
  mp__curesult r = cuMemFreeAsync(p, s1);
  mode_switch_refused(0);
  cr_expect_eq(r, UNKNOWN, "the free answered %u, not the switch's code", r);
  cr_expect(strstr(mp_last_error(), "cuThreadExchangeStreamCaptureMode") !=
                NULL,
            "the last error says: %s", mp_last_error());
  mp__cugraph g = NULL;
  mp__curesult e = cuStreamEndCapture(c, &g);
  cr_expect_eq(e, 0, "the capture ended %u: the free invalidated it", e);
  if (e == 0)
    cr_expect_eq(cuGraphDestroy(g), 0);
  cr_expect_eq(cuMemFreeAsync(p, s1), 0,
               "the block is no longer the program's");
  cr_expect_eq(cuStreamDestroy_v2(c), 0);
  mp_stream_destroy_on(1, s1);
}

/* No capture begun: the refused switch cannot matter, and the free waits
 * in the caller's mode as before. */
Test(preload_free_elsewhere_mode_refused, no_capture_free_served,
     .init = mp_two_devices) {
  mp__cuptr p = 0;
  cr_assert_eq(cuMemAlloc_v2(&p, 4096), 0);
  mp__custream s1 = mp_stream_of_device(1);
  mode_switch_refused(UNKNOWN);
  mp__curesult r = cuMemFreeAsync(p, s1);
  mode_switch_refused(0);
  cr_expect_eq(r, 0, "the free answered %u (%s)", r, mp_last_error());
  mp_stream_destroy_on(1, s1);
}
