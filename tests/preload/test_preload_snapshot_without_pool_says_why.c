/* test_preload_snapshot_without_pool_says_why.c - mempool_preload_snapshot
 * (and MEMPOOL_SNAPSHOT at exit, the same call) refused for want of a pool
 * says why in the last error, the one a ctypes caller reads and the line
 * the shim prints: no device has a pool (a program that ends with
 * cudaDeviceReset leaves none), or the shim serves no allocation
 * (MEMPOOL_PRELOAD=passthrough). Before, MP_EINVAL came back with the last
 * error left as whatever had failed last on the thread, and the printed
 * line quoted that.
 *
 * The shim's sources run in the test's process (no LD_PRELOAD), on the
 * fake driver (tests/fakecuda). */
#include <string.h>

#include "in_process.h"

/* Leaves a last error that has nothing to do with a snapshot. */
static void unrelated_failure(void) {
  mp_device_t *dev = NULL;
  cr_assert_neq(mp_device_open("no-such-backend", &dev), MP_OK);
  cr_assert_null(strstr(mp_last_error(), "snapshot"), "%s", mp_last_error());
}

static void passthrough(void) {
  setenv("MEMPOOL_DEVICE", "cuda", 1);
  setenv("MEMPOOL_PRELOAD", "passthrough", 1);
  unsetenv("MEMPOOL_CONF");
  (void)mp_in_process_context();
}

/* Failed before: the last error was the device spec's. */
Test(preload_snapshot_without_pool_says_why,
     after_the_devices_reset_it_says_no_pool, .init = mp_in_process_cuda) {
  cr_assert_not_null(mp__pl_pool_first(mp__pl_get()), "device 0 has no pool");
  cr_assert_eq(cuDevicePrimaryCtxReset_v2(0), 0, "the reset");
  cr_assert_null(mp__pl_pool_first(mp__pl_get()), "the reset left a pool");
  unrelated_failure();
  cr_expect_eq(mempool_preload_snapshot("/dev/null"), MP_EINVAL);
  cr_expect_not_null(strstr(mp_last_error(), "no pool"), "the last error: %s",
                     mp_last_error());
}

/* Failed before, as the one above. */
Test(preload_snapshot_without_pool_says_why, in_passthrough_it_says_no_pool,
     .init = passthrough) {
  cr_assert_eq(mp__pl_get()->mode, MP__PL_PASSTHROUGH);
  unrelated_failure();
  cr_expect_eq(mempool_preload_snapshot("/dev/null"), MP_EINVAL);
  cr_expect_not_null(strstr(mp_last_error(), "no pool"), "the last error: %s",
                     mp_last_error());
  cr_expect_not_null(strstr(mp_last_error(), "MEMPOOL_PRELOAD"),
                     "the last error: %s", mp_last_error());
}

/* A NULL path is refused as such (and was before, with a stale error). */
Test(preload_snapshot_without_pool_says_why, a_null_path_says_so,
     .init = mp_in_process_cuda) {
  unrelated_failure();
  cr_expect_eq(mempool_preload_snapshot(NULL), MP_EINVAL);
  cr_expect_not_null(strstr(mp_last_error(), "path is NULL"),
                     "the last error: %s", mp_last_error());
}
