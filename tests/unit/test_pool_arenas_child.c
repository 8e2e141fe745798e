/* Child pools of a pool with arenas (arenas=N, src/pool/child.c): the
 * range is a block of the calling thread's arena, which is the child's
 * parent; the child serves any thread; the pool refuses to be destroyed or
 * paused while a child lives, and the refusal changes nothing; out of
 * memory, making a child takes back what other arenas cache; a paused pool
 * refuses to make one. White-box: it reads which arena holds a block. */
#include <criterion/criterion.h>

#include "../support/pool_helpers.h"
#include "arena_workers.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_arenas_child, "host:capacity=64M");

typedef struct child_job {
  mp_pool_t *pool;
  size_t bytes;
  mp_pool_t *child;
  mp_status_t st;
  char why[256];
} child_job_t;

static void *child_run(void *arg) {
  child_job_t *j = arg;
  j->st = mp_pool_create_child(j->pool, j->bytes, &j->child);
  snprintf(j->why, sizeof j->why, "%s", mp_last_error());
  return NULL;
}

/* Makes the child on a new thread (an arena of its own while fewer
 * threads than arenas ran) and waits for it. */
static mp_status_t child_on_thread(child_job_t *j) {
  on_new_thread(child_run, j);
  return j->st;
}

static void *range_of(mp_pool_t *child) {
  return (void *)child->parent_block->addr;
}

Test(pool_arenas_child, a_child_lives_in_its_makers_arena) {
  mp_pool_t *pool = make_pool(dev, "arenas=4");
  /* A block of another arena, made first (arena 0): a destroy that went
   * arena by arena would end it before it met the child's. */
  job_t held = {.pool = pool, .bytes = 2 * MiB, .tag = 0x40, .count = 1};
  worker_start(&wa);
  cr_assert_eq(on_worker(&wa, &held, ALLOC), MP_OK, "%s", held.why);
  child_job_t j = {.pool = pool, .bytes = 8 * MiB};
  cr_assert_eq(child_on_thread(&j), MP_OK, "%s", j.why);
  int arena = arena_holding(pool, range_of(j.child));
  cr_assert_geq(arena, 0, "the range is in no arena");
  cr_expect_neq(arena, arena_holding(pool, held.ptrs[0]));
  cr_expect_eq(j.child->parent, mp__arena_at(pool, (size_t)arena));
  cr_expect_eq(stats(pool).allocated_bytes, 10 * MiB);
  /* The child serves this thread, its memory inside the range. */
  void *p = NULL;
  cr_assert_eq(mp_pool_alloc(j.child, 3 * MiB, NULL, &p), MP_OK, "%s",
               mp_last_error());
  uintptr_t lo = (uintptr_t)range_of(j.child);
  cr_expect((uintptr_t)p >= lo && (uintptr_t)p + 3 * MiB <= lo + 8 * MiB);
  memset(p, 0x33, 3 * MiB);
  void *too_big = NULL;
  cr_expect_eq(mp_pool_alloc(j.child, 6 * MiB, NULL, &too_big), MP_ELIMIT);
  check(j.child);
  check(pool);

  /* The range is not the pool's to free; the pool is not to be destroyed
   * or paused while the child lives; each refusal changes nothing. */
  mp_stats_t before = stats(pool);
  cr_expect_eq(mp_pool_free(pool, range_of(j.child)), MP_EINVAL);
  cr_expect_neq(strstr(mp_last_error(), "child pool's range"), NULL, "%s",
                mp_last_error());
  cr_expect_eq(mp_pool_destroy(pool), MP_EBUSY);
  cr_expect_neq(strstr(mp_last_error(), "child pool"), NULL, "%s",
                mp_last_error());
  cr_expect_eq(mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT), MP_EBUSY);
  mp_stats_t after = stats(pool);
  cr_expect_eq(after.allocated_bytes, before.allocated_bytes);
  cr_expect_eq(after.reserved_bytes, before.reserved_bytes);
  void *q = NULL;
  cr_expect_eq(mp_pool_alloc(pool, MiB, NULL, &q), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_free(pool, q), MP_OK);
  unsigned char *c = p;
  cr_expect(c[0] == 0x33 && c[3 * MiB - 1] == 0x33, "the child's content");
  expect_kept(&held);
  cr_expect_eq(on_worker(&wa, &held, FREE), MP_OK, "%s", held.why);
  worker_stop(&wa);

  cr_expect_eq(mp_pool_free(j.child, p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(j.child), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(pool).allocated_bytes, 0);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

/* Another arena caches 40 MiB of a 48 MiB cap: a 20 MiB child fits only
 * once that cache goes back. */
Test(pool_arenas_child, making_a_child_takes_back_another_arenas_cache) {
  mp_pool_t *pool = make_pool(dev, "arenas=2,max_bytes=48M");
  cache_on_worker(pool, &wa, 40 * MiB);
  child_job_t j = {.pool = pool, .bytes = 20 * MiB};
  cr_assert_eq(child_on_thread(&j), MP_OK, "%s", j.why);
  cr_expect_leq(stats(pool).reserved_bytes, 48 * MiB);
  cr_expect_eq(stats(pool).oom_count, 0);
  /* Past the cap: refused, nothing made. */
  child_job_t k = {.pool = pool, .bytes = 40 * MiB};
  cr_expect_eq(child_on_thread(&k), MP_ELIMIT, "%s", k.why);
  cr_expect_eq(k.child, NULL);
  cr_expect_eq(stats(pool).allocated_bytes, 20 * MiB);
  check(pool);
  cr_assert_eq(mp_pool_destroy(j.child), MP_OK, "%s", mp_last_error());
  worker_stop(&wa);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

Test(pool_arenas_child, a_paused_pool_makes_no_child) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, MiB, NULL, &p), MP_OK);
  cr_assert_eq(mp_pool_pause(pool, 0), MP_OK, "%s", mp_last_error());
  mp_pool_t *child = NULL;
  cr_expect_eq(mp_pool_create_child(pool, MiB, &child), MP_EBUSY);
  cr_expect_neq(strstr(mp_last_error(), "mp_pool_create_child"), NULL, "%s",
                mp_last_error());
  cr_expect_eq(child, NULL);
  cr_assert_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_create_child(pool, MiB, &child), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_destroy(child), MP_OK);
  cr_expect_eq(mp_pool_free(pool, p), MP_OK);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}
