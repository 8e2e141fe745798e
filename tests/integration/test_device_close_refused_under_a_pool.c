/* test_device_close_refused_under_a_pool.c - mp_device_close refuses while
 * a pool made on the device is not destroyed (MP_EBUSY, nothing closed):
 * the pool holds the device's memory and streams, and its next call used
 * them freed (a default pool's mp_malloc crashed in the device's stream
 * lookup after its device was closed, under ASan a use after free). Once
 * the pools are destroyed the close goes. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include <mempool/mempool.h>

static void expect_refused(mp_device_t *dev, const char *count) {
  cr_expect_eq(mp_device_close_ex(dev), MP_EBUSY, "closed under a pool");
  cr_expect(strstr(mp_last_error(), "mp_device_close") != NULL &&
                strstr(mp_last_error(), count) != NULL &&
                strstr(mp_last_error(), "nothing was closed") != NULL,
            "%s", mp_last_error());
}

Test(device_close_under_a_pool, is_refused_until_the_pool_is_destroyed) {
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host:capacity=64M", &dev), MP_OK, "%s",
               mp_last_error());
  mp_pool_t *p;
  cr_assert_eq(mp_pool_create(dev, NULL, &p), MP_OK, "%s", mp_last_error());
  void *a;
  cr_assert_eq(mp_pool_alloc(p, 1 << 20, NULL, &a), MP_OK, "%s",
               mp_last_error());
  memset(a, 7, 1 << 20);
  expect_refused(dev, "1 pool is still made on it");
  /* Nothing changed: the block and the device are as they were. */
  cr_expect_eq(((unsigned char *)a)[(1 << 20) - 1], 7);
  cr_expect_eq(mp_pool_free(p, a), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_alloc(p, 1 << 20, NULL, &a), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_free(p, a), MP_OK);
  cr_assert_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_device_close_ex(dev), MP_OK, "%s", mp_last_error());
}

/* A child counts as a pool of its own: both must go. */
Test(device_close_under_a_pool, counts_a_child_pool) {
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host:capacity=64M", &dev), MP_OK, "%s",
               mp_last_error());
  mp_pool_t *p, *c;
  cr_assert_eq(mp_pool_create(dev, NULL, &p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_create_child(p, 4 << 20, &c), MP_OK, "%s",
               mp_last_error());
  expect_refused(dev, "2 pools are still made on it");
  cr_assert_eq(mp_pool_destroy(c), MP_OK, "%s", mp_last_error());
  expect_refused(dev, "1 pool is still made on it");
  cr_assert_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_device_close_ex(dev), MP_OK, "%s", mp_last_error());
}

/* The default pool lives until the process exits: its device is never
 * closed, and mp_malloc goes on working after the refusal. */
Test(device_close_under_a_pool, the_default_pools_device_stays_open) {
  setenv("MEMPOOL_DEVICE", "host", 1);
  unsetenv("MEMPOOL_CONF");
  mp_pool_t *p = mp_default_pool();
  cr_assert_not_null(p, "%s", mp_last_error());
  expect_refused(mp_pool_device(p), "1 pool is still made on it");
  void *a = NULL;
  cr_expect_eq(mp_malloc(&a, 4096), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_free(a), MP_OK, "%s", mp_last_error());
}
