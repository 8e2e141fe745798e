/* default_pool_host.h - for tests of the default pool (mp_default_pool,
 * the torch hooks) on the emulated host device: the suite's .init, and the
 * pool's statistics asserted readable. */
#ifndef MEMPOOL_TESTS_DEFAULT_POOL_HOST_H
#define MEMPOOL_TESTS_DEFAULT_POOL_HOST_H

#include <criterion/criterion.h>
#include <stdlib.h>

#include <mempool/mempool.h>

static inline void on_host(void) {
  setenv("MEMPOOL_DEVICE", "host", 1);
}

static inline mp_stats_t stats(void) {
  mp_stats_t s;
  cr_assert_eq(mp_pool_get_stats(mp_default_pool(), &s), MP_OK);
  return s;
}

#endif
