/* The host pool's stats, trim, dump and check: small buffers share one
 * chunk (one driver call), sizes are not rounded to powers of two, trim
 * gives free chunks back to the device, dump describes the cache. */
#include <stdio.h>
#include <string.h>

#include "../support/host_pool_fixture.h"

static void setup(void) {
  hp_open(NULL);
}

TestSuite(host_pool_stats, .init = setup, .fini = hp_close);

Test(host_pool_stats, small_buffers_share_a_chunk) {
  void *p[8];
  for (int i = 0; i < 8; i++)
    cr_assert_eq(mp_host_pool_alloc(hp, 100 * KiB, NULL, &p[i]), MP_OK);
  mp_stats_t st = hp_stats();
  cr_expect_eq(st.device_alloc_count, 1, "8 x 100 KiB took %llu driver calls",
               (unsigned long long)st.device_alloc_count);
  cr_expect_eq(st.requested_bytes, 800 * KiB);
  cr_expect_eq(st.alloc_count, 8);
  cr_expect_eq(st.live_blocks, 8);
  for (int i = 0; i < 8; i++)
    cr_assert_eq(mp_host_pool_free(hp, p[i]), MP_OK);
  st = hp_stats();
  cr_expect_eq(st.free_count, 8);
  cr_expect_eq(st.allocated_bytes, 0);
  cr_expect_eq(st.free_bytes, st.reserved_bytes);
}

/* 5 MiB + 1 is held as 6 MiB (2 MiB rounding of a big chunk), not the
 * 8 MiB a power-of-two rounding would pin. */
Test(host_pool_stats, sizes_are_not_rounded_to_powers_of_two) {
  void *p;
  cr_assert_eq(mp_host_pool_alloc(hp, 5 * MiB + 1, NULL, &p), MP_OK);
  mp_stats_t st = hp_stats();
  cr_expect_lt(st.allocated_bytes, 5 * MiB + 4 * KiB);
  cr_expect_eq(st.reserved_bytes, 6 * MiB);
  cr_assert_eq(mp_host_pool_free(hp, p), MP_OK);
}

Test(host_pool_stats, trim_gives_free_chunks_back) {
  void *a, *b;
  /* b first, so that it sits in its own 2 MiB chunk, not in a's tail. */
  cr_assert_eq(mp_host_pool_alloc(hp, 100 * KiB, NULL, &b), MP_OK);
  cr_assert_eq(mp_host_pool_alloc(hp, 3 * MiB, NULL, &a), MP_OK);
  cr_assert_eq(mp_host_pool_free(hp, a), MP_OK);
  mp_stats_t before = hp_stats();
  cr_assert_eq(mp_host_pool_trim(hp, 0), MP_OK);
  mp_stats_t after = hp_stats();
  cr_expect_eq(after.reserved_bytes, before.reserved_bytes - 4 * MiB);
  cr_expect_eq(after.device_free_count, before.device_free_count + 1);
  cr_expect_eq(((unsigned char *)b)[0] = 7, 7, "the live buffer stays");
  cr_assert_eq(mp_host_pool_free(hp, b), MP_OK);
  cr_assert_eq(mp_host_pool_trim(hp, 0), MP_OK);
  cr_expect_eq(hp_stats().reserved_bytes, 0);
  cr_expect_eq(hp_stats().segment_count, 0);
}

Test(host_pool_stats, dump_describes_the_cache) {
  void *p;
  cr_assert_eq(mp_host_pool_alloc(hp, 100 * KiB, NULL, &p), MP_OK);
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  cr_assert_not_null(f);
  cr_expect_eq(mp_host_pool_dump(hp, f, "json"), MP_OK);
  fclose(f);
  cr_expect_neq(strstr(buf, "\"reserved_bytes\":2097152"), NULL, "%s", buf);
  free(buf);
  cr_expect_eq(mp_host_pool_check(hp), MP_OK);
  cr_assert_eq(mp_host_pool_free(hp, p), MP_OK);
}
