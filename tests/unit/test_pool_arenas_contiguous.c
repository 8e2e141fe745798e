/* mp_pool_alloc_contiguous on a pool with arenas (arenas=N,
 * src/pool/arena.c): the pieces come from the calling thread's arena,
 * adjacent and aligned, and any thread frees each alone; out of memory in
 * that arena takes back what other arenas cache, within the cap; bad and
 * absurd requests change nothing and count once as out of memory.
 * White-box: it reads which arena holds a block. */
#include <criterion/criterion.h>

#include "../support/pool_helpers.h"
#include "arena_workers.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_arenas_contiguous, "host:capacity=64M");

typedef struct pieces {
  mp_pool_t *pool;
  size_t count;
  const size_t *sizes;
  void *out[4];
  mp_status_t st;
  char why[256];
} pieces_t;

static void *pieces_job(void *arg) {
  pieces_t *p = arg;
  p->st = mp_pool_alloc_contiguous(p->pool, p->count, p->sizes, NULL, p->out);
  snprintf(p->why, sizeof p->why, "%s", mp_last_error());
  return NULL;
}

/* Runs the request on a new thread (an arena of its own while fewer
 * threads than arenas ran) and waits for it. */
static mp_status_t pieces_on_thread(pieces_t *p) {
  on_new_thread(pieces_job, p);
  return p->st;
}

Test(pool_arenas_contiguous, pieces_come_from_one_arena_and_free_alone) {
  mp_pool_t *pool = make_pool(dev, "arenas=4");
  size_t sizes[4] = {100, 4096, 513, 3 * MiB};
  pieces_t p = {.pool = pool, .count = 4, .sizes = sizes};
  cr_assert_eq(pieces_on_thread(&p), MP_OK, "%s", p.why);
  int arena = arena_holding(pool, p.out[0]);
  cr_assert_geq(arena, 0);
  uintptr_t at = (uintptr_t)p.out[0];
  for (int i = 0; i < 4; i++) {
    cr_expect_eq((uintptr_t)p.out[i], at, "piece %d not adjacent", i);
    cr_expect_eq((uintptr_t)p.out[i] % 512, 0);
    cr_expect_eq(arena_holding(pool, p.out[i]), arena, "piece %d", i);
    at += (sizes[i] + 511) / 512 * 512;
    memset(p.out[i], 0x5a, sizes[i]);
  }
  mp_stats_t s = stats(pool);
  cr_expect_eq(s.live_blocks, 4);
  cr_expect_eq(s.requested_bytes, 100 + 4096 + 513 + 3 * MiB);
  check(pool);
  /* From this thread (another arena's, or none yet), in any order; a
   * piece freed twice is refused and changes nothing. */
  cr_expect_eq(mp_pool_free(pool, p.out[2]), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_free(pool, p.out[2]), MP_EINVAL);
  cr_expect_eq(stats(pool).live_blocks, 3);
  cr_expect_eq(mp_pool_free(pool, p.out[0]), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_expect_eq(mp_pool_free(pool, p.out[3]), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_free(pool, p.out[1]), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(pool).live_blocks, 0);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

/* Another arena caches 40 MiB of a 48 MiB cap: the pieces (40 MiB in all)
 * fit only once that cache goes back. */
Test(pool_arenas_contiguous, out_of_memory_takes_back_another_arenas_cache) {
  mp_pool_t *pool = make_pool(dev, "arenas=2,max_bytes=48M");
  cache_on_worker(pool, &wa, 40 * MiB);
  size_t sizes[2] = {20 * MiB, 20 * MiB};
  pieces_t p = {.pool = pool, .count = 2, .sizes = sizes};
  cr_assert_eq(pieces_on_thread(&p), MP_OK, "%s", p.why);
  cr_expect_eq((uintptr_t)p.out[1], (uintptr_t)p.out[0] + 20 * MiB);
  mp_stats_t s = stats(pool);
  cr_expect_leq(s.reserved_bytes, 48 * MiB, "reserved %zu", s.reserved_bytes);
  cr_expect_eq(s.allocated_bytes, 40 * MiB);
  cr_expect_eq(s.oom_count, 0, "a request served after the reclaim failed");
  check(pool);
  /* Past the cap: refused with the pool's figures, counted once. */
  size_t big[2] = {20 * MiB, 20 * MiB};
  pieces_t q = {.pool = pool, .count = 2, .sizes = big};
  cr_expect_eq(pieces_on_thread(&q), MP_ELIMIT, "%s", q.why);
  cr_expect_neq(strstr(q.why, "arenas"), NULL, "%s", q.why);
  cr_expect_eq(stats(pool).oom_count, 1);
  cr_expect_eq(stats(pool).allocated_bytes, 40 * MiB);
  cr_expect_eq(mp_pool_free(pool, p.out[0]), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_free(pool, p.out[1]), MP_OK, "%s", mp_last_error());
  worker_stop(&wa);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

Test(pool_arenas_contiguous, bad_and_absurd_requests_change_nothing) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  void *keep;
  cr_assert_eq(mp_pool_alloc(pool, MiB, NULL, &keep), MP_OK);
  mp_stats_t before = stats(pool);
  void *out[2] = {NULL, NULL};
  size_t zero[2] = {512, 0};
  cr_expect_eq(mp_pool_alloc_contiguous(pool, 2, zero, NULL, out), MP_EINVAL);
  cr_expect_neq(strstr(mp_last_error(), "sizes[1] is 0"), NULL, "%s",
                mp_last_error());
  cr_expect_eq(mp_pool_alloc_contiguous(pool, 0, zero, NULL, out), MP_EINVAL);
  cr_expect_eq(mp_pool_alloc_contiguous(pool, 2, NULL, NULL, out), MP_EINVAL);
  cr_expect_eq(mp_pool_alloc_contiguous(pool, 2, zero, NULL, NULL), MP_EINVAL);
  mp_stats_t after = stats(pool);
  cr_expect_eq(memcmp(&before, &after, sizeof before), 0);
  /* Absurd: more than the device, and a sum that wraps. */
  size_t huge[2] = {SIZE_MAX / 2, SIZE_MAX / 2};
  cr_expect_eq(mp_pool_alloc_contiguous(pool, 2, huge, NULL, out), MP_ENOMEM);
  size_t over[2] = {40 * MiB, 40 * MiB};
  cr_expect_eq(mp_pool_alloc_contiguous(pool, 2, over, NULL, out), MP_ENOMEM);
  cr_expect_eq(out[0], NULL);
  after = stats(pool);
  cr_expect_eq(after.oom_count, before.oom_count + 2);
  cr_expect_eq(after.live_blocks, before.live_blocks);
  cr_expect_eq(after.allocated_bytes, before.allocated_bytes);
  check(pool);
  cr_expect_eq(mp_pool_free(pool, keep), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}
