/* The cap of a pool with arenas (arenas=N, src/pool/arena.c,
 * mp__arena_share) is shared out in whole granules: an arena near its
 * share still grows its virtual range by a whole granule, so a cap that
 * is a whole number of granules never leaves an arena taking a plain
 * segment (which a pause cannot keep: MP_ENOTSUP without pausable=1).
 * White-box: it reads which segment holds a block. */
#include <criterion/criterion.h>

#include "../support/pool_helpers.h"
#include "arena_workers.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)

/* The host device maps 2 MiB granules. */
MP_DEVICE_SUITE(pool_arenas_cap_granules, "host:capacity=64M");

static bool in_plain_segment(mp_pool_t *a, uintptr_t p) {
  const mp__segment_t *g = mp__segment_containing(a, p);
  return g != NULL && g->kind != MP__SEG_VIRTUAL;
}

/* How many of the n blocks p[i] lie in plain segments (not in a range). */
static int in_plain(mp_pool_t *pool, void *const *p, int n) {
  int k = 0;
  for (int i = 0; i < n; i++)
    k += arena_where(pool, p[i], in_plain_segment) >= 0;
  return k;
}

/* 34 MiB is 17 granules: half of it (the first arena's share) is not a
 * whole number of them. One thread fills the pool with 1 MiB blocks up to
 * the cap; every block lies in the range, and the pool pauses. Before,
 * the arena's share was 17 MiB: at 16 MiB reserved the granule did not
 * fit, and the 17th block took a plain segment of 1 MiB. */
Test(pool_arenas_cap_granules, an_arena_near_its_share_grows_by_granules) {
  mp_pool_t *pool = make_pool(dev, "arenas=2,max_bytes=34M");
  void *p[34];
  int n = 0;
  while (n < 34 && mp_pool_alloc(pool, MiB, NULL, &p[n]) == MP_OK)
    n++;
  cr_expect_eq(n, 34, "only %d blocks of 1 MiB under a 34 MiB cap", n);
  cr_expect_eq(in_plain(pool, p, n), 0, "%d blocks in plain segments",
               in_plain(pool, p, n));
  cr_expect_eq(mp_pool_pause(pool, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  check(pool);
  for (int i = 0; i < n; i++)
    cr_assert_eq(mp_pool_free(pool, p[i]), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

/* Two threads, each with its arena, take turns allocating 1 MiB blocks
 * under the same cap until neither can: the shares move between them, and
 * every block still lies in a range (17 blocks in each arena would need
 * 36 MiB: 33 at most, 32 at least). Before, shares that were no whole
 * number of granules left blocks in plain segments, and the pause was
 * refused. */
Test(pool_arenas_cap_granules, two_threads_near_the_cap_grow_by_granules) {
  mp_pool_t *pool = make_pool(dev, "arenas=2,max_bytes=34M");
  job_t j[2][40];
  void *p[80];
  int n[2] = {0, 0}, all = 0;
  bool full[2] = {false, false};
  worker_start(&wa);
  worker_start(&wb);
  for (int t = 0; !(full[0] && full[1]) && n[0] + n[1] < 80; t ^= 1) {
    if (full[t])
      continue;
    job_t *k = &j[t][n[t]];
    *k = (job_t){.pool = pool, .bytes = MiB, .tag = 0x10, .count = 1};
    if (on_worker(t ? &wb : &wa, k, ALLOC) == MP_OK)
      p[all++] = j[t][n[t]++].ptrs[0];
    else
      full[t] = true;
  }
  cr_expect_geq(n[0] + n[1], 32, "%d + %d blocks of 1 MiB under 34 MiB", n[0],
                n[1]);
  cr_expect_eq(in_plain(pool, p, all), 0, "%d blocks in plain segments",
               in_plain(pool, p, all));
  cr_expect_leq(stats(pool).reserved_bytes, 34 * MiB);
  cr_expect_eq(mp_pool_pause(pool, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  check(pool);
  for (int i = 0; i < all; i++)
    cr_assert_eq(mp_pool_free(pool, p[i]), MP_OK);
  worker_stop(&wa);
  worker_stop(&wb);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}
