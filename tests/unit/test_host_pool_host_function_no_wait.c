/* The host pool called from a host function (mp_stream_launch_host,
 * cuLaunchHostFunc: "The host function must not make any CUDA API calls",
 * cuda.h) answers at once, as the device pool does
 * (test_pool_host_function_no_wait.c), and a refused call changes nothing.
 * The pool asks its device whether the caller is a host function before it
 * waits for a device call in flight or synchronizes (src/pool/lock.c,
 * mp__pool_in_host_fn); the host pool's device, the pinned view of the
 * host device (device/pinned.c), never said so. So a trim was refused only
 * by the host device's synchronize, in a message naming
 * mp_device_synchronize, a call the program never made; and an allocation
 * at the cap waited for another thread's release of a cached chunk, whose
 * cuMemFreeHost (the host device's host_free) waits for the running host
 * function: neither returned. A hang ends in ctest's timeout (no Criterion
 * .timeout: see test_pool_host_function_no_wait.c). */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include <mempool/host_pool.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"

#define MiB ((size_t)1 << 20)

static mp_device_t *dev;
static mp_host_pool_t *hp;
static void *bufs[4];

/* Four 2 MiB buffers, each a chunk of its own (more than half of the
 * 2 MiB chunk size), the last one freed: cached, above release_threshold
 * (the next free gives it back before its own buffer joins). */
static void setup(void) {
  dev = open_dev("host");
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_assert_eq(mp_pool_config_parse(&cfg, "max_bytes=8M,release_threshold=1M"),
               MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_host_pool_create(dev, &cfg, &hp), MP_OK, "%s",
               mp_last_error());
  for (int i = 0; i < 4; i++)
    cr_assert_eq(mp_host_pool_alloc(hp, 2 * MiB, NULL, &bufs[i]), MP_OK, "%s",
                 mp_last_error());
  cr_assert_eq(mp_host_pool_free(hp, bufs[3]), MP_OK, "%s", mp_last_error());
}

static void teardown(void) {
  cr_expect_eq(mp_host_pool_destroy(hp), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

TestSuite(host_pool_host_function_no_wait, .init = setup, .fini = teardown);

static mp_stats_t stats(void) {
  mp_stats_t s;
  cr_assert_eq(mp_host_pool_get_stats(hp, &s), MP_OK, "%s", mp_last_error());
  return s;
}

typedef struct {
  bool trim;           /* the call: a trim, else an allocation at the cap */
  atomic_bool freeing; /* the test's thread is about to free bufs[2] */
  mp_status_t st;
  char why[512];
  void *p;
} call_t;

static void call_from_host_fn(void *v) {
  call_t *c = v;
  if (c->trim) {
    c->st = mp_host_pool_trim(hp, 0);
  } else {
    /* The other thread's free has begun its release (it waits for this
     * function): at most 5 s for its start, then 50 ms for the release. */
    for (int ms = 0; !atomic_load(&c->freeing) && ms < 5000; ms++)
      nanosleep(&(struct timespec){0, 1000000}, NULL);
    nanosleep(&(struct timespec){0, 50000000}, NULL);
    c->st = mp_host_pool_alloc(hp, 4 * MiB, NULL, &c->p);
  }
  snprintf(c->why, sizeof c->why, "%s", mp_last_error());
}

Test(host_pool_host_function_no_wait, trim_is_refused_and_changes_nothing) {
  mp_stats_t before = stats();
  call_t c = {.trim = true};
  run_in_host_fn(dev, call_from_host_fn, &c);
  cr_expect_eq(c.st, MP_EINVAL, "%s: %s", mp_status_name(c.st), c.why);
  cr_expect_neq(strstr(c.why, "mp_host_pool_trim: called from a host function"),
                NULL, "%s", c.why);
  mp_stats_t after = stats();
  cr_expect_eq(after.reserved_bytes, before.reserved_bytes, "a chunk went");
  cr_expect_eq(after.free_bytes, 2 * MiB, "the cached chunk went");
}

/* At the cap (8 MiB held, 2 MiB of it cached), beside another thread's
 * free whose release of the cached chunk waits for the host function: the
 * allocation answers (no growth from a host function) instead of waiting
 * for that release, and the free completes once the function returns. */
Test(host_pool_host_function_no_wait, alloc_at_the_cap_beside_a_release) {
  call_t c = {.trim = false};
  atomic_init(&c.freeing, false);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_launch_host(dev, s, call_from_host_fn, &c), MP_OK,
               "%s", mp_last_error());
  atomic_store(&c.freeing, true);
  cr_expect_eq(mp_host_pool_free(hp, bufs[2]), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  cr_expect_neq(c.st, MP_OK, "an allocation at the cap was served");
  cr_expect_null(c.p);
  cr_expect_eq(stats().reserved_bytes, 6 * MiB, "%s", c.why);
  for (int i = 0; i < 2; i++)
    cr_expect_eq(mp_host_pool_free(hp, bufs[i]), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_host_pool_check(hp), MP_OK, "%s", mp_last_error());
}
