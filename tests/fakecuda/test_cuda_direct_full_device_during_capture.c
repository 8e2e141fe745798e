/* test_cuda_direct_full_device_during_capture.c - mp_direct_alloc on a
 * stream being captured that finds the device full keeps the capture
 * valid. Ending the session (the retry of a full device) synchronizes the
 * device, and cuCtxSynchronize during a capture is refused and invalidates
 * it (cuda.h, cuThreadExchangeStreamCaptureMode: cuCtxSynchronize is a
 * "potentially unsafe API call"; the fake refuses it beside any capture,
 * as an H200 did): the allocation used to end the session anyway, so the
 * application's capture was lost to an allocation that failed. It is
 * MP_ENOMEM, says why, and the deferred blocks stay for a later session;
 * another thread's capture in global mode (capture_beside.h) stays valid
 * too. */
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "capture_beside.h"
#include "fakecuda_test.h"

static void load_driver(void) {
  setenv("FAKECUDA_DEVICE", "capacity=64M", 1); /* read at cuInit */
  capture_load();
}

Test(cuda_direct_full_device_during_capture,
     an_oom_on_a_captured_stream_leaves_the_capture_valid,
     .init = load_driver) {
  mp_device_t *dev = open_dev("cuda");
  mp_direct_t *d = NULL;
  cr_assert_eq(mp_direct_create(dev, &d), MP_OK, "%s", mp_last_error());
  /* Over half of what is free twice: the second fits only once the first
   * went back to the device. */
  size_t big = free_bytes(dev) / 10 * 6;
  big &= ~(((size_t)1 << 20) - 1);
  void *a = NULL, *b = NULL;
  cr_assert_eq(mp_direct_alloc(d, big, NULL, &a), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_direct_free(d, a), MP_OK); /* deferred */

  capture_t beside;
  capture_start(&beside);
  CUstream c = capture_begin_here();
  mp_status_t st = mp_direct_alloc(d, big, (mp_stream_t)c, &b);
  char why[512];
  snprintf(why, sizeof why, "%s", mp_last_error());
  CUresult end = capture_end_here(c);
  capture_finish(&beside);

  cr_expect_eq(end, CUDA_SUCCESS, "the capture was invalidated (%d)", (int)end);
  cr_expect_eq(st, MP_ENOMEM, "%s", why);
  cr_expect_neq(strstr(why, "captur"), NULL, "%s", why);
  mp_stats_t s;
  cr_assert_eq(mp_direct_get_stats(d, &s), MP_OK);
  cr_expect_eq(s.free_blocks, 1, "the freed block stays deferred");

  /* Once the capture is over, the allocation ends the session and fits. */
  if (st == MP_OK)
    cr_assert_eq(mp_direct_free(d, b), MP_OK);
  cr_assert_eq(mp_direct_alloc(d, big, NULL, &b), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_direct_free(d, b), MP_OK);
  cr_assert_eq(mp_direct_destroy(d), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}
