/* The host pool takes the device pool's config but not what only a device
 * pool has (host_pool.h): $MEMPOOL_CONF is not read (cfg NULL, and the
 * fields a short config lacks), and flags and map_piece are ignored, so a
 * $MEMPOOL_CONF written for the device pool (map_piece=2M, arenas) never
 * reaches page-locked memory, which has no virtual range to map pieces of. */
#include <stdlib.h>

#include "../support/host_pool_fixture.h"

static void teardown(void) {
  unsetenv("MEMPOOL_CONF");
}

TestSuite(host_pool_ignores_device_pool_options, .fini = teardown);

/* Chunks held after an 8 MiB buffer: one (it gets its own chunk). */
static size_t chunks_for_8m(void) {
  void *p;
  cr_assert_eq(mp_host_pool_alloc(hp, 8 * MiB, NULL, &p), MP_OK, "%s",
               mp_last_error());
  size_t n = hp_stats().segment_count;
  cr_assert_eq(mp_host_pool_free(hp, p), MP_OK);
  return n;
}

Test(host_pool_ignores_device_pool_options, mempool_conf_is_not_read) {
  setenv("MEMPOOL_CONF", "map_piece=2M,arenas=2", 1);
  hp_open(NULL);
  cr_expect_eq(chunks_for_8m(), 1);
  hp_close();
  /* A config of the first layout, which lacks map_piece and arenas. */
  mp_pool_config_t cfg;
  cr_assert_eq(mp_pool_config_init_sized(&cfg, MP_POOL_CONFIG_SIZE_V1), MP_OK);
  hp_open(&cfg);
  cr_expect_eq(chunks_for_8m(), 1);
  hp_close();
}

Test(host_pool_ignores_device_pool_options, map_piece_is_ignored) {
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_assert_eq(mp_pool_config_parse(&cfg, "map_piece=2M,virtual=1"), MP_OK);
  hp_open(&cfg);
  cr_expect_eq(chunks_for_8m(), 1);
  hp_close();
}
