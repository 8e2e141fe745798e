/* test_preload_stream_destroy_during_reset.c - a cuStreamDestroy on one
 * device's thread while another thread resets another device
 * (cuDevicePrimaryCtxReset, what cudaDeviceReset does; cuda.h's rule for
 * it, "no other module in the process is using the device any more",
 * binds only users of the device reset) is no data race in the shim. The
 * destroy forgets the stream in every device's pool (streams.c,
 * mp__pl_each_device, under the walk lock read); the reset retires the
 * device's pool and clears its device (devices.c, mp__pl_devices_retire,
 * under another lock). The device was a plain field, read by the walk and
 * written by the retirement with nothing ordering the two: a race that
 * ThreadSanitizer reports (the suite's TSan build runs this test), and a
 * walk that could read the device half written.
 *
 * The window is made wide, not waited for: the reset's first question
 * (mp__pl_calls_refused, wrapped with -Wl,--wrap) is answered, then the
 * resetting thread sleeps before it retires the pool, touching nothing
 * the destroying thread touches, while that thread's walks read the
 * device. The shim's sources run in the test's process (no LD_PRELOAD),
 * pooling on the fake driver (tests/fakecuda) with two devices. */
#include <stdatomic.h>
#include <time.h>

#include "lookup_during_reset.h"

#define MP_ROUNDS 20

bool __real_mp__pl_calls_refused(void);
bool __wrap_mp__pl_calls_refused(void);

static _Thread_local bool mp_resetting; /* this thread is in the reset */

bool __wrap_mp__pl_calls_refused(void) {
  bool refused = __real_mp__pl_calls_refused();
  if (mp_resetting) {
    struct timespec ms2 = {.tv_nsec = 2000000};
    (void)nanosleep(&ms2, NULL);
  }
  return refused;
}

static struct {
  atomic_bool done;
  int failed_round; /* the reset thread's first failing round, or -1 */
  unsigned failed_code;
  const char *failed_call;
} mp_resets = {.failed_round = -1};

/* Device 1, on this thread: its pool made (a block allocated and freed),
 * then the device reset, MP_ROUNDS times. */
static void *reset_device_1(void *unused) {
  (void)unused;
  for (int k = 0; k < MP_ROUNDS && mp_resets.failed_round < 0; k++) {
    mp__cuptr d = 0;
    mp__curesult r = 0;
    const char *call = NULL;
    if (!mp_race_make_current(1))
      call = "cuCtxSetCurrent";
    else if ((r = cuMemAlloc_v2(&d, 4096)) != 0)
      call = "cuMemAlloc";
    else if ((r = cuMemFree_v2(d)) != 0)
      call = "cuMemFree";
    else {
      mp_resetting = true;
      r = cuDevicePrimaryCtxReset_v2(1);
      mp_resetting = false;
      if (r != 0)
        call = "cuDevicePrimaryCtxReset";
    }
    if (call != NULL) {
      mp_resets.failed_round = k;
      mp_resets.failed_code = r;
      mp_resets.failed_call = call;
    }
  }
  atomic_store(&mp_resets.done, true);
  return NULL;
}

static void two_devices(void) {
  mp_race_cuda_mode();
  setenv("FAKECUDA_DEVICE_COUNT", "2", 1);
}

/* Failed before under ThreadSanitizer: "data race" between
 * mp__pl_each_device's read of a device and mp__pl_devices_retire's
 * write. */
Test(preload_stream_destroy_during_reset,
     a_stream_destroy_beside_another_devices_reset_races_nothing,
     .init = two_devices) {
  mp_race_use_device(0);
  (void)mp_race_shim();
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, reset_device_1, NULL), 0);
  unsigned streams = 0;
  mp__curesult r = 0;
  while (!atomic_load(&mp_resets.done)) {
    mp__custream s = NULL;
    if ((r = cuStreamCreate(&s, 0)) != 0 || (r = cuStreamDestroy_v2(s)) != 0)
      break;
    streams++;
  }
  cr_assert_eq(pthread_join(t, NULL), 0);
  cr_expect_eq(r, 0, "a stream's create or destroy on device 0: %u", r);
  cr_expect_eq(mp_resets.failed_round, -1, "round %d on device 1: %s: %u",
               mp_resets.failed_round, mp_resets.failed_call,
               mp_resets.failed_code);
  cr_expect_gt(streams, 0u, "no stream was destroyed during the resets");
}
