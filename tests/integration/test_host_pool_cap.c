/* The host pool's cap: max_bytes bounds the page-locked bytes held; an
 * allocation past it is MP_ELIMIT, leaves the pool as it was, and fits
 * again once memory is freed. */
#include <string.h>

#include "../support/host_pool_fixture.h"

static void setup(void) {
  mp_pool_config_t cfg = {.max_bytes = 4 * MiB};
  hp_open(&cfg);
}

TestSuite(host_pool_cap, .init = setup, .fini = hp_close);

Test(host_pool_cap, allocation_past_the_cap_is_elimit) {
  void *a, *b = (void *)0x1;
  cr_assert_eq(mp_host_pool_alloc(hp, 3 * MiB, NULL, &a), MP_OK);
  mp_stats_t before = hp_stats();
  cr_expect_eq(mp_host_pool_alloc(hp, 2 * MiB, NULL, &b), MP_ELIMIT);
  cr_expect_eq(b, (void *)0x1, "a refused allocation wrote *out");
  cr_expect_neq(strstr(mp_last_error(), "MiB"), NULL, "%s", mp_last_error());
  mp_stats_t after = hp_stats();
  cr_expect_eq(after.reserved_bytes, before.reserved_bytes);
  cr_expect_eq(after.allocated_bytes, before.allocated_bytes);
  cr_expect_eq(after.oom_count, before.oom_count + 1);
  cr_expect_leq(after.peak_reserved_bytes, 4 * MiB);
  cr_assert_eq(mp_host_pool_free(hp, a), MP_OK);
  cr_expect_eq(mp_host_pool_alloc(hp, 2 * MiB, NULL, &b), MP_OK,
               "the freed space serves it: %s", mp_last_error());
  cr_expect_eq(mp_host_pool_free(hp, b), MP_OK);
}

Test(host_pool_cap, request_above_the_cap_is_elimit_on_an_empty_pool) {
  void *p = NULL;
  cr_expect_eq(mp_host_pool_alloc(hp, 5 * MiB, NULL, &p), MP_ELIMIT);
  cr_expect_null(p);
  cr_expect_eq(hp_stats().reserved_bytes, 0);
  cr_expect_eq(hp_stats().device_alloc_count, 0);
}
