/* two_devices.h - for the tests of the shim's sources in the test's
 * process (in_process.h) on two devices of the fake driver
 * (FAKECUDA_DEVICE_COUNT=2): device d's primary context made current, and
 * a stream of device d's own. */
#ifndef MP_TESTS_PRELOAD_TWO_DEVICES_H
#define MP_TESTS_PRELOAD_TWO_DEVICES_H

#include "capture_fork.h"

/* .init: two devices, pooling on the fake driver, device 0 current. */
static inline void mp_two_devices(void) {
  unsetenv("MEMPOOL_TRACE");
  setenv("FAKECUDA_DEVICE_COUNT", "2", 1);
  mp_in_process_cuda();
}

/* Device d's primary context current on this thread (entry points the
 * shim does not hook). */
static inline void mp_use_device(int d) {
  mp__curesult (*retain)(void **, int) = NULL;
  *(void **)&retain = fake("cuDevicePrimaryCtxRetain");
  void *ctx = NULL;
  cr_assert_eq(retain(&ctx, d), 0, "device %d's primary context", d);
  cr_assert_eq(mp_in_process_set_current(ctx), 0);
}

/* A non-blocking stream of device d; device 0 current again after. */
static inline mp__custream mp_stream_of_device(int d) {
  mp__custream s = NULL;
  mp_use_device(d);
  cr_assert_eq(cuStreamCreate(&s, 1 /* CU_STREAM_NON_BLOCKING */), 0);
  mp_use_device(0);
  return s;
}

/* s, of device d, destroyed with d's context current (another context's
 * stream is an invalid handle to the fake); device 0 current again. */
static inline void mp_stream_destroy_on(int d, mp__custream s) {
  mp_use_device(d);
  cr_expect_eq(cuStreamDestroy_v2(s), 0);
  mp_use_device(0);
}

#endif
