/* The host pool out of memory: a request the host cannot pin is MP_ENOMEM,
 * its message names page-locked host memory (not the device's memory,
 * which the host pool never draws from), and the pool is as it was. */
#include <string.h>

#include "../support/host_pool_fixture.h"

/* Far more than this machine can map (mmap refuses it), under the pool's
 * size limits. */
#define UNPINNABLE ((size_t)1 << 46)

static void expect_unpinnable_refused(void) {
  mp_stats_t before = hp_stats();
  void *p = NULL;
  cr_assert_eq(mp_host_pool_alloc(hp, UNPINNABLE, NULL, &p), MP_ENOMEM, "%s",
               mp_last_error());
  cr_expect_null(p);
  cr_expect(strstr(mp_last_error(), "out of page-locked host memory") != NULL,
            "%s", mp_last_error());
  cr_expect(strstr(mp_last_error(), "device memory") == NULL, "%s",
            mp_last_error());
  mp_stats_t after = hp_stats();
  cr_expect_eq(after.reserved_bytes, before.reserved_bytes);
  cr_expect_eq(after.allocated_bytes, before.allocated_bytes);
  cr_assert_eq(mp_host_pool_alloc(hp, 4096, NULL, &p), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_host_pool_free(hp, p), MP_OK);
}

Test(host_pool_out_of_memory, an_unpinnable_request_names_host_memory,
     .fini = hp_close) {
  hp_open(NULL);
  expect_unpinnable_refused();
}

Test(host_pool_out_of_memory,
     an_unpinnable_request_names_host_memory_with_arenas, .fini = hp_close) {
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cfg.arenas = 2;
  hp_open(&cfg);
  expect_unpinnable_refused();
}
