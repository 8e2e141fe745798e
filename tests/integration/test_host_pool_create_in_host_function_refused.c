/* test_host_pool_create_in_host_function_refused.c - mp_host_pool_create
 * called from a host function (cuda.h, cuLaunchHostFunc: "must not make
 * any CUDA API calls") is refused before anything is made, saying why in
 * its own name. Before, it opened the pinned view of the device, had its
 * stream's create refused there, and then the view's close refused too:
 * the view stayed for good, and the message was the undoing's
 * ("mp_device_close: called from a host function"), a call the program
 * never made. */
#include <criterion/criterion.h>
#include <string.h>

#include <mempool/host_pool.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"

static mp_device_t *dev;
static mp_host_pool_t *const untouched = (mp_host_pool_t *)0x1;
static mp_host_pool_t *made;
static mp_status_t got;
static char why[600];

static void create_there(void *arg) {
  (void)arg;
  made = untouched;
  got = mp_host_pool_create(dev, NULL, &made);
  snprintf(why, sizeof why, "%s", mp_last_error());
}

Test(host_pool_create_in_host_function, is_refused_in_its_own_name) {
  dev = open_dev("host");
  run_in_host_fn(dev, create_there, NULL);
  cr_assert_eq(got, MP_EINVAL, "%s: %s", mp_status_name(got), why);
  cr_expect_eq(made, untouched, "*out stays as it was");
  cr_expect_neq(strstr(why, "mp_host_pool_create"), NULL, "%s", why);
  cr_expect_neq(strstr(why, "host function"), NULL, "%s", why);
  cr_expect_eq(strstr(why, "mp_device_close"), NULL, "%s", why);
  /* Outside the host function it is made, and goes. */
  mp_host_pool_t *hp = NULL;
  cr_assert_eq(mp_host_pool_create(dev, NULL, &hp), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_host_pool_destroy(hp), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_device_close_ex(dev), MP_OK, "%s", mp_last_error());
}
