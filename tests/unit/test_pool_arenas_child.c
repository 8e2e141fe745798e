/* Child pools of a pool with arenas (arenas=N, src/pool/child.c): the
 * range is a block of the calling thread's arena, which is the child's
 * parent; the child serves any thread; the pool refuses to be destroyed or
 * paused while a child lives, and the refusal changes nothing; out of
 * memory, making a child takes back what other arenas cache; a paused pool
 * refuses to make one. White-box: it reads which arena holds a block. */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "../support/pool_helpers.h"
#include "arena_workers.h"
#include "pool/pool_internal.h"
#include "stale_frees.h"

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

/* Making children while another thread pauses and resumes the pool with
 * its content: a pause that lands between a child's allocation and its
 * count in the arena gave the block back in the paused arena, and the
 * resume copied every later block's content to the wrong place. Now a
 * pause refuses while a child is being made (asserted below by hand,
 * white-box), and the content survives every round. */
typedef struct churn {
  mp_pool_t *pool;
  atomic_bool stop;
  atomic_int made, bad;
  char why[256];
} churn_t;

static void *children_job(void *arg) {
  churn_t *c = arg;
  while (!atomic_load(&c->stop)) {
    mp_pool_t *child = NULL;
    mp_status_t st = mp_pool_create_child(c->pool, MiB, &child);
    if (st == MP_OK) {
      atomic_fetch_add(&c->made, 1);
      for (int k = 0; k < 100 && mp_pool_destroy(child) == MP_EBUSY; k++)
        usleep(100); /* a pause in flight: wait for the resume */
    } else if (st != MP_EBUSY && atomic_fetch_add(&c->bad, 1) == 0) {
      snprintf(c->why, sizeof c->why, "%s", mp_last_error());
    }
  }
  return NULL;
}

Test(pool_arenas_child, a_pause_never_meets_a_child_half_made, .timeout = 60) {
  churn_t c = {.pool = make_pool(dev, "arenas=2")};
  mp__pool_lock(c.pool);
  c.pool->children_making = 1;
  mp__pool_unlock(c.pool);
  cr_expect_eq(mp_pool_pause(c.pool, 0), MP_EBUSY);
  cr_expect_neq(strstr(mp_last_error(), "being made"), NULL, "%s",
                mp_last_error());
  mp__pool_lock(c.pool);
  c.pool->children_making = 0;
  mp__pool_unlock(c.pool);

  job_t keep = {.pool = c.pool, .bytes = 2 * MiB, .tag = 0x70, .count = 2};
  worker_start(&wa);
  cr_assert_eq(on_worker(&wa, &keep, ALLOC), MP_OK, "%s", keep.why);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, children_job, &c), 0);
  int paused = 0;
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do {
    if (mp_pool_pause(c.pool, MP_PAUSE_KEEP_CONTENT) == MP_OK) {
      paused++;
      cr_assert_eq(mp_pool_resume(c.pool), MP_OK, "%s", mp_last_error());
      expect_kept(&keep);
    }
    clock_gettime(CLOCK_MONOTONIC, &now);
    /* Two seconds of both at least, and on until a child was made and a
     * pause got through: on a busy machine the children's thread made none
     * in two seconds (made was 0 in 2 runs of 5 beside another build). */
  } while (now.tv_sec - t0.tv_sec < 2 ||
           ((atomic_load(&c.made) == 0 || paused == 0) &&
            now.tv_sec - t0.tv_sec < 40));
  atomic_store(&c.stop, true);
  pthread_join(t, NULL);
  cr_expect_eq(atomic_load(&c.bad), 0, "%s", c.why);
  cr_expect_gt(atomic_load(&c.made), 0);
  cr_expect_gt(paused, 0);
  expect_kept(&keep);
  check(c.pool);
  cr_expect_eq(on_worker(&wa, &keep, FREE), MP_OK, "%s", keep.why);
  worker_stop(&wa);
  cr_assert_eq(mp_pool_destroy(c.pool), MP_OK, "%s", mp_last_error());
}

/* Another thread frees, as a raw pointer, the address the last child's
 * range had (a stale pointer: the next child mostly gets it again): each
 * such free is MP_EINVAL, as without arenas. Crashed before: the range was
 * made live in its arena, that arena's lock dropped, and only then marked
 * as the child's; a free landing in between freed it, and the marking read
 * the NULL record found at its address. Probabilistic: it crashed in 2
 * runs of 3 at 20 000 children, in 8 of 8 at 100 000. */
static void *child_made(mp_pool_t *pool, void **obj) {
  mp_pool_t *c = NULL;
  cr_assert_eq(mp_pool_create_child(pool, 4096, &c), MP_OK, "%s",
               mp_last_error());
  *obj = c;
  return range_of(c);
}

static void child_unmade(mp_pool_t *pool, void *obj) {
  (void)pool;
  cr_assert_eq(mp_pool_destroy(obj), MP_OK, "%s", mp_last_error());
}

Test(pool_arenas_child, a_raw_free_racing_a_childs_making_is_einval,
     .timeout = 120) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  stale_frees_race(
      pool, 100000,
      &(stale_round_t){child_made, child_unmade, "a child's range"});
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}
