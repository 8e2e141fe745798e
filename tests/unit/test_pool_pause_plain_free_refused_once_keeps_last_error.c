/* test_pool_pause_plain_free_refused_once_keeps_last_error.c - a pause
 * gives back its free plain segments (pause.c, mp__pause_plain_release);
 * where the device refuses one free once and takes it at the next try, the
 * pause succeeds, and a call that succeeds keeps the caller's last error
 * (status.h). It did not: the device's refusal (its message) became the
 * thread's last error though every segment went back and the pause
 * answered MP_OK. White-box: the device's free is wrapped to refuse once,
 * saying so as a driver would (its own message). */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <string.h>

#include "../support/device_helpers.h"
#include "../support/pool_helpers.h"
#include "device/backend.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)
#define KiB ((size_t)1 << 10)

static const mp__backend_t *host_ops;
static mp__backend_t ops;
static atomic_int refusals_left;

static mp_status_t refuse_once(mp_device_t *d, void *ptr) {
  if (atomic_fetch_sub(&refusals_left, 1) > 0)
    return mp__fail(MP_EDRIVER, "fake driver: free of %p refused once", ptr);
  return host_ops->free(d, ptr);
}

/* max_bytes=21M is no whole number of 2 MiB granules: each 256 KiB block
 * past the 20 MiB one is a plain segment of its own (as in
 * test_pool_pause_arenas_closed_lease.c); both are freed before the pause,
 * which gives them back. */
static void run(const char *opts) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  host_ops = dev->ops;
  ops = *host_ops;
  ops.free = refuse_once;
  dev->ops = &ops;
  mp_pool_t *pool = make_pool(dev, opts);
  void *big, *small[2];
  cr_assert_eq(mp_pool_alloc(pool, 20 * MiB, NULL, &big), MP_OK, "%s",
               mp_last_error());
  for (int i = 0; i < 2; i++)
    cr_assert_eq(mp_pool_alloc(pool, 256 * KiB, NULL, &small[i]), MP_OK, "%s",
                 mp_last_error());
  cr_assert_eq(stats(pool).segment_count, 3, "the test needs plain segments");
  for (int i = 0; i < 2; i++)
    cr_assert_eq(mp_pool_free(pool, small[i]), MP_OK, "%s", mp_last_error());
  /* The caller's last error: a refused call of its own. */
  int x;
  cr_assert_eq(mp_pool_free(pool, &x), MP_EINVAL);
  char mine[512];
  snprintf(mine, sizeof mine, "%s", mp_last_error());
  atomic_store(&refusals_left, 1);
  mp_status_t st = mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT);
  cr_assert_eq(st, MP_OK, "%s: %s: %s", opts, mp_status_name(st),
               mp_last_error());
  cr_expect_eq(atomic_load(&refusals_left), -2,
               "%s: the test needs one refusal and two frees", opts);
  cr_expect_str_eq(mp_last_error(), mine,
                   "%s: the pause that succeeded replaced the last error",
                   opts);
  cr_expect_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(pool).segment_count, 1, "%s", opts);
  cr_assert_eq(mp_pool_free(pool, big), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  dev->ops = host_ops;
  mp_device_close(dev);
}

Test(pool_pause_plain_free_refused_once_keeps_last_error, without_arenas) {
  run("max_bytes=21M");
}

Test(pool_pause_plain_free_refused_once_keeps_last_error, with_arenas) {
  run("max_bytes=21M,arenas=2");
}
