/* host_pool_fixture.h - a host device and a host pool over it, for the
 * host pool's tests; hp_stats() reads its counters. */
#ifndef MEMPOOL_TEST_HOST_POOL_FIXTURE_H
#define MEMPOOL_TEST_HOST_POOL_FIXTURE_H

#include <criterion/criterion.h>

#include <mempool/mempool.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static mp_device_t *dev;
static mp_host_pool_t *hp;

static void hp_open(const mp_pool_config_t *cfg) {
  cr_assert_eq(mp_device_open("host", &dev), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_host_pool_create(dev, cfg, &hp), MP_OK, "%s",
               mp_last_error());
}

static void hp_close(void) {
  cr_expect_eq(mp_host_pool_check(hp), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_host_pool_destroy(hp), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

static mp_stats_t hp_stats(void) {
  mp_stats_t st;
  cr_assert_eq(mp_host_pool_get_stats(hp, &st), MP_OK);
  return st;
}

#endif /* MEMPOOL_TEST_HOST_POOL_FIXTURE_H */
