/* test_cuda_pinned_view_ordinal.c - the pinned view of cuda:N (the host
 * pool's device, src/device/pinned.c) is device N's: its ordinal is N,
 * and a stream's device is the device's answer, as on cuda:N itself.
 * Failed before: the view had neither, so it was device 0 whatever N, and
 * could not tell a stream's device (MP_ENOTSUP). Run on the fake driver
 * with two devices. */
#include <stdlib.h>

#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "device/backend.h"
#include "fakecuda_test.h"

static void two_devices(void) {
  setenv("FAKECUDA_DEVICE_COUNT", "2", 1);
}

Test(cuda_pinned_view_ordinal, the_view_of_cuda_1_is_device_1,
     .init = two_devices) {
  mp_device_t *d1 = NULL;
  cr_assert_eq(mp_device_open("cuda:1", &d1), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp__device_ordinal(d1), 1);
  mp_device_t *view = NULL;
  cr_assert_eq(mp__device_pinned_open(d1, &view), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp__device_ordinal(view), 1);
  mp_stream_t s = NULL;
  cr_assert_eq(mp_stream_create(d1, &s), MP_OK, "%s", mp_last_error());
  int on = -1, on_view = -1;
  cr_assert_eq(mp__device_stream_ordinal(d1, s, &on), MP_OK);
  cr_expect_eq(mp__device_stream_ordinal(view, s, &on_view), MP_OK);
  cr_expect_eq(on_view, on);
  cr_expect_eq(on_view, 1);
  cr_assert_eq(mp_stream_destroy(d1, s), MP_OK);
  mp_device_close(view);
  mp_device_close(d1);
}
