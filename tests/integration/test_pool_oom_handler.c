/* test_pool_oom_handler.c - mp_pool_set_oom_handler: the handler hears of
 * an allocation that is about to fail (size and status), runs with the pool
 * unlocked so it can free a cache of its own, and a nonzero return retries
 * once; zero lets the allocation fail with the pool's own message. So for
 * every kind of allocation (mp_pool_alloc, mp_pool_alloc_contiguous,
 * mp_pool_create_child, a graph pool's range), with arenas or without. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include <mempool/mempool.h>

#include "../support/oom_kinds.h"
#include "../support/pool_helpers.h"

#define MiB ((size_t)1 << 20)

static mp_device_t *dev;
static void setup(void) {
  cr_assert_eq(mp_device_open("host:capacity=64M", &dev), MP_OK, "%s",
               mp_last_error());
}
static void teardown(void) {
  mp_device_close(dev);
}
TestSuite(oom_handler, .init = setup, .fini = teardown);

Test(oom_handler, frees_a_cache_and_the_allocation_retries) {
  mp_pool_t *p = make_pool(dev, NULL);
  engine_t e = {.answer = 1};
  cr_assert_eq(mp_pool_alloc(p, 40 * MiB, NULL, &e.cache), MP_OK);
  cr_assert_eq(mp_pool_set_oom_handler(p, drop_cache, &e), MP_OK);
  void *x;
  cr_assert_eq(mp_pool_alloc(p, 48 * MiB, NULL, &x), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(e.calls, 1);
  cr_expect_eq(e.bytes, 48 * MiB);
  cr_expect_eq(e.status, MP_ENOMEM);
  cr_expect_null(e.cache);
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  check(p);
  mp_pool_destroy(p);
}

Test(oom_handler, zero_lets_it_fail_with_the_pools_message) {
  mp_pool_t *p = make_pool(dev, "max_bytes=16M");
  engine_t e = {.answer = 0};
  cr_assert_eq(mp_pool_set_oom_handler(p, drop_cache, &e), MP_OK);
  void *x;
  mp_handle_t *h;
  cr_expect_eq(mp_pool_alloc(p, 32 * MiB, NULL, &x), MP_ELIMIT);
  cr_expect(strstr(mp_last_error(), "max_bytes"), "%s", mp_last_error());
  cr_expect_eq(mp_pool_alloc_movable(p, 32 * MiB, NULL, &h), MP_ELIMIT);
  cr_expect_eq(e.calls, 2);
  cr_expect_eq(e.status, MP_ELIMIT);
  /* Removed: no call. */
  cr_assert_eq(mp_pool_set_oom_handler(p, NULL, NULL), MP_OK);
  cr_expect_eq(mp_pool_alloc(p, 32 * MiB, NULL, &x), MP_ELIMIT);
  cr_expect_eq(e.calls, 2);
  cr_expect_eq(mp_pool_set_oom_handler(NULL, drop_cache, &e), MP_EINVAL);
  check(p);
  mp_pool_destroy(p);
}

Test(oom_handler, not_called_for_bad_arguments_or_successes) {
  mp_pool_t *p = make_pool(dev, NULL);
  engine_t e = {.answer = 1};
  cr_assert_eq(mp_pool_set_oom_handler(p, drop_cache, &e), MP_OK);
  void *x;
  cr_assert_eq(mp_pool_alloc(p, MiB, NULL, &x), MP_OK);
  cr_expect_eq(mp_pool_free(p, (char *)x + 512), MP_EINVAL);
  cr_expect_eq(e.calls, 0);
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  mp_pool_destroy(p);
}

/* A pool of the 64 MiB device made with opts, 40 MiB of it e's cache,
 * dropped by e's handler. */
static mp_pool_t *cached_pool(const char *opts, engine_t *e) {
  mp_pool_t *p = make_pool(dev, opts);
  cr_assert_eq(mp_pool_alloc(p, 40 * MiB, NULL, &e->cache), MP_OK);
  cr_assert_eq(mp_pool_set_oom_handler(p, drop_cache, e), MP_OK);
  return p;
}

/* Before, without arenas neither kind called the handler: 48 MiB failed
 * with 40 MiB of the engine's cache in the way. */
Test(oom_handler, every_kind_frees_a_cache_and_retries_with_or_without_arenas) {
  for (size_t c = 0; c < sizeof configs / sizeof *configs; c++)
    for (kind_t k = PIECES; k <= CHILD; k++) {
      engine_t e = {.answer = 1};
      mp_pool_t *p = cached_pool(configs[c], &e);
      asked_t a = {0};
      cr_expect_eq(ask(p, k, 48 * MiB, &a), MP_OK, "%s, %s: %s", configs[c],
                   kind_name(k), mp_last_error());
      cr_expect_eq(e.calls, 1, "%s, %s", configs[c], kind_name(k));
      cr_expect_eq(e.bytes, 48 * MiB, "%s, %s", configs[c], kind_name(k));
      cr_expect_eq(e.status, MP_ENOMEM, "%s, %s", configs[c], kind_name(k));
      cr_expect_null(e.cache, "%s, %s", configs[c], kind_name(k));
      if (e.cache == NULL)
        give_back(p, k, &a);
      check(p);
      cr_assert_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
    }
}

/* Zero lets each kind fail with the pool's own message, its status
 * (MP_ELIMIT over max_bytes) told to the handler, nothing changed. */
Test(oom_handler, zero_lets_every_kind_fail_with_or_without_arenas) {
  for (size_t c = 0; c < sizeof configs / sizeof *configs; c++) {
    char opts[64];
    snprintf(opts, sizeof opts, "%s,max_bytes=16M", configs[c]);
    mp_pool_t *p = make_pool(dev, opts);
    engine_t e = {.answer = 0};
    cr_assert_eq(mp_pool_set_oom_handler(p, drop_cache, &e), MP_OK);
    for (kind_t k = PIECES; k <= CHILD; k++) {
      asked_t a = {0};
      cr_expect_eq(ask(p, k, 32 * MiB, &a), MP_ELIMIT, "%s, %s", opts,
                   kind_name(k));
      cr_expect(strstr(mp_last_error(), "max_bytes"), "%s, %s: %s", opts,
                kind_name(k), mp_last_error());
      cr_expect_eq(e.calls, (int)k + 1, "%s, %s", opts, kind_name(k));
      cr_expect_eq(e.bytes, 32 * MiB, "%s, %s", opts, kind_name(k));
      cr_expect_eq(e.status, MP_ELIMIT, "%s, %s", opts, kind_name(k));
    }
    mp_stats_t s = stats(p);
    cr_expect_eq(s.oom_count, 2, "%s", opts);
    cr_expect_eq(s.live_blocks, 0, "%s", opts);
    cr_expect_eq(s.allocated_bytes, 0, "%s", opts);
    check(p);
    cr_assert_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
  }
}

/* An allocation counts once in oom_count if it fails, handler or not, and
 * not at all when the handler's retry serves it, whatever its kind, with
 * arenas or without. Before, without arenas a served retry counted one
 * failure and a failed one two. */
Test(oom_handler, an_allocation_counts_once_if_it_fails_and_not_if_served) {
  for (size_t c = 0; c < sizeof configs / sizeof *configs; c++)
    for (kind_t k = PIECES; k <= ALLOC; k++) {
      engine_t e = {.answer = 1};
      mp_pool_t *p = cached_pool(configs[c], &e);
      asked_t a = {0};
      cr_assert_eq(ask(p, k, 48 * MiB, &a), MP_OK, "%s, kind %d: %s",
                   configs[c], k, mp_last_error());
      cr_expect_eq(e.calls, 1);
      cr_expect_eq(stats(p).oom_count, 0, "%s, kind %d: served", configs[c], k);
      /* Nothing left to drop: the retry fails too. */
      asked_t b = {0};
      cr_expect_eq(ask(p, k, 32 * MiB, &b), MP_ENOMEM, "%s, kind %d",
                   configs[c], k);
      cr_expect(strstr(mp_last_error(), "out of device memory"), "%s",
                mp_last_error());
      cr_expect_eq(e.calls, 2);
      cr_expect_eq(stats(p).oom_count, 1, "%s, kind %d: failed", configs[c], k);
      give_back(p, k, &a);
      check(p);
      cr_assert_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
    }
}

/* A graph pool grows by borrowing ranges of its parent: a range the parent
 * cannot give asks the parent's handler (with the parent), as the arenas'
 * path did already; before, without arenas it failed without a call. */
Test(oom_handler, a_graph_pools_range_asks_the_parents_handler) {
  for (size_t c = 0; c < sizeof configs / sizeof *configs; c++)
    for (int answer = 1; answer >= 0; answer--) {
      mp_pool_t *p = make_pool(dev, configs[c]);
      engine_t e = {.answer = answer};
      cr_assert_eq(mp_pool_alloc(p, 40 * MiB, NULL, &e.cache), MP_OK);
      cr_assert_eq(mp_pool_set_oom_handler(p, drop_cache, &e), MP_OK);
      mp_pool_t *g;
      cr_assert_eq(mp_pool_graph_create(p, &g), MP_OK, "%s", mp_last_error());
      void *x = NULL;
      mp_status_t st = mp_pool_alloc(g, 48 * MiB, NULL, &x);
      cr_expect_eq(st, answer ? MP_OK : MP_ENOMEM, "%s, answer %d: %s",
                   configs[c], answer, mp_last_error());
      cr_expect_eq(e.calls, 1, "%s, answer %d", configs[c], answer);
      cr_expect_eq(e.bytes, 48 * MiB, "%s", configs[c]);
      cr_expect_eq(e.status, MP_ENOMEM, "%s", configs[c]);
      if (st == MP_OK)
        cr_assert_eq(mp_pool_free(g, x), MP_OK, "%s", mp_last_error());
      else
        cr_expect_eq(stats(g).reserved_bytes, 0, "%s", configs[c]);
      cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
      if (e.cache != NULL)
        cr_assert_eq(mp_pool_free(p, e.cache), MP_OK);
      check(p);
      cr_expect_eq(stats(p).allocated_bytes, 0, "%s", configs[c]);
      cr_assert_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
    }
}

/* The handler pauses the pool after dropping its cache (where the pool
 * lets it: with arenas a child being made refuses the pause): the retry is
 * refused, by the call's name as a refusal before the handler is, and
 * nothing is left taken. Before, without arenas mp_pool_create_child's
 * retry said "allocation: the pool is paused". */
static int drop_and_pause(mp_pool_t *pool, size_t bytes, mp_status_t status,
                          void *ctx) {
  engine_t *e = ctx;
  (void)drop_cache(pool, bytes, status, ctx);
  e->answer = mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT) == MP_OK ? 2 : 1;
  return e->answer;
}

Test(oom_handler, a_pause_in_the_handler_refuses_the_retry_by_its_name) {
  for (size_t c = 0; c < sizeof configs / sizeof *configs; c++)
    for (kind_t k = PIECES; k <= CHILD; k++) {
      mp_pool_t *p = make_pool(dev, configs[c]);
      engine_t e = {0};
      cr_assert_eq(mp_pool_alloc(p, 40 * MiB, NULL, &e.cache), MP_OK);
      cr_assert_eq(mp_pool_set_oom_handler(p, drop_and_pause, &e), MP_OK);
      asked_t a = {0};
      mp_status_t st = ask(p, k, 48 * MiB, &a);
      cr_expect_eq(e.calls, 1, "%s, %s", configs[c], kind_name(k));
      if (e.answer == 2) {
        cr_expect_eq(st, MP_EBUSY, "%s, %s: %s", configs[c], kind_name(k),
                     mp_last_error());
        cr_expect(strstr(mp_last_error(), kind_name(k)) != NULL, "%s, %s: '%s'",
                  configs[c], kind_name(k), mp_last_error());
        cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
        cr_expect_eq(stats(p).live_blocks, 0, "%s, %s", configs[c],
                     kind_name(k));
      } else {
        cr_expect_eq(st, MP_OK, "%s, %s: %s", configs[c], kind_name(k),
                     mp_last_error());
        give_back(p, k, &a);
      }
      check(p);
      cr_assert_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
    }
}

/* A handler that allocates from its own pool, and answers retry whatever
 * happens: its own allocation that runs out calls no handler (one runs on
 * its thread), so the allocation fails after one call, for every kind,
 * with arenas or without. Before, the handler was called again from its
 * own allocation, without end (the stack ran out). */
typedef struct greedy {
  int calls;
  mp_status_t inner;
} greedy_t;

static int allocate_and_retry(mp_pool_t *pool, size_t bytes, mp_status_t status,
                              void *ctx) {
  (void)bytes;
  (void)status;
  greedy_t *g = ctx;
  g->calls++;
  void *p = NULL;
  g->inner = mp_pool_alloc(pool, 48 * MiB, NULL, &p);
  return 1;
}

Test(oom_handler, a_handler_that_allocates_and_always_retries_is_called_once) {
  for (size_t c = 0; c < sizeof configs / sizeof *configs; c++)
    for (kind_t k = PIECES; k <= ALLOC; k++) {
      mp_pool_t *p = make_pool(dev, configs[c]);
      void *held;
      cr_assert_eq(mp_pool_alloc(p, 32 * MiB, NULL, &held), MP_OK, "%s",
                   mp_last_error());
      greedy_t g = {0};
      cr_assert_eq(mp_pool_set_oom_handler(p, allocate_and_retry, &g), MP_OK);
      asked_t a = {0};
      cr_expect_eq(ask(p, k, 48 * MiB, &a), MP_ENOMEM, "%s, %s: %s", configs[c],
                   kind_name(k), mp_last_error());
      cr_expect_eq(g.calls, 1, "%s, %s", configs[c], kind_name(k));
      cr_expect_eq(g.inner, MP_ENOMEM, "%s, %s", configs[c], kind_name(k));
      /* The next allocation that runs out asks the handler again. */
      cr_expect_eq(mp_pool_alloc(p, 48 * MiB, NULL, a.pieces), MP_ENOMEM);
      cr_expect_eq(g.calls, 2, "%s, %s", configs[c], kind_name(k));
      cr_assert_eq(mp_pool_free(p, held), MP_OK, "%s", mp_last_error());
      check(p);
      cr_assert_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
    }
}

/* A graph pool's allocation asks the parent's handler once, however often
 * its ladder borrows: with free bytes of its own it grows again after its
 * synchronization, and its own handler's retry grows once more. Each
 * borrow asked the parent's handler before (two calls, three with the
 * graph pool's own handler), with arenas or without. */
Test(oom_handler, a_graph_pools_allocation_asks_the_parents_handler_once) {
  for (size_t c = 0; c < sizeof configs / sizeof *configs; c++)
    for (int own = 0; own < 2; own++)
      for (int answer = 0; answer < 2; answer++) {
        mp_pool_t *p = make_pool(dev, configs[c]);
        void *held;
        cr_assert_eq(mp_pool_alloc(p, 40 * MiB, NULL, &held), MP_OK);
        engine_t e = {.answer = answer}, ge = {.answer = 1};
        cr_assert_eq(mp_pool_set_oom_handler(p, drop_cache, &e), MP_OK);
        mp_pool_t *g;
        cr_assert_eq(mp_pool_graph_create(p, &g), MP_OK, "%s", mp_last_error());
        if (own)
          cr_assert_eq(mp_pool_set_oom_handler(g, drop_cache, &ge), MP_OK);
        /* A range with free bytes left, so that the ladder's second
         * growth rung runs. */
        void *small, *x;
        cr_assert_eq(mp_pool_alloc(g, MiB, NULL, &small), MP_OK, "%s",
                     mp_last_error());
        cr_assert_gt(stats(g).reserved_bytes, MiB);
        for (kind_t k = PIECES; k <= ALLOC; k += ALLOC - PIECES) {
          int before = e.calls, gbefore = ge.calls;
          asked_t a = {0};
          mp_status_t st = ask(g, k, 40 * MiB, &a);
          cr_expect_eq(st, MP_ENOMEM, "%s, own %d, answer %d, %s: %s",
                       configs[c], own, answer, kind_name(k), mp_last_error());
          cr_expect(strstr(mp_last_error(), "out of device memory"), "%s",
                    mp_last_error());
          cr_expect_eq(e.calls - before, 1, "%s, own %d, answer %d, %s",
                       configs[c], own, answer, kind_name(k));
          cr_expect_eq(e.bytes, 40 * MiB, "%s", configs[c]);
          cr_expect_eq(ge.calls - gbefore, own, "%s, answer %d, %s", configs[c],
                       answer, kind_name(k));
        }
        cr_expect_eq(stats(g).oom_count, 2, "%s", configs[c]);
        /* The next allocation asks it again. */
        cr_expect_eq(mp_pool_alloc(g, 40 * MiB, NULL, &x), MP_ENOMEM);
        cr_expect_eq(e.calls, 3, "%s, own %d, answer %d", configs[c], own,
                     answer);
        cr_assert_eq(mp_pool_free(g, small), MP_OK, "%s", mp_last_error());
        cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
        cr_assert_eq(mp_pool_free(p, held), MP_OK, "%s", mp_last_error());
        check(p);
        cr_expect_eq(stats(p).allocated_bytes, 0, "%s", configs[c]);
        cr_assert_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
      }
}
