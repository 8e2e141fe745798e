/* test_host_pool_destroy_in_host_function_refused.c - mp_host_pool_destroy
 * called from a host function (cuda.h, cuLaunchHostFunc: "must not make
 * any CUDA API calls") is refused, said, before anything changes, and the
 * host pool stays usable. Before, a host pool whose pool had nothing to
 * wait for (no buffer ever allocated) was destroyed there: the pool went
 * and hp was freed, but the device refused mp_stream_destroy of the host
 * pool's own stream and mp_device_close of its view, which stayed for
 * good, and the call answered MP_OK with "mp_device_close: called from a
 * host function" as the caller's last error. */
#include <criterion/criterion.h>
#include <string.h>

#include <mempool/host_pool.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"

static mp_device_t *dev;
static mp_host_pool_t *hp;
static mp_status_t got;
static char why[600];

static void setup(void) {
  dev = open_dev("host");
  cr_assert_eq(mp_host_pool_create(dev, NULL, &hp), MP_OK, "%s",
               mp_last_error());
}

static void teardown(void) {
  cr_expect_eq(mp_host_pool_destroy(hp), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

TestSuite(host_pool_destroy_in_host_function, .init = setup, .fini = teardown);

static void destroy_there(void *arg) {
  (void)arg;
  got = mp_host_pool_destroy(hp);
  snprintf(why, sizeof why, "%s", mp_last_error());
}

/* Refused, naming the call, and the host pool still serves. */
static void refused_and_usable(void) {
  got = MP_OK;
  run_in_host_fn(dev, destroy_there, NULL);
  cr_assert_eq(got, MP_EINVAL, "%s: %s", mp_status_name(got), why);
  cr_expect_neq(strstr(why, "mp_host_pool_destroy"), NULL, "%s", why);
  cr_expect_neq(strstr(why, "host function"), NULL, "%s", why);
  void *p = NULL;
  cr_assert_eq(mp_host_pool_alloc(hp, 4096, NULL, &p), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_host_pool_free(hp, p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_host_pool_check(hp), MP_OK, "%s", mp_last_error());
}

Test(host_pool_destroy_in_host_function, a_pool_never_used) {
  refused_and_usable();
}

Test(host_pool_destroy_in_host_function, a_pool_holding_a_cached_chunk) {
  void *p = NULL;
  cr_assert_eq(mp_host_pool_alloc(hp, 4096, NULL, &p), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_host_pool_free(hp, p), MP_OK, "%s", mp_last_error());
  refused_and_usable();
}
