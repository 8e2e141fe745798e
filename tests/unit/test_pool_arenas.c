/* Per-thread arenas (config arenas=N, src/pool/arena.c): threads get arenas
 * of their own and free each other's blocks; stats are sums; trim and the
 * out-of-memory path take back what other arenas cache; the cap bounds the
 * sum; bad pointers change nothing; the features arenas refuse say so;
 * arenas=0 is the pool as it was. White-box: it looks at which arena holds
 * a block. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../support/pool_helpers.h"
#include "../support/stream_gate.h"
#include "arena_holding.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_arenas, "host:capacity=64M");

/* ---- running a function on a thread of its own ------------------------- */
typedef struct job {
  mp_pool_t *pool;
  size_t bytes;
  mp_stream_t s; /* alloc_job's stream (NULL: the default) */
  int count;
  void *ptrs[64];
  mp_status_t st;
} job_t;

static void *alloc_job(void *arg) {
  job_t *j = arg;
  j->st = MP_OK;
  for (int i = 0; i < j->count && j->st == MP_OK; i++)
    j->st = mp_pool_alloc(j->pool, j->bytes, j->s, &j->ptrs[i]);
  return NULL;
}

static void *free_job(void *arg) {
  job_t *j = arg;
  j->st = MP_OK;
  for (int i = 0; i < j->count && j->st == MP_OK; i++)
    j->st = mp_pool_free(j->pool, j->ptrs[i]);
  return NULL;
}

/* One pool's own counters (an arena's, or the pool's without its arenas),
 * as mp_pool_get_stats derives them (alloc_count among them). */
static mp_stats_t own_stats(const mp_pool_t *p) {
  mp_stats_t s;
  mp__stats_copy(p, &s);
  return s;
}

/* Runs fn(j) on a new thread and waits for it. */
static void on_thread(void *(*fn)(void *), job_t *j) {
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, fn, j), 0);
  pthread_join(t, NULL);
}

/* A thread's arena made to cache one block of `bytes`: allocated and freed
 * on a new thread. Returns the arena's index; *addr: the block. */
static int cache_on_thread(mp_pool_t *pool, size_t bytes, void **addr) {
  job_t j = {.pool = pool, .bytes = bytes, .count = 1};
  on_thread(alloc_job, &j);
  cr_assert_eq(j.st, MP_OK, "%s", mp_last_error());
  int i = arena_holding(pool, j.ptrs[0]);
  cr_assert_geq(i, 0);
  on_thread(free_job, &j);
  cr_assert_eq(j.st, MP_OK, "%s", mp_last_error());
  if (addr != NULL)
    *addr = j.ptrs[0];
  return i;
}

Test(pool_arenas, threads_get_different_arenas_and_free_each_others_blocks) {
  mp_pool_t *pool = make_pool(dev, "arenas=4");
  job_t a = {.pool = pool, .bytes = 4096, .count = 16};
  job_t b = {.pool = pool, .bytes = 8192, .count = 16};
  on_thread(alloc_job, &a);
  on_thread(alloc_job, &b);
  cr_assert_eq(a.st, MP_OK, "%s", mp_last_error());
  cr_assert_eq(b.st, MP_OK, "%s", mp_last_error());
  int ia = arena_holding(pool, a.ptrs[0]), ib = arena_holding(pool, b.ptrs[0]);
  cr_assert(ia >= 0 && ib >= 0, "blocks are in arenas (%d, %d)", ia, ib);
  cr_expect_neq(ia, ib, "two threads share arena %d", ia);
  for (int i = 1; i < 16; i++) {
    cr_expect_eq(arena_holding(pool, a.ptrs[i]), ia);
    cr_expect_eq(arena_holding(pool, b.ptrs[i]), ib);
  }
  /* The pool itself holds nothing: everything is in the arenas. */
  cr_expect_eq(own_stats(pool).alloc_count, 0);
  cr_expect_eq(pool->segs, NULL);
  /* Each thread frees the other's blocks (and the main thread, with no
   * arena of its own yet, could too). */
  job_t fa = a, fb = b;
  on_thread(free_job, &fb); /* frees b's blocks from a third thread */
  cr_assert_eq(fb.st, MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp__map_count(mp__arena_at(pool, (size_t)ib)), 0);
  cr_assert_eq(mp__map_count(mp__arena_at(pool, (size_t)ia)), 16);
  for (int i = 0; i < 16; i++)
    cr_assert_eq(mp_pool_free(pool, fa.ptrs[i]), MP_OK, "%s", mp_last_error());
  mp_stats_t s = stats(pool);
  cr_expect_eq(s.live_blocks, 0);
  cr_expect_eq(s.allocated_bytes, 0);
  cr_expect_eq(s.free_count, 32);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

Test(pool_arenas, stats_are_the_sums_of_the_arenas) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  job_t a = {.pool = pool, .bytes = 1000, .count = 10};
  job_t b = {.pool = pool, .bytes = 3 * MiB, .count = 2};
  on_thread(alloc_job, &a);
  on_thread(alloc_job, &b);
  cr_assert(a.st == MP_OK && b.st == MP_OK, "%s", mp_last_error());
  mp_stats_t s = stats(pool), sum = {0};
  size_t made = 0;
  for (size_t i = 0; i < 2; i++) {
    mp_pool_t *ar = mp__arena_at(pool, i);
    if (ar == NULL)
      continue;
    made++;
    sum.reserved_bytes += ar->st.reserved_bytes;
    sum.allocated_bytes += ar->st.allocated_bytes;
    sum.alloc_count += own_stats(ar).alloc_count;
    sum.device_alloc_count += ar->st.device_alloc_count;
  }
  cr_expect_eq(made, 2);
  cr_expect_eq(s.requested_bytes, 10 * 1000 + 2 * 3 * MiB);
  cr_expect_eq(s.peak_requested_bytes, 10 * 1000 + 2 * 3 * MiB);
  cr_expect_eq(s.alloc_count, 12);
  cr_expect_eq(s.live_blocks, 12);
  cr_expect_eq(s.alloc_count, sum.alloc_count);
  cr_expect_eq(s.allocated_bytes, sum.allocated_bytes);
  cr_expect_eq(s.reserved_bytes, sum.reserved_bytes);
  cr_expect_eq(s.device_alloc_count, sum.device_alloc_count);
  cr_expect_eq(s.free_bytes, s.reserved_bytes - s.allocated_bytes);
  cr_expect_geq(s.reserved_bytes, 10 * 1024 + 6 * MiB);
  /* reset_peaks reaches every arena. */
  on_thread(free_job, &b);
  cr_assert_eq(mp_pool_reset_peaks(pool), MP_OK);
  s = stats(pool);
  cr_expect_eq(s.peak_requested_bytes, 10 * 1000);
  on_thread(free_job, &a);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

Test(pool_arenas, trim_gives_every_arenas_cache_back) {
  mp_pool_t *pool = make_pool(dev, "arenas=3");
  job_t j[3];
  /* All live at once, so that no arena is idle and none borrows another's
   * cache: each grows its own. */
  for (int t = 0; t < 3; t++) {
    j[t] = (job_t){.pool = pool, .bytes = (size_t)(t + 1) * MiB, .count = 3};
    on_thread(alloc_job, &j[t]);
    cr_assert_eq(j[t].st, MP_OK, "%s", mp_last_error());
  }
  for (int t = 0; t < 3; t++)
    on_thread(free_job, &j[t]);
  mp_stats_t s = stats(pool);
  cr_assert_eq(s.allocated_bytes, 0);
  cr_assert_geq(s.reserved_bytes, 18 * MiB, "cached: %zu", s.reserved_bytes);
  /* A keep bounds what stays over all arenas together. */
  cr_assert_eq(mp_pool_trim(pool, 4 * MiB), MP_OK, "%s", mp_last_error());
  s = stats(pool);
  cr_expect_leq(s.free_bytes, 4 * MiB, "kept %zu", s.free_bytes);
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  s = stats(pool);
  cr_expect_eq(s.reserved_bytes, 0);
  for (size_t i = 0; i < 3; i++)
    if (mp__arena_at(pool, i) != NULL)
      cr_expect_eq(mp__arena_at(pool, i)->st.reserved_bytes, 0, "arena %zu", i);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

/* The device holds 64 MiB: one arena's 40 MiB cache must make room for
 * another arena's 48 MiB request (too big to borrow the cached block). */
Test(pool_arenas, out_of_memory_in_one_arena_reclaims_another_arenas_cache) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  int ia = cache_on_thread(pool, 40 * MiB, NULL);
  cr_assert_geq(stats(pool).reserved_bytes, 40 * MiB);
  job_t b = {.pool = pool, .bytes = 48 * MiB, .count = 1};
  on_thread(alloc_job, &b);
  cr_assert_eq(b.st, MP_OK, "%s", mp_last_error());
  int ib = arena_holding(pool, b.ptrs[0]);
  cr_assert(ia >= 0 && ib >= 0 && ia != ib, "arenas %d and %d", ia, ib);
  cr_expect_eq(mp__arena_at(pool, (size_t)ia)->st.reserved_bytes, 0,
               "the other arena's cache went back");
  mp_stats_t s = stats(pool);
  cr_expect_eq(s.oom_count, 0, "a served allocation counts no failure");
  cr_expect_leq(s.reserved_bytes, 64 * MiB);
  /* Beyond the device: a failure counted once, with the pool's figures. */
  job_t c = {.pool = pool, .bytes = 32 * MiB, .count = 1};
  on_thread(alloc_job, &c);
  cr_expect_eq(c.st, MP_ENOMEM);
  cr_expect_eq(stats(pool).oom_count, 1);
  on_thread(free_job, &b);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

/* ---- borrowing another arena's cache ----------------------------------- */
/* What one thread freed serves another thread's next large request, as in
 * a pool without arenas: no growth, no device call. */
/* With opts (arenas=2 and more): with a history, the lender's ring
 * records the loan, and the loan is made as without one. */
static void borrows_what_an_idle_arena_caches(const char *opts) {
  mp_pool_t *pool = make_pool(dev, opts);
  void *cached;
  int ia = cache_on_thread(pool, 16 * MiB, &cached);
  mp_stats_t before = stats(pool);
  job_t b = {.pool = pool, .bytes = 16 * MiB, .count = 1};
  on_thread(alloc_job, &b);
  cr_assert_eq(b.st, MP_OK, "%s", mp_last_error());
  mp_stats_t after = stats(pool);
  cr_expect_eq(b.ptrs[0], cached, "the other arena's cached block served it");
  cr_expect_eq(arena_holding(pool, b.ptrs[0]), ia, "and stays in its arena");
  cr_expect_eq(after.reserved_bytes, before.reserved_bytes,
               "reserved went from %zu to %zu", before.reserved_bytes,
               after.reserved_bytes);
  cr_expect_eq(after.device_alloc_count, before.device_alloc_count);
  const mp_pool_t *lender = mp__arena_at(pool, (size_t)ia);
  if (lender->hist.ev != NULL) {
    const mp__hevent_t *last = &lender->hist.ev[lender->hist.total - 1];
    cr_expect_eq(last->action, MP__H_ALLOC);
    cr_expect_eq(last->addr, (uintptr_t)cached);
  }
  /* Any thread frees it (it is found in the arena that holds it). */
  on_thread(free_job, &b);
  cr_assert_eq(b.st, MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(pool).live_blocks, 0);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

Test(pool_arenas, a_large_request_borrows_what_an_idle_arena_caches) {
  borrows_what_an_idle_arena_caches("arenas=2");
}

Test(pool_arenas, with_a_history_a_large_request_still_borrows) {
  borrows_what_an_idle_arena_caches("arenas=2,history=100");
}

/* A loan the miss path passes over because the lender's lock is held at
 * that moment is still taken before the request fails. Plain segments
 * under a 10 MiB cap: the lender's 8 MiB segment holds a live 4 MiB block
 * (split from a freed 8 MiB one) and 4 MiB free, which no trim gives back
 * (the segment is in use), and the 2 MiB left under the cap fit no 4 MiB
 * segment, so without the loan the request is MP_ELIMIT. */
typedef struct lender {
  mp_pool_t *pool;
  void *x, *y;
  mp_status_t st;
} lender_t;

static void *lender_caches(void *arg) {
  lender_t *l = arg;
  l->st = mp_pool_alloc(l->pool, 8 * MiB, NULL, &l->x);
  if (l->st == MP_OK)
    l->st = mp_pool_free(l->pool, l->x);
  if (l->st == MP_OK)
    l->st = mp_pool_alloc(l->pool, 4 * MiB, NULL, &l->y);
  return NULL;
}

typedef struct holder {
  mp_pool_t *arena;
  atomic_int held;
} holder_t;

static void *hold_for_a_while(void *arg) {
  holder_t *h = arg;
  mp__pool_lock(h->arena);
  atomic_store(&h->held, 1);
  usleep(200 * 1000);
  mp__pool_unlock(h->arena);
  return NULL;
}

Test(pool_arenas, a_loan_passed_over_for_a_held_lock_comes_before_failing) {
  mp_pool_t *pool = make_pool(dev, "arenas=2,virtual=0,max_bytes=10M");
  lender_t l = {.pool = pool};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, lender_caches, &l), 0);
  pthread_join(t, NULL);
  cr_assert_eq(l.st, MP_OK, "%s", mp_last_error());
  int ib = arena_holding(pool, l.y);
  cr_assert_geq(ib, 0);
  holder_t h = {.arena = mp__arena_at(pool, (size_t)ib)};
  atomic_init(&h.held, 0);
  cr_assert_eq(pthread_create(&t, NULL, hold_for_a_while, &h), 0);
  while (!atomic_load(&h.held))
    usleep(100);
  void *p = NULL;
  mp_status_t st = mp_pool_alloc(pool, 4 * MiB, NULL, &p);
  pthread_join(t, NULL);
  cr_assert_eq(st, MP_OK, "the request failed beside a fitting loan: %s",
               mp_last_error());
  cr_expect_eq(arena_holding(pool, p), ib, "the block is not the loan");
  cr_expect_eq(stats(pool).oom_count, 0,
               "the loan's request counted a failure");
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_pool_free(pool, l.y), MP_OK);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

/* Small requests grow their own arena (a granule at most), and an arena
 * busy with blocks of its own (less than half of it free) lends nothing:
 * threads keep to their arenas. */
Test(pool_arenas, small_requests_and_busy_arenas_do_not_borrow) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  int ia = cache_on_thread(pool, 16 * MiB, NULL);
  job_t small = {.pool = pool, .bytes = MiB, .count = 1};
  on_thread(alloc_job, &small);
  cr_assert_eq(small.st, MP_OK, "%s", mp_last_error());
  cr_expect_neq(arena_holding(pool, small.ptrs[0]), ia,
                "a 1 MiB request borrowed from the idle arena");
  /* Three 8 MiB blocks live in one arena, one of them freed: 8 MiB free
   * beside 16 allocated. */
  job_t busy = {.pool = pool, .bytes = 8 * MiB, .count = 3};
  on_thread(alloc_job, &busy);
  cr_assert_eq(busy.st, MP_OK, "%s", mp_last_error());
  int ib = arena_holding(pool, busy.ptrs[0]);
  cr_assert_eq(arena_holding(pool, busy.ptrs[2]), ib);
  cr_assert_eq(mp_pool_free(pool, busy.ptrs[2]), MP_OK);
  job_t c = {.pool = pool, .bytes = 8 * MiB, .count = 1};
  on_thread(alloc_job, &c);
  cr_assert_eq(c.st, MP_OK, "%s", mp_last_error());
  cr_expect_neq(c.ptrs[0], busy.ptrs[2], "a busy arena lent its free block");
  cr_expect_neq(arena_holding(pool, c.ptrs[0]), ib);
  busy.count = 2; /* the third is freed */
  job_t *left[] = {&c, &busy, &small};
  for (size_t k = 0; k < sizeof left / sizeof *left; k++) {
    on_thread(free_job, left[k]);
    cr_expect_eq(left[k]->st, MP_OK, "%s", mp_last_error());
  }
  cr_expect_eq(stats(pool).live_blocks, 0);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

/* The streams an arena knows are those it served: every free in an arena
 * that knows two streams records a marker on the device, so asking an
 * idle arena for a block must not teach it the asking stream unless it
 * lends one. */
static uint32_t arena_streams(mp_pool_t *pool, int i) {
  mp_pool_t *a = mp__arena_at(pool, (size_t)i);
  mp__pool_lock(a);
  uint32_t n = a->nstreams;
  mp__pool_unlock(a);
  return n;
}

/* The lender: 16, 1 and 16 MiB in its arena, the two 16 MiB blocks freed
 * (apart: the 1 MiB block between them stays), so the arena is idle with
 * 32 MiB free but no free block larger than 16 MiB. */
static void *lender_job(void *arg) {
  job_t *j = arg;
  static const size_t sizes[] = {16 * MiB, MiB, 16 * MiB};
  j->st = MP_OK;
  j->count = 3;
  for (int i = 0; i < 3 && j->st == MP_OK; i++)
    j->st = mp_pool_alloc(j->pool, sizes[i], NULL, &j->ptrs[i]);
  if (j->st == MP_OK)
    j->st = mp_pool_free(j->pool, j->ptrs[0]);
  if (j->st == MP_OK)
    j->st = mp_pool_free(j->pool, j->ptrs[2]);
  return NULL;
}

Test(pool_arenas, a_borrow_that_misses_teaches_the_other_arena_no_stream) {
  mp_pool_t *pool = make_pool(dev, "arenas=3"); /* a thread each */
  job_t l = {.pool = pool};
  on_thread(lender_job, &l);
  cr_assert_eq(l.st, MP_OK, "%s", mp_last_error());
  int ia = arena_holding(pool, l.ptrs[1]);
  cr_assert_geq(ia, 0);
  /* The frees' work done (white-box: their epoch closed and its marker
   * passed), so that only a block's size can stop a loan. */
  mp_pool_t *lender = mp__arena_at(pool, (size_t)ia);
  mp__pool_lock(lender);
  mp__streams_poll(lender, true);
  mp__pool_unlock(lender);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  uint32_t known = arena_streams(pool, ia);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  /* 24 MiB: less than the 32 MiB free, more than any free block. */
  job_t big = {.pool = pool, .bytes = 24 * MiB, .s = s, .count = 1};
  on_thread(alloc_job, &big);
  cr_assert_eq(big.st, MP_OK, "%s", mp_last_error());
  cr_expect_neq(arena_holding(pool, big.ptrs[0]), ia);
  cr_expect_eq(arena_streams(pool, ia), known,
               "the idle arena learnt the stream of a request it did not "
               "serve (%u streams, %u before)",
               arena_streams(pool, ia), known);
  /* A request it lends to (from a third arena): the stream gets its slot
   * there. */
  job_t fit = {.pool = pool, .bytes = 16 * MiB, .s = s, .count = 1};
  on_thread(alloc_job, &fit);
  cr_assert_eq(fit.st, MP_OK, "%s", mp_last_error());
  int ifit = arena_holding(pool, fit.ptrs[0]);
  cr_expect_eq(ifit, ia, "not lent (arena %d)", ifit);
  cr_expect_eq(arena_streams(pool, ia), known + 1);
  check(pool);
  on_thread(free_job, &fit);
  on_thread(free_job, &big);
  cr_assert_eq(mp_pool_free(pool, l.ptrs[1]), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
}

/* A cached block whose free another stream's work still holds is not
 * borrowed (the stream rules hold across arenas). */
Test(pool_arenas, borrowing_never_takes_a_block_another_stream_still_uses) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  job_t a = {.pool = pool, .bytes = 16 * MiB, .s = s, .count = 1};
  on_thread(alloc_job, &a);
  cr_assert_eq(a.st, MP_OK, "%s", mp_last_error());
  gate_t g;
  gate_init(&g);
  cr_assert_eq(mp_stream_launch_host(dev, s, gate_wait, &g), MP_OK);
  on_thread(free_job, &a); /* ordered on s, behind the gate */
  cr_assert_eq(a.st, MP_OK, "%s", mp_last_error());
  job_t b = {.pool = pool, .bytes = 16 * MiB, .count = 1};
  on_thread(alloc_job, &b);
  cr_assert_eq(b.st, MP_OK, "%s", mp_last_error());
  cr_expect_neq(b.ptrs[0], a.ptrs[0],
                "the block s still uses was given to the default stream");
  gate_open(&g);
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  on_thread(free_job, &b);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
  gate_destroy(&g);
}

static void *alloc_hold_job(void *arg) {
  return alloc_job(arg);
}

Test(pool_arenas, max_bytes_caps_the_sum_of_the_arenas) {
  mp_pool_t *pool = make_pool(dev, "arenas=2,max_bytes=48M");
  job_t a = {.pool = pool, .bytes = 30 * MiB, .count = 1};
  on_thread(alloc_hold_job, &a);
  cr_assert_eq(a.st, MP_OK, "%s", mp_last_error());
  /* 30 + 30 > 48: refused though the device has room. */
  job_t b = {.pool = pool, .bytes = 30 * MiB, .count = 1};
  on_thread(alloc_job, &b);
  cr_expect_eq(b.st, MP_ELIMIT, "%s", mp_last_error());
  cr_expect_leq(stats(pool).reserved_bytes, 48 * MiB);
  job_t c = {.pool = pool, .bytes = 16 * MiB, .count = 1};
  on_thread(alloc_job, &c);
  cr_expect_eq(c.st, MP_OK, "%s", mp_last_error());
  cr_expect_leq(stats(pool).reserved_bytes, 48 * MiB);
  /* a's 30 MiB freed stays cached in its arena; another arena's 30 MiB
   * comes from taking it back. */
  on_thread(free_job, &a);
  on_thread(alloc_job, &b);
  cr_expect_eq(b.st, MP_OK, "%s", mp_last_error());
  mp_stats_t s = stats(pool);
  cr_expect_leq(s.reserved_bytes, 48 * MiB, "reserved %zu", s.reserved_bytes);
  cr_expect_eq(s.allocated_bytes, 46 * MiB);
  on_thread(free_job, &b);
  on_thread(free_job, &c);
  /* Refused past the cap: the message gives the pool's figures as sizes,
   * the largest free block too (it gave a raw byte count). */
  void *x = NULL;
  cr_expect_eq(mp_pool_alloc(pool, 60 * MiB, NULL, &x), MP_ELIMIT);
  const char *m = strstr(mp_last_error(), "largest free block ");
  cr_assert_not_null(m, "%s", mp_last_error());
  double v = -1;
  char unit[8] = "";
  cr_expect_eq(sscanf(m + 19, "%lf %7s", &v, unit), 2, "%s", mp_last_error());
  cr_expect(strcmp(unit, "B") == 0 || strcmp(unit, "KiB") == 0 ||
                strcmp(unit, "MiB") == 0 || strcmp(unit, "GiB") == 0,
            "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

Test(pool_arenas, foreign_and_double_frees_are_einval_and_change_nothing) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  mp_pool_t *other = make_pool(dev, NULL);
  job_t a = {.pool = pool, .bytes = 4096, .count = 2};
  on_thread(alloc_job, &a);
  cr_assert_eq(a.st, MP_OK);
  void *foreign;
  cr_assert_eq(mp_pool_alloc(other, 4096, NULL, &foreign), MP_OK);
  mp_stats_t before = stats(pool);
  cr_expect_eq(mp_pool_free(pool, foreign), MP_EINVAL);
  cr_expect_eq(mp_pool_free(pool, (char *)a.ptrs[0] + 512), MP_EINVAL);
  int stack_word;
  cr_expect_eq(mp_pool_free(pool, &stack_word), MP_EINVAL);
  cr_expect_eq(mp_pool_free_async(pool, foreign, NULL), MP_EINVAL);
  cr_expect_eq(mp_pool_free_after_all(pool, foreign), MP_EINVAL);
  cr_expect_eq(mp_pool_record_stream(pool, foreign, NULL), MP_EINVAL);
  mp_stats_t after = stats(pool);
  cr_expect_eq(memcmp(&before, &after, sizeof before), 0);
  cr_assert_eq(mp_pool_free(pool, a.ptrs[0]), MP_OK);
  before = stats(pool);
  job_t again = {.pool = pool, .count = 1, .ptrs = {a.ptrs[0]}};
  on_thread(free_job, &again); /* a double free from another thread */
  cr_expect_eq(again.st, MP_EINVAL);
  after = stats(pool);
  cr_expect_eq(memcmp(&before, &after, sizeof before), 0);
  cr_assert_eq(mp_pool_free(pool, a.ptrs[1]), MP_OK);
  cr_assert_eq(mp_pool_free(other, foreign), MP_OK);
  check(pool);
  mp_pool_destroy(other);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

/* A thread with an arena of its own frees another arena's blocks: its own
 * arena's live map misses them, and the free goes on to the arena holding
 * them. Bad pointers get the message of the arena they point into (or of
 * the pool) and change nothing, in neither arena: no stream slot is added
 * to the caller's arena by a stream free that went on. */
static void frees_go_on_from_the_callers_arena(const char *conf) {
  mp_pool_t *pool = make_pool(dev, conf);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  void *mine;
  cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, &mine), MP_OK, "%s",
               mp_last_error());
  job_t w = {.pool = pool, .bytes = 3 * MiB, .count = 4};
  on_thread(alloc_job, &w);
  cr_assert_eq(w.st, MP_OK, "%s", mp_last_error());
  int im = arena_holding(pool, mine), iw = arena_holding(pool, w.ptrs[0]);
  cr_assert(im >= 0 && iw >= 0 && im != iw, "arenas %d, %d", im, iw);
  mp_pool_t *am = mp__arena_at(pool, (size_t)im);
  mp_pool_t *aw = mp__arena_at(pool, (size_t)iw);
  uint32_t streams = am->nstreams;
  cr_expect_eq(mp_pool_free(pool, w.ptrs[0]), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_free_async(pool, w.ptrs[1], s), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp__map_count(aw), 2);
  cr_expect_eq(am->nstreams, streams, "the caller's arena met no stream");
  mp_stats_t before = stats(pool);
  char *inner = (char *)w.ptrs[2] + 4096;
  cr_expect_eq(mp_pool_free(pool, inner), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "points inside the block") != NULL, "'%s'",
            mp_last_error());
  cr_expect_eq(mp_pool_free(pool, w.ptrs[0]), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "double free") != NULL, "'%s'",
            mp_last_error());
  int stack_word;
  cr_expect_eq(mp_pool_free_async(pool, &stack_word, s), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "not allocated from this pool") != NULL,
            "'%s'", mp_last_error());
  mp_stats_t after = stats(pool);
  cr_expect_eq(memcmp(&before, &after, sizeof before), 0);
  cr_expect_eq(am->nstreams, streams, "the caller's arena met no stream");
  cr_expect_eq(mp_pool_free(pool, w.ptrs[2]), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_free(pool, w.ptrs[3]), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_free(pool, mine), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(pool).live_blocks, 0);
  mp_stream_synchronize(dev, s);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_stream_destroy(dev, s);
}

Test(pool_arenas, a_thread_with_an_arena_frees_another_arenas_blocks) {
  frees_go_on_from_the_callers_arena("arenas=2");
}

Test(pool_arenas, a_thread_with_an_arena_frees_another_arenas_plain_blocks) {
  frees_go_on_from_the_callers_arena("arenas=2,virtual=0");
}

/* A pool with arenas=2: a block of the calling thread's arena (*mine) and
 * one of a thread's after it (w->ptrs[0], in the other arena). */
static mp_pool_t *mine_and_another_threads(void **mine, job_t *w) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, mine), MP_OK, "%s",
               mp_last_error());
  *w = (job_t){.pool = pool, .bytes = 4096, .count = 1};
  on_thread(alloc_job, w);
  cr_assert_eq(w->st, MP_OK, "%s", mp_last_error());
  return pool;
}

/* A pool's pause pauses its arenas one after another: a thread whose arena
 * is paused already still frees a block of an arena that runs (here the
 * caller's arena alone is paused, as mid-pause), and its own blocks are
 * refused (MP_EBUSY) until the arena resumes. */
Test(pool_arenas, a_paused_arena_still_frees_a_running_arenas_block) {
  void *mine;
  job_t w;
  mp_pool_t *pool = mine_and_another_threads(&mine, &w);
  int im = arena_holding(pool, mine);
  cr_assert(im >= 0 && im != arena_holding(pool, w.ptrs[0]));
  mp_pool_t *am = mp__arena_at(pool, (size_t)im);
  cr_assert_eq(mp_pool_pause(am, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  /* The free that goes on is no failure: the thread's last one stays. */
  cr_assert_eq(mp_pool_free(NULL, mine), MP_EINVAL);
  cr_expect_eq(mp_pool_free(pool, w.ptrs[0]), MP_OK, "%s", mp_last_error());
  cr_expect(strstr(mp_last_error(), "pool is NULL") != NULL, "'%s'",
            mp_last_error());
  cr_expect_eq(mp_pool_free(pool, mine), MP_EBUSY);
  cr_assert_eq(mp_pool_resume(am), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_free(pool, mine), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(pool).live_blocks, 0);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

/* A thread remembers its arena of the last pool with arenas it used (a
 * memo keyed by the pool's serial): moving between two pools, and on to
 * pools made after one was destroyed (maybe at the same address), every
 * block lands in an arena of the pool it was asked of, and frees find it.
 * A memo that outlived its pool would hand out a destroyed arena (ASan). */
Test(pool_arenas, a_thread_finds_its_arena_in_each_pool_it_moves_between) {
  mp_pool_t *p[2] = {make_pool(dev, "arenas=2"), make_pool(dev, "arenas=3")};
  for (int round = 0; round < 8; round++) {
    void *x[2][4];
    uint64_t freed[2] = {stats(p[0]).free_count, stats(p[1]).free_count};
    for (int k = 0; k < 4; k++)
      for (int j = 0; j < 2; j++)
        cr_assert_eq(mp_pool_alloc(p[j], 4096 << j, NULL, &x[j][k]), MP_OK,
                     "%s", mp_last_error());
    for (int j = 0; j < 2; j++)
      for (int k = 0; k < 4; k++) {
        cr_expect_geq(arena_holding(p[j], x[j][k]), 0, "round %d", round);
        cr_expect_lt(arena_holding(p[!j], x[j][k]), 0, "round %d", round);
      }
    for (int k = 0; k < 4; k++)
      for (int j = 0; j < 2; j++)
        cr_assert_eq(mp_pool_free(p[j], x[j][k]), MP_OK, "%s", mp_last_error());
    for (int j = 0; j < 2; j++) {
      mp_stats_t s = stats(p[j]);
      cr_expect_eq(s.live_blocks, 0);
      cr_expect_eq(s.free_count, freed[j] + 4);
    }
    /* One pool goes; the next is made, often where it was. */
    int j = round % 2;
    check(p[j]);
    cr_assert_eq(mp_pool_destroy(p[j]), MP_OK);
    p[j] = make_pool(dev, j ? "arenas=3" : "arenas=2");
  }
  for (int j = 0; j < 2; j++)
    cr_assert_eq(mp_pool_destroy(p[j]), MP_OK);
}

/* A bad free of arena 0's memory on a thread with no arena (numbered by no
 * allocation): the pointer found in arena 0's range, which is read without
 * a lock. */
typedef struct {
  mp_pool_t *pool;
  void *ptr;
  mp_status_t st;
  char why[256];
  atomic_bool done;
} unnumbered_free_t;

static void *unnumbered_free(void *arg) {
  unnumbered_free_t *u = arg;
  u->st = mp_pool_free(u->pool, u->ptr);
  snprintf(u->why, sizeof u->why, "%s", mp_last_error());
  atomic_store(&u->done, true);
  return NULL;
}

/* A thread that never allocated (a host function's, a consumer's) frees
 * blocks of arena 0 as any thread's: by arena 0's range, without a lock,
 * as record_stream finds them, so that a bad pointer there takes no other
 * arena's lock. The search for such a thread's pointer left arena 0 (the
 * arena a thread without a number counts as its own) out of the ranges
 * read, and went on to every arena's live map and segments under its
 * lock: here it waited for arena 1's lock, which this thread holds. */
Test(pool_arenas, a_thread_without_an_arena_finds_arena_0_by_its_range,
     .timeout = 60) {
  void *mine;
  job_t w;
  mp_pool_t *pool = mine_and_another_threads(&mine, &w);
  cr_assert_not_null(mp__arena_at(pool, 0));
  cr_assert_not_null(mp__arena_at(pool, 1));
  cr_assert_not_null(mp__arena_at(pool, 0)->vseg, "arena 0 has a range");
  void *in0 = arena_holding(pool, mine) == 0 ? mine : w.ptrs[0];
  void *in1 = in0 == mine ? w.ptrs[0] : mine;
  cr_assert_eq(arena_holding(pool, in0), 0);
  cr_assert_eq(mp_pool_free(pool, in0), MP_OK, "%s", mp_last_error());
  mp_pool_t *a1 = mp__arena_at(pool, 1);
  unnumbered_free_t u = {.pool = pool, .ptr = in0};
  atomic_init(&u.done, false);
  pthread_t t;
  mp__pool_lock(a1);
  cr_assert_eq(pthread_create(&t, NULL, unnumbered_free, &u), 0);
  /* 30 s at most (2 s was short for a loaded machine: the free runs on a
   * new thread); a free that waits for the lock is done only after it. */
  for (int k = 0; k < 30000 && !atomic_load(&u.done); k++)
    usleep(1000);
  bool done = atomic_load(&u.done);
  mp__pool_unlock(a1);
  pthread_join(t, NULL);
  cr_expect(done, "the free waited for arena 1's lock");
  cr_expect_eq(u.st, MP_EINVAL);
  cr_expect(strstr(u.why, "double free") != NULL, "'%s'", u.why);
  cr_expect_eq(mp_pool_free(pool, in1), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

/* on_free hooks: the first free goes, the next is refused. */
static void refuse_one(void *ctx) {
  ((fake_dev_t *)ctx)->refuse_frees = 1;
}
static void refuse_after_one(void *ctx) {
  fake_dev_t *f = ctx;
  f->on_free = refuse_one;
  f->on_free_ctx = f;
}

/* A pool on d made with conf, with the calling thread's arena (*im) and
 * another thread's after it in the table; then a destroy that frees the
 * calling thread's arena and fails on the other's (the device refuses its
 * first free): the pool stays, that arena's entry empty. lane: solo ends
 * first (arenas_auto=1), as contention ends it. */
static mp_pool_t *destroy_fails_after_mine(mp_device_t *d, const char *conf,
                                           bool lane, int *im) {
  fake_dev_t *f = fake_of(d);
  mp_pool_t *pool = make_pool(d, conf);
  void *mine;
  cr_assert_eq(mp_pool_alloc(pool, 4 * MiB, NULL, &mine), MP_OK, "%s",
               mp_last_error());
  int iw = -1;
  *im = arena_holding(pool, mine);
  /* On the arenas' path, the free leaves the thread's memo of its arena. */
  cr_assert_eq(mp_pool_free(pool, mine), MP_OK, "%s", mp_last_error());
  if (lane) {
    cr_assert_eq(mp__pool_hot(pool), mp__arena_at(pool, (size_t)*im), "solo");
    mp__arena_lane(pool);
  }
  /* Consecutive threads take consecutive arenas: one lands after mine. */
  job_t w = {.pool = pool, .bytes = 4 * MiB, .count = 1};
  for (int k = 0; k < 8 && iw <= *im; k++) {
    on_thread(alloc_job, &w);
    cr_assert_eq(w.st, MP_OK, "%s", mp_last_error());
    iw = arena_holding(pool, w.ptrs[0]);
  }
  cr_assert(*im >= 0 && iw > *im, "arenas %d, %d", *im, iw);
  f->on_free = refuse_after_one;
  f->on_free_ctx = f;
  cr_assert_eq(mp_pool_destroy(pool), MP_EDRIVER);
  f->on_free = NULL;
  f->refuse_frees = 0;
  cr_assert_null(mp__arena_at(pool, (size_t)*im), "arena %d went", *im);
  cr_assert_not_null(mp__arena_at(pool, (size_t)iw), "arena %d stayed", iw);
  return pool;
}

/* The calling thread's next allocation from pool lands in a new arena im;
 * then the pool goes. */
static void allocates_in_a_new_arena(mp_pool_t *pool, int im) {
  void *again;
  cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, &again), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(arena_holding(pool, again), im, "in a new arena %d", im);
  cr_expect_eq(mp_pool_free(pool, again), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

/* A destroy that frees the calling thread's arena and then fails on a later
 * arena leaves the pool: the thread's next call makes the arena again. Its
 * memo of the arena freed (the pool's serial unchanged) handed that freed
 * arena out instead (ASan: heap-use-after-free). */
Test(pool_arenas, a_thread_whose_arena_a_failed_destroy_freed_gets_a_new_one) {
  mp_device_t *d = fake_open((size_t)1 << 30, 0);
  int im;
  mp_pool_t *pool = destroy_fails_after_mine(d, "arenas=8", false, &im);
  allocates_in_a_new_arena(pool, im);
  fake_close(d);
}

/* The same with arenas_auto=1: the solo arena (the lane's, once another
 * arena was made) is the calling thread's, and the pool's hot path
 * pointed at it after the destroy freed it; now the pool leaves solo for
 * good first (hot: the pool), and the thread's next call makes a new
 * arena on the arenas' path. */
Test(pool_arenas, a_failed_destroy_that_freed_the_solo_arena_leaves_solo) {
  mp_device_t *d = fake_open((size_t)1 << 30, 0);
  int im;
  mp_pool_t *pool =
      destroy_fails_after_mine(d, "arenas=8,arenas_auto=1", true, &im);
  cr_assert_eq(mp__pool_hot(pool), pool, "the hot path left the arena gone");
  allocates_in_a_new_arena(pool, im);
  fake_close(d);
}

/* Without virtual memory an arena's blocks lie in plain segments, outside
 * any range: a free still finds their arena (by its live map). */
Test(pool_arenas, plain_segment_blocks_are_freed_in_their_arena) {
  mp_pool_t *pool = make_pool(dev, "arenas=2,virtual=0");
  job_t a = {.pool = pool, .bytes = 3 * MiB, .count = 4};
  job_t b = {.pool = pool, .bytes = 4096, .count = 4};
  on_thread(alloc_job, &a);
  on_thread(alloc_job, &b);
  cr_assert(a.st == MP_OK && b.st == MP_OK, "%s", mp_last_error());
  cr_assert_neq(arena_holding(pool, a.ptrs[0]), arena_holding(pool, b.ptrs[0]));
  cr_expect_eq(pool->arenas[0].vsize, 0, "no virtual range");
  on_thread(free_job, &a); /* from a thread with no arena */
  cr_expect_eq(a.st, MP_OK, "%s", mp_last_error());
  for (int i = 0; i < 4; i++)
    cr_expect_eq(mp_pool_free(pool, b.ptrs[i]), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_free(pool, b.ptrs[0]), MP_EINVAL);
  mp_stats_t s = stats(pool);
  cr_expect_eq(s.live_blocks, 0);
  cr_expect_eq(s.free_count, 8);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

/* A bad pointer into an arena's plain segment gets the message a pool
 * without arenas gives it (what is wrong with it), and changes nothing. */
Test(pool_arenas, bad_pointers_into_plain_segments_say_what_is_wrong) {
  mp_pool_t *pool = make_pool(dev, "arenas=2,virtual=0");
  job_t a = {.pool = pool, .bytes = 3 * MiB, .count = 2};
  on_thread(alloc_job, &a);
  cr_assert_eq(a.st, MP_OK, "%s", mp_last_error());
  cr_assert_eq(pool->arenas[0].vsize + pool->arenas[1].vsize, 0);
  cr_assert_eq(mp_pool_free(pool, a.ptrs[1]), MP_OK, "%s", mp_last_error());
  mp_stats_t before = stats(pool);
  char *inner = (char *)a.ptrs[0] + 4096;
  cr_expect_eq(mp_pool_free(pool, inner), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "points inside the block") != NULL, "'%s'",
            mp_last_error());
  cr_expect_eq(mp_pool_record_stream(pool, inner, NULL), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "points inside the block") != NULL, "'%s'",
            mp_last_error());
  cr_expect_eq(mp_pool_free(pool, a.ptrs[1]), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "double free") != NULL, "'%s'",
            mp_last_error());
  mp_stats_t after = stats(pool);
  cr_expect_eq(memcmp(&before, &after, sizeof before), 0);
  cr_assert_eq(mp_pool_free(pool, a.ptrs[0]), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

/* free_async and record_stream through the pool reach the owning arena. */
Test(pool_arenas, stream_frees_reach_the_owning_arena) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  cr_assert_eq(mp_pool_add_stream(pool, s), MP_OK, "%s", mp_last_error());
  job_t a = {.pool = pool, .bytes = 65536, .count = 3};
  on_thread(alloc_job, &a);
  cr_assert_eq(a.st, MP_OK);
  mp_pool_t *ar = mp__arena_at(pool, (size_t)arena_holding(pool, a.ptrs[0]));
  cr_expect_geq(ar->nstreams, 2, "the added stream is known to the arena");
  cr_expect_eq(mp_pool_record_stream(pool, a.ptrs[0], s), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_free_async(pool, a.ptrs[1], s), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_free(pool, a.ptrs[0]), MP_OK);
  cr_expect_eq(mp_pool_free_after_all(pool, a.ptrs[2]), MP_OK);
  cr_expect_eq(mp__map_count(ar), 0);
  mp_stream_synchronize(dev, s);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_stream_destroy(dev, s);
}

static int handler_calls;
static mp_pool_t *handler_pool;
static int count_oom(mp_pool_t *pool, size_t bytes, mp_status_t st, void *ctx) {
  (void)bytes, (void)st, (void)ctx;
  handler_calls++;
  handler_pool = pool;
  return 0;
}

Test(pool_arenas, out_of_memory_handler_gets_the_pool) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  cr_assert_eq(mp_pool_set_oom_handler(pool, count_oom, NULL), MP_OK);
  void *p = NULL;
  cr_expect_eq(mp_pool_alloc(pool, 100 * MiB, NULL, &p), MP_ENOMEM);
  cr_expect_eq(handler_calls, 1);
  cr_expect_eq(handler_pool, pool);
  cr_expect_eq(stats(pool).oom_count, 1);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

/* A handler that frees the block in *ctx (held by another thread's arena)
 * and asks for a retry. */
static int free_held(mp_pool_t *pool, size_t bytes, mp_status_t st, void *ctx) {
  (void)bytes, (void)st;
  void **held = ctx;
  handler_calls++;
  if (*held == NULL || mp_pool_free(pool, *held) != MP_OK)
    return 0;
  *held = NULL;
  return 1;
}

/* What the handler frees lands in the arena that held it: the retry must
 * be able to use it (its cache, its share of the cap), as a pool without
 * arenas would. opts: the pool; 40 MiB twice does not fit either way. */
static void handler_frees_another_arenas_block(const char *opts) {
  mp_pool_t *pool = make_pool(dev, opts);
  job_t a = {.pool = pool, .bytes = 40 * MiB, .count = 1};
  on_thread(alloc_job, &a);
  cr_assert_eq(a.st, MP_OK, "%s", mp_last_error());
  void *held = a.ptrs[0];
  cr_assert_eq(mp_pool_set_oom_handler(pool, free_held, &held), MP_OK);
  void *p = NULL;
  mp_status_t st = mp_pool_alloc(pool, 40 * MiB, NULL, &p);
  cr_expect_eq(handler_calls, 1);
  cr_expect_eq(held, NULL, "the handler freed the other arena's block");
  cr_expect_eq(st, MP_OK, "%s: %s", opts, mp_last_error());
  mp_stats_t s = stats(pool);
  cr_expect_eq(s.oom_count, 0, "a served allocation counts no failure");
  cr_expect_leq(s.reserved_bytes, 48 * MiB);
  if (st == MP_OK)
    cr_expect_eq(mp_pool_free(pool, p), MP_OK);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

Test(pool_arenas, out_of_memory_handler_frees_reach_the_retry_on_the_device) {
  handler_frees_another_arenas_block("arenas=2");
}

Test(pool_arenas, out_of_memory_handler_frees_reach_the_retry_under_the_cap) {
  handler_frees_another_arenas_block("arenas=2,max_bytes=48M");
}

/* Whether the n bytes at buf hold the low 6 bytes of address a, little
 * endian (how a pickle's integer carries a user-space address). */
static bool holds_address(const unsigned char *buf, size_t n, uintptr_t a) {
  unsigned char k[6];
  for (int i = 0; i < 6; i++)
    k[i] = (unsigned char)(a >> (8 * i));
  for (size_t i = 0; i + sizeof k <= n; i++)
    if (memcmp(buf + i, k, sizeof k) == 0)
      return true;
  return false;
}

/* A snapshot of a pool with arenas shows every arena's segments and blocks
 * (the pool itself holds none); python/tests/test_snapshot.py reads one
 * with Python's pickle. */
Test(pool_arenas, a_snapshot_shows_every_arenas_blocks) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  /* Two blocks per thread: the second is not where its segment starts
   * (whose address the snapshot names too). */
  job_t a = {.pool = pool, .bytes = 3 * MiB, .count = 2};
  job_t b = {.pool = pool, .bytes = 5 * MiB, .count = 2};
  on_thread(alloc_job, &a);
  on_thread(alloc_job, &b);
  cr_assert(a.st == MP_OK && b.st == MP_OK, "%s", mp_last_error());
  cr_assert_neq(arena_holding(pool, a.ptrs[1]), arena_holding(pool, b.ptrs[1]));
  char path[] = "/tmp/mp_arenas_snapshot_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  close(fd);
  cr_assert_eq(mp_pool_snapshot(pool, path), MP_OK, "%s", mp_last_error());
  static unsigned char buf[1 << 16];
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f);
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  unlink(path);
  cr_assert(n > 0 && n < sizeof buf, "%zu bytes", n);
  cr_expect(holds_address(buf, n, (uintptr_t)a.ptrs[1]),
            "the first arena's block is missing (%zu bytes)", n);
  cr_expect(holds_address(buf, n, (uintptr_t)b.ptrs[1]),
            "the second arena's block is missing (%zu bytes)", n);
  on_thread(free_job, &a);
  on_thread(free_job, &b);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

Test(pool_arenas, every_call_works_on_a_pool_with_arenas) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, &p), MP_OK);
  mp_device_t *peer;
  cr_assert_eq(mp_device_open("host", &peer), MP_OK);
  mp_pool_t *graph = NULL;
  cr_expect_eq(mp_pool_graph_create(pool, &graph), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_graph_release(graph), MP_OK, "%s", mp_last_error());
  /* Work on arenas, each with its tests: graph pools
   * (test_pool_arenas_graph, here and in tests/integration), movable
   * blocks and defragment (test_pool_arenas_movable), child pools
   * (test_pool_arenas_child), IPC
   * export (test_pool_arenas_ipc), alloc_contiguous
   * (test_pool_arenas_contiguous), set_max_fraction
   * (test_pool_arenas_max_fraction), history (here), set_access (its own
   * device here: nothing to do; see test_cuda_peer_access), freeze
   * (test_pool_arenas_freeze), dump (test_pool_arenas_dump), pause and
   * resume (test_pool_arenas_pause). */
  FILE *null = fopen("/dev/null", "w");
  cr_expect_eq(mp_pool_dump(pool, null, "text"), MP_OK, "%s", mp_last_error());
  fclose(null);
  cr_expect_eq(mp_pool_set_access(pool, peer), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_freeze(pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  mp_device_close(peer);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

Test(pool_arenas, config_bounds_and_history_in_each_arena) {
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_expect_eq(cfg.arenas, 0, "off by default");
  cr_expect_eq(mp_pool_config_parse(&cfg, "arenas=65"), MP_EINVAL);
  cr_expect_eq(cfg.arenas, 0);
  cr_expect_eq(mp_pool_config_parse(&cfg, "arenas=64"), MP_OK);
  cr_expect_eq(cfg.arenas, 64);
  mp_pool_t *pool = NULL;
  cfg.arenas = 65;
  cr_expect_eq(mp_pool_create(dev, &cfg, &pool), MP_EINVAL);
  /* History: a ring in each arena (none in the pool itself); stacks:
   * test_pool_history.c. */
  cfg.arenas = 2;
  cfg.history = 100;
  cr_assert_eq(mp_pool_create(dev, &cfg, &pool), MP_OK, "%s", mp_last_error());
  cr_expect_null(pool->hist.ev, "the pool itself records nothing");
  job_t a = {.pool = pool, .bytes = 4096, .count = 1};
  on_thread(alloc_job, &a);
  cr_assert_eq(a.st, MP_OK, "%s", mp_last_error());
  int i = arena_holding(pool, a.ptrs[0]);
  cr_assert_geq(i, 0);
  const mp_pool_t *arena = mp__arena_at(pool, (size_t)i);
  cr_expect_eq(arena->hist.cap, 100);
  cr_expect_geq(arena->hist.total, 2, "its growth and its allocation");
  cr_expect_eq(arena->hist.ev[arena->hist.total - 1].action, MP__H_ALLOC);
  cr_expect_eq(arena->hist.ev[arena->hist.total - 1].addr,
               (uintptr_t)a.ptrs[0]);
  on_thread(free_job, &a);
  cr_expect_eq(arena->hist.ev[arena->hist.total - 1].action,
               MP__H_FREE_COMPLETED);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

/* The oom events of the history: one per allocation that fails, none for
 * an arena asking for its share of the cap (a failure its own retry
 * answers), in the calling thread's arena. */
Test(pool_arenas, history_has_one_oom_event_per_failed_allocation) {
  mp_pool_t *pool = make_pool(dev, "arenas=2,max_bytes=24M,history=100");
  job_t a = {.pool = pool, .bytes = 16 * MiB, .count = 1};
  on_thread(alloc_hold_job, &a); /* the arena's first: asks for a share */
  cr_assert_eq(a.st, MP_OK, "%s", mp_last_error());
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  job_t b = {.pool = pool, .bytes = 16 * MiB, .count = 1, .s = s};
  on_thread(alloc_job, &b); /* 16 + 16 > 24: fails after the reclaim */
  cr_assert_eq(b.st, MP_ELIMIT);
  size_t ooms = 0, events = 0;
  for (size_t i = 0; i < pool->cfg.arenas; i++) {
    const mp_pool_t *x = mp__arena_at(pool, i);
    for (uint64_t e = 0; x != NULL && e < x->hist.total; e++, events++)
      if (x->hist.ev[e].action == MP__H_OOM) {
        ooms++;
        cr_expect_eq(x->hist.ev[e].size, 16 * MiB);
        cr_expect_leq(x->hist.ev[e].addr, 8 * MiB, "what could be reserved");
        cr_expect_eq(x->hist.ev[e].stream, (uintptr_t)s, "the request's");
      }
  }
  cr_expect_gt(events, 0);
  cr_expect_eq(ooms, 1, "%zu oom events", ooms);
  cr_expect_eq(stats(pool).oom_count, 1);
  on_thread(free_job, &a);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
}

Test(pool_arenas, arenas_zero_is_the_pool_itself) {
  mp_pool_t *pool = make_pool(dev, "arenas=0");
  cr_expect_eq(pool->arenas, NULL);
  job_t a = {.pool = pool, .bytes = 4096, .count = 4};
  on_thread(alloc_job, &a);
  cr_assert_eq(a.st, MP_OK);
  cr_expect_eq(own_stats(pool).alloc_count, 4, "served by the pool's own core");
  cr_expect_neq(mp__map_find(pool, (uintptr_t)a.ptrs[0]), NULL);
  on_thread(free_job, &a);
  cr_expect_eq(pool->st.free_count, 4);
  /* Its features work as before. */
  mp_pool_t *child = NULL;
  cr_expect_eq(mp_pool_create_child(pool, MiB, &child), MP_OK);
  mp_pool_destroy(child);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

/* ---- many threads, fewer arenas: blocks cross threads -------------------- */
enum { T = 4, ROUNDS = 4000, SLOTS = 32 };
typedef struct race {
  mp_pool_t *pool;
  _Atomic(void *) slots[SLOTS]; /* blocks any thread may free */
  atomic_int failures;
} race_t;
typedef struct racer {
  race_t *r;
  uint64_t seed;
} racer_t;

static void *race_job(void *arg) {
  racer_t *me = arg;
  race_t *r = me->r;
  uint64_t s = me->seed;
  for (int i = 0; i < ROUNDS; i++) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    size_t k = s % SLOTS, bytes = 512 + (s >> 8) % (2 * MiB);
    void *mine = NULL;
    if (mp_pool_alloc(r->pool, bytes, NULL, &mine) != MP_OK) {
      atomic_fetch_add(&r->failures, 1);
      continue;
    }
    memset(mine, (int)(k & 0xff), 64);
    void *old = atomic_exchange(&r->slots[k], mine);
    if (old != NULL && mp_pool_free(r->pool, old) != MP_OK)
      atomic_fetch_add(&r->failures, 1);
  }
  return NULL;
}

Test(pool_arenas, threads_sharing_arenas_free_each_others_blocks_safely) {
  mp_device_t *big;
  cr_assert_eq(mp_device_open("host:capacity=8G", &big), MP_OK);
  race_t r = {.pool = make_pool(big, "arenas=2")};
  pthread_t t[T];
  racer_t who[T];
  for (int i = 0; i < T; i++) {
    who[i] = (racer_t){&r, 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1)};
    pthread_create(&t[i], NULL, race_job, &who[i]);
  }
  for (int i = 0; i < T; i++)
    pthread_join(t[i], NULL);
  cr_expect_eq(atomic_load(&r.failures), 0, "%s", mp_last_error());
  for (int k = 0; k < SLOTS; k++)
    if (r.slots[k] != NULL)
      cr_expect_eq(mp_pool_free(r.pool, r.slots[k]), MP_OK);
  mp_stats_t s = stats(r.pool);
  cr_expect_eq(s.live_blocks, 0);
  cr_expect_eq(s.alloc_count, (uint64_t)T * ROUNDS);
  cr_expect_eq(s.free_count, (uint64_t)T * ROUNDS);
  check(r.pool);
  cr_assert_eq(mp_pool_destroy(r.pool), MP_OK);
  mp_device_close(big);
}

/* ---- the cap while arenas hand its share back and forth ---------------- */
/* Four threads on two arenas allocate and free on two streams under a
 * tight cap (shares taken back, other arenas trimmed, failures expected);
 * a fifth reads the stats and mem_info, trims and checks. What the stats
 * say the arenas reserved is never above the cap, nor is any arena above
 * its share. */
#define CAP_THREADS 4
#define CAP_BYTES   (24 * MiB)

typedef struct cap_race {
  mp_pool_t *pool;
  mp_stream_t s[2];
  atomic_bool stop;
  atomic_int bad;  /* answers other than OK / ELIMIT / ENOMEM */
  atomic_int over; /* reads above the cap */
  size_t worst;    /* the highest such read */
  atomic_int served;
} cap_race_t;

static void *cap_alloc_job(void *arg) {
  cap_race_t *r = arg;
  static atomic_uint seeds;
  unsigned seed = atomic_fetch_add(&seeds, 1) * 7919u + 1;
  void *held[8] = {0};
  while (!atomic_load(&r->stop)) {
    int k = rand_r(&seed) % 8;
    if (held[k] != NULL && mp_pool_free(r->pool, held[k]) != MP_OK)
      atomic_fetch_add(&r->bad, 1);
    held[k] = NULL;
    size_t bytes = (size_t)(rand_r(&seed) % (3 << 20)) + 4096;
    mp_status_t st =
        mp_pool_alloc(r->pool, bytes, r->s[rand_r(&seed) % 2], &held[k]);
    if (st == MP_OK)
      atomic_fetch_add(&r->served, 1);
    else if (st != MP_ELIMIT && st != MP_ENOMEM)
      atomic_fetch_add(&r->bad, 1);
    if (st != MP_OK)
      held[k] = NULL;
  }
  for (int k = 0; k < 8; k++)
    if (held[k] != NULL && mp_pool_free(r->pool, held[k]) != MP_OK)
      atomic_fetch_add(&r->bad, 1);
  return NULL;
}

Test(pool_arenas, reserved_never_reads_above_the_cap_while_shares_move,
     .timeout = 60) {
  cap_race_t r = {.pool = make_pool(dev, "arenas=2,max_bytes=24M")};
  cr_assert_eq(mp_stream_create(dev, &r.s[0]), MP_OK);
  cr_assert_eq(mp_stream_create(dev, &r.s[1]), MP_OK);
  pthread_t t[CAP_THREADS];
  for (int i = 0; i < CAP_THREADS; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, cap_alloc_job, &r), 0);
  /* A few seconds: a read above the cap needs a share to move between
   * the reads of the two arenas. */
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0;; i++) {
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - t0.tv_sec >= 4)
      break;
    mp_stats_t s = stats(r.pool);
    if (s.reserved_bytes > CAP_BYTES) {
      atomic_fetch_add(&r.over, 1);
      if (s.reserved_bytes > r.worst)
        r.worst = s.reserved_bytes;
    }
    size_t free_b = 0, total_b = 0;
    cr_assert_eq(mp_pool_mem_info(r.pool, &free_b, &total_b), MP_OK);
    cr_assert(total_b <= CAP_BYTES && free_b <= total_b, "mem_info %zu of %zu",
              free_b, total_b);
    if (i % 8 == 0)
      check(r.pool);
    if (i % 16 == 0)
      cr_assert_eq(mp_pool_trim(r.pool, 0), MP_OK, "%s", mp_last_error());
  }
  atomic_store(&r.stop, true);
  for (int i = 0; i < CAP_THREADS; i++)
    pthread_join(t[i], NULL);
  cr_expect_eq(atomic_load(&r.bad), 0, "%s", mp_last_error());
  cr_expect_gt(atomic_load(&r.served), 0);
  cr_expect_eq(atomic_load(&r.over), 0,
               "%d reads of the stats above the cap (%zu), the highest %zu",
               atomic_load(&r.over), (size_t)CAP_BYTES, r.worst);
  cr_expect_leq(stats(r.pool).reserved_bytes, CAP_BYTES);
  check(r.pool);
  cr_assert_eq(mp_stream_synchronize(dev, r.s[0]), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, r.s[1]), MP_OK);
  cr_assert_eq(mp_pool_destroy(r.pool), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, r.s[0]), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, r.s[1]), MP_OK);
}

/* ---- making an arena while a stream is forgotten ------------------------ */
/* mp_stream_forget holds the device's watcher list while it takes each
 * pool's lock; making an arena adds the arena to that list. */
#define FILLERS 200

typedef struct forgetter {
  mp_device_t *dev;
  mp_stream_t s;
  atomic_bool stop;
} forgetter_t;

static void *forget_job(void *arg) {
  forgetter_t *f = arg;
  /* A pause between forgets: the list is free most of the time. */
  while (!atomic_load(&f->stop)) {
    (void)mp_stream_forget(f->dev, f->s);
    usleep(50);
  }
  return NULL;
}

typedef struct maker {
  mp_pool_t *pool;
  atomic_int done;
  atomic_int failures;
} maker_t;

static void *make_arena_job(void *arg) {
  maker_t *m = arg;
  void *p;
  if (mp_pool_alloc(m->pool, 4096, NULL, &p) != MP_OK ||
      mp_pool_free(m->pool, p) != MP_OK)
    atomic_fetch_add(&m->failures, 1);
  atomic_fetch_add(&m->done, 1);
  return NULL;
}

Test(pool_arenas, making_arenas_while_streams_are_forgotten_does_not_deadlock,
     .timeout = 60) {
  /* Pools made before the arenas' pool come first in the watcher list, so
   * that a forget spends its time there, before the pool's lock. */
  mp_pool_t *fillers[FILLERS];
  for (int i = 0; i < FILLERS; i++)
    fillers[i] = make_pool(dev, NULL);
  maker_t m = {.pool = make_pool(dev, "arenas=64")};
  forgetter_t f = {.dev = dev};
  cr_assert_eq(mp_stream_create(dev, &f.s), MP_OK, "%s", mp_last_error());
  pthread_t ft, t[64];
  cr_assert_eq(pthread_create(&ft, NULL, forget_job, &f), 0);
  for (int i = 0; i < 64; i++) {
    cr_assert_eq(pthread_create(&t[i], NULL, make_arena_job, &m), 0);
    pthread_detach(t[i]);
  }
  /* Deadlocked threads never finish: wait a while (45 s, inside the
   * test's timeout), not forever. */
  for (int ms = 0; ms < 45000 && atomic_load(&m.done) < 64; ms++)
    usleep(1000);
  cr_assert_eq(atomic_load(&m.done), 64,
               "%d of 64 threads making arenas still blocked after 45 s",
               64 - atomic_load(&m.done));
  atomic_store(&f.stop, true);
  pthread_join(ft, NULL);
  cr_expect_eq(atomic_load(&m.failures), 0, "%s", mp_last_error());
  check(m.pool);
  cr_assert_eq(mp_pool_destroy(m.pool), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, f.s), MP_OK);
  for (int i = 0; i < FILLERS; i++)
    cr_assert_eq(mp_pool_destroy(fillers[i]), MP_OK);
}

/* ---- host functions calling the pool beside a synchronization ---------- */
/* A host function on stream s (the host device runs it on s's worker
 * thread, as cuLaunchHostFunc runs it) calls into the pool while another
 * thread's trim or out-of-memory reclaim waits for s: the waiter must not
 * hold a lock the host function needs, or neither ever returns. The
 * worker thread is new to arenas, so its allocation makes an arena. Each
 * case has a private device: a deadlocked one is left behind (its threads
 * never return), and the watchdog fails the test after 10 s instead of
 * hanging. */
typedef struct hostcall {
  mp_pool_t *pool;
  size_t waited; /* the arena that caches the block freed on s */
  /* Whether the other thread waits for s now (arena_syncing(pool, waited):
   * waited's synchronization). */
  bool (*waiting)(mp_pool_t *pool, size_t waited);
  bool saw_wait; /* the host function saw it waiting */
  atomic_bool running, done;
  mp_status_t st;
  void *p;
} hostcall_t;

/* Whether arena i's synchronization is in flight (its lock is down
 * meanwhile). */
static bool arena_syncing(mp_pool_t *pool, size_t i) {
  mp_pool_t *a = mp__arena_at(pool, i);
  mp__pool_lock(a);
  bool s = a->syncing;
  mp__pool_unlock(a);
  return s;
}

static void alloc_from_host_fn(void *arg) {
  hostcall_t *h = arg;
  atomic_store(&h->running, true);
  /* Until the other thread waits for this stream (at most 30 s). */
  for (int i = 0; i < 30000 && !h->waiting(h->pool, h->waited); i++)
    usleep(1000);
  h->saw_wait = h->waiting(h->pool, h->waited);
  h->st = mp_pool_alloc(h->pool, 4096, NULL, &h->p);
  atomic_store(&h->done, true);
}

static void *trim_job(void *arg) {
  (void)mp_pool_trim(arg, 0);
  return NULL;
}

/* Another thread's 48 MiB: out of memory in its arena until the first
 * arena's cache (48 MiB of the device's 64) is trimmed, which waits for
 * s. */
static void *reclaim_job(void *arg) {
  void *p;
  if (mp_pool_alloc(arg, 48 * MiB, NULL, &p) == MP_OK)
    (void)mp_pool_free(arg, p);
  return NULL;
}

/* Runs the host function on a stream the calling thread's arena knows
 * (and caches a block freed on), and fn(pool) on another thread, whose
 * wait for s (waiting says when it is in flight) the host function waits
 * for; the host function's allocation must return within 45 s (it waits
 * 30 s at most for that wait). */
static void host_fn_calls_pool_beside(const char *opts, void *(*fn)(void *),
                                      size_t cached,
                                      bool (*waiting)(mp_pool_t *, size_t)) {
  mp_device_t *d;
  cr_assert_eq(mp_device_open("host:capacity=64M", &d), MP_OK);
  mp_pool_t *pool = make_pool(d, opts);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(d, &s), MP_OK);
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, cached, s, &p), MP_OK, "%s",
               mp_last_error());
  hostcall_t h = {.pool = pool,
                  .waited = (size_t)arena_holding(pool, p),
                  .waiting = waiting};
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_stream_launch_host(d, s, alloc_from_host_fn, &h), MP_OK);
  while (!atomic_load(&h.running))
    sched_yield();
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, fn, pool), 0);
  for (int i = 0; i < 4500 && !atomic_load(&h.done); i++)
    usleep(10000);
  cr_assert(atomic_load(&h.done),
            "the host function's allocation is still blocked after 45 s "
            "(deadlock with the other thread's wait for its stream)");
  pthread_join(t, NULL);
  cr_expect(h.saw_wait, "the other thread never waited for s");
  cr_expect(h.st == MP_OK || h.st == MP_EINVAL, "%s: %s", mp_status_name(h.st),
            mp_last_error());
  if (h.st == MP_OK)
    cr_expect_eq(mp_pool_free(pool, h.p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_synchronize(d, s), MP_OK);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  cr_assert_eq(mp_stream_destroy(d, s), MP_OK);
  mp_device_close(d);
}

Test(pool_arenas,
     host_function_allocating_beside_an_arena_trim_does_not_deadlock,
     .timeout = 60) {
  host_fn_calls_pool_beside("arenas=2", trim_job, 8 * MiB, arena_syncing);
}

/* Three arenas: the main thread's, the reclaiming thread's and the host
 * function's (made then). */
Test(pool_arenas,
     host_function_allocating_beside_an_arena_reclaim_does_not_deadlock,
     .timeout = 60) {
  host_fn_calls_pool_beside("arenas=3", reclaim_job, 48 * MiB, arena_syncing);
}

/* The arena's own retry: a thread that shares the first arena (as a
 * thread numbered N later would) asks for 60 MiB under a 64 MiB cap. Its
 * share is too small at once (no synchronization yet); the full reclaim
 * gives it the whole cap and retries, and that retry's ladder waits for s
 * (the 8 MiB cached there): without the pool's lock, or the host
 * function's new arena never gets it. */
static void *same_arena_reclaim_job(void *arg) {
  mp_pool_t *pool = arg;
  for (size_t i = 0; i < pool->cfg.arenas; i++)
    if (mp__arena_at(pool, i) != NULL)
      mp__arena_thread = (unsigned)i + 1;
  void *p;
  if (mp_pool_alloc(pool, 60 * MiB, NULL, &p) == MP_OK)
    (void)mp_pool_free(pool, p);
  return NULL;
}

Test(pool_arenas,
     host_function_allocating_beside_an_arenas_own_retry_does_not_deadlock,
     .timeout = 60) {
  host_fn_calls_pool_beside("arenas=2,max_bytes=64M", same_arena_reclaim_job,
                            8 * MiB, arena_syncing);
}

/* A release beside a share of the cap: another thread's free gives its
 * arena's 8 MiB back (release_threshold), and the host device synchronizes
 * before memory goes (as cuMemFree does: plain segments), so the release
 * waits for s. The
 * host function's new arena asks for a share meanwhile: the share must
 * not wait for that release. Three arenas: the main thread's, the freeing
 * thread's and the host function's. */
static atomic_bool release_begun;

static void *release_job(void *arg) {
  mp_pool_t *pool = arg;
  void *p, *q;
  /* Both fill plain segments of their own: the first free leaves nothing
   * above the threshold to release (and no later try put off). */
  if (mp_pool_alloc(pool, 8 * MiB, NULL, &p) != MP_OK)
    return NULL;
  if (mp_pool_alloc(pool, 2 * MiB, NULL, &q) == MP_OK) {
    (void)mp_pool_free(pool, p);
    /* The next free releases p's segment (a free releases before its own
     * block joins the cache). */
    atomic_store(&release_begun, true);
    p = q;
  }
  (void)mp_pool_free(pool, p);
  return NULL;
}

/* Whether, once release_job frees, an arena other than skip (SIZE_MAX:
 * none skipped) has a release in flight (its lock is down meanwhile), with
 * a thread waiting for it too where waiters. */
static bool arena_releasing(mp_pool_t *pool, size_t skip, bool waiters) {
  bool r = false;
  for (size_t i = 0; atomic_load(&release_begun) && i < pool->cfg.arenas; i++) {
    mp_pool_t *a = mp__arena_at(pool, i);
    if (i == skip || a == NULL)
      continue;
    mp__pool_lock(a);
    r = r || (a->inflight && (!waiters || a->idle_waiters > 0));
    mp__pool_unlock(a);
  }
  return r;
}

static bool other_arena_releasing(mp_pool_t *pool, size_t waited) {
  return arena_releasing(pool, waited, false);
}

Test(pool_arenas,
     host_function_asking_a_share_beside_an_arena_release_does_not_deadlock,
     .timeout = 60) {
  host_fn_calls_pool_beside(
      "arenas=3,max_bytes=64M,release_threshold=3,virtual=0", release_job,
      8 * MiB, other_arena_releasing);
}

/* ---- reclaim overtaken by another arena's growth ------------------------ */
/* An arena out of device memory trims the other arenas and retries. While
 * it waits for one arena's stream (a gate holds it), an arena it trimmed
 * already grows and frees 30 MiB, which stays in its cache: the retry must
 * still get the memory (nothing is live), not fail beside that cache. The
 * request (48 MiB) is larger than any cached block, so it cannot borrow
 * one instead. */
typedef struct reclaimer {
  mp_pool_t *pool;
  void *p;
  mp_status_t st;
  char why[256];
} reclaimer_t;

static void *reclaim_48m(void *arg) {
  reclaimer_t *r = arg;
  r->st = mp_pool_alloc(r->pool, 48 * MiB, NULL, &r->p);
  snprintf(r->why, sizeof r->why, "%s", mp_last_error());
  return NULL;
}

Test(pool_arenas, reclaim_retries_when_a_trimmed_arena_caches_again_meanwhile,
     .timeout = 60) {
  mp_pool_t *pool = make_pool(dev, "arenas=3");
  /* This thread's arena caches 40 MiB of the device's 64. */
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, 40 * MiB, NULL, &p), MP_OK);
  int ib = arena_holding(pool, p);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  /* A second arena caches a block freed on s, which a gate then holds. */
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  job_t c = {.pool = pool, .bytes = MiB, .s = s, .count = 1};
  on_thread(alloc_job, &c);
  cr_assert_eq(c.st, MP_OK, "%s", mp_last_error());
  int ic = arena_holding(pool, c.ptrs[0]);
  on_thread(free_job, &c);
  /* The reclaim trims the arenas in index order: this thread's first. */
  cr_assert(ib >= 0 && ic > ib, "arenas %d and %d", ib, ic);
  gate_t g;
  gate_init(&g);
  cr_assert_eq(mp_stream_launch_host(dev, s, gate_wait, &g), MP_OK);
  reclaimer_t r = {.pool = pool};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, reclaim_48m, &r), 0);
  /* The third arena's reclaim trimmed this thread's arena and waits for
   * s in the second's trim. */
  for (int i = 0; i < 30000 && !arena_syncing(pool, (size_t)ic); i++)
    usleep(1000);
  bool waiting = arena_syncing(pool, (size_t)ic);
  if (waiting) {
    cr_expect_eq(mp__arena_at(pool, (size_t)ib)->st.reserved_bytes, 0,
                 "the first arena was trimmed");
    cr_expect_eq(mp_pool_alloc(pool, 30 * MiB, NULL, &p), MP_OK, "%s",
                 mp_last_error());
    cr_expect_eq(mp_pool_free(pool, p), MP_OK);
  }
  gate_open(&g);
  pthread_join(t, NULL);
  cr_assert(waiting, "the reclaim never waited for s (%d: %s)", r.st, r.why);
  cr_expect_eq(r.st, MP_OK, "48 MiB with nothing live: %s", r.why);
  if (r.st == MP_OK)
    cr_expect_eq(mp_pool_free(pool, r.p), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
  gate_destroy(&g);
}

/* ---- a share asked for by an arena whose own release is in flight ------- */
/* Two threads share an arena (as a thread numbered N later would): one's
 * free releases a segment, which waits for s (the host device synchronizes
 * before memory goes); the other asks for more than the arena's share, so
 * it takes the pool's lock to be given one. The host function on s then
 * makes an arena, which takes the pool's lock: the share must not wait for
 * its own arena's release while it holds that lock. */
static _Atomic uint64_t share_asked; /* share_seq before the ask, plus 1 */

static void *share_beside_own_release_job(void *arg) {
  mp_pool_t *pool = arg;
  /* Until the other thread's release is in flight (at most 5 s). */
  size_t i = pool->cfg.arenas;
  for (int k = 0; k < 5000 && i == pool->cfg.arenas; k++) {
    for (size_t j = 0; atomic_load(&release_begun) && j < pool->cfg.arenas;
         j++) {
      mp_pool_t *a = mp__arena_at(pool, j);
      if (a == NULL)
        continue;
      mp__pool_lock(a);
      bool r = a->inflight;
      mp__pool_unlock(a);
      if (r)
        i = j;
    }
    if (i == pool->cfg.arenas)
      usleep(1000);
  }
  if (i == pool->cfg.arenas)
    return NULL;
  mp_pool_t *a = mp__arena_at(pool, i);
  mp__arena_thread = (unsigned)i + 1;
  mp__pool_lock(a);
  size_t ask = a->cap + 4 * MiB;
  mp__pool_unlock(a);
  void *p;
  if (ask >= 60 * MiB)
    return NULL;
  atomic_store(&share_asked, atomic_load(&pool->share_seq) + 1);
  if (mp_pool_alloc(pool, ask, NULL, &p) == MP_OK)
    (void)mp_pool_free(pool, p);
  return NULL;
}

static void *release_and_share_job(void *arg) {
  pthread_t r, y;
  atomic_store(&release_begun, false);
  atomic_store(&share_asked, 0);
  if (pthread_create(&r, NULL, release_job, arg) != 0)
    return NULL;
  if (pthread_create(&y, NULL, share_beside_own_release_job, arg) == 0)
    pthread_join(y, NULL);
  pthread_join(r, NULL);
  return NULL;
}

/* An arena releasing once the other thread's share has begun. */
static bool releasing_while_sharing(mp_pool_t *pool, size_t waited) {
  uint64_t asked = atomic_load(&share_asked);
  return asked != 0 && atomic_load(&pool->share_seq) >= asked &&
         other_arena_releasing(pool, waited);
}

Test(pool_arenas,
     host_function_making_an_arena_beside_a_share_for_a_releasing_arena,
     .timeout = 60) {
  host_fn_calls_pool_beside(
      "arenas=3,max_bytes=64M,release_threshold=3,virtual=0",
      release_and_share_job, 8 * MiB, releasing_while_sharing);
}

/* ---- a pool check beside an arena's release ------------------------------ */
/* mp_pool_check on a pool with arenas while one arena's release waits for
 * s (as above); the host function on s makes an arena, which takes the
 * pool's lock: the check must not wait for that release while it holds
 * the pool's lock. The host function goes on once the check waits for the
 * releasing arena. */
static atomic_bool check_asked;
static mp_status_t check_st;

static void *check_beside_release_job(void *arg) {
  mp_pool_t *pool = arg;
  pthread_t r;
  atomic_store(&release_begun, false);
  atomic_store(&check_asked, false);
  if (pthread_create(&r, NULL, release_job, arg) != 0)
    return NULL;
  /* Until the release is in flight (at most 30 s). */
  for (int k = 0; k < 30000 && !arena_releasing(pool, SIZE_MAX, false); k++)
    usleep(1000);
  atomic_store(&check_asked, true);
  check_st = mp_pool_check(pool);
  pthread_join(r, NULL);
  return NULL;
}

/* The check waits for an arena whose release is in flight. */
static bool check_waits_for_release(mp_pool_t *pool, size_t waited) {
  return atomic_load(&check_asked) && arena_releasing(pool, waited, true);
}

Test(pool_arenas, host_function_making_an_arena_beside_a_check_of_the_pool,
     .timeout = 60) {
  check_st = MP_OK;
  host_fn_calls_pool_beside(
      "arenas=3,max_bytes=64M,release_threshold=3,virtual=0",
      check_beside_release_job, 8 * MiB, check_waits_for_release);
  cr_expect_eq(check_st, MP_OK, "%s", mp_last_error());
}

/* ---- per-thread default streams of threads that exit ------------------- */
/* The fake device, with one handle that names a per-thread default stream
 * (a different stream in every thread, as CUDA's CU_STREAM_PER_THREAD). */
#define PT_STREAM ((mp_stream_t)0x70)
static int pt_kind(mp_device_t *d, mp_stream_t s) {
  (void)d;
  return s == PT_STREAM ? MP__STREAM_PER_THREAD : MP__STREAM_SHARED;
}

typedef struct pt_job {
  mp_pool_t *pool;  /* allocates and frees a block on its PT_STREAM */
  mp_pool_t *added; /* then gives its PT_STREAM to add_stream, if any */
  gate_t ready, leave;
  mp_status_t st;
} pt_job_t;

static void *pt_use_then_exit(void *arg) {
  pt_job_t *j = arg;
  void *b;
  j->st = mp_pool_alloc(j->pool, 4096, PT_STREAM, &b);
  if (j->st == MP_OK)
    j->st = mp_pool_free(j->pool, b);
  if (j->st == MP_OK && j->added != NULL)
    j->st = mp_pool_add_stream(j->added, PT_STREAM);
  gate_open(&j->ready);
  gate_wait(&j->leave);
  return NULL;
}

static void pt_start(pthread_t *t, pt_job_t *j) {
  gate_init(&j->ready);
  gate_init(&j->leave);
  cr_assert_eq(pthread_create(t, NULL, pt_use_then_exit, j), 0);
  gate_wait(&j->ready);
  cr_assert_eq(j->st, MP_OK, "%s", mp_last_error());
}

/* Per-thread slots still live in pool's arenas. */
static unsigned arena_pt_slots(mp_pool_t *pool) {
  unsigned n = 0;
  for (size_t i = 0; i < pool->cfg.arenas; i++) {
    mp_pool_t *a = mp__arena_at(pool, i);
    if (a == NULL)
      continue;
    mp__pool_lock(a);
    for (uint32_t k = 0; k < a->nstreams; k++)
      n += a->streams[k].owner != 0 && !a->streams[k].gone;
    mp__pool_unlock(a);
  }
  return n;
}

/* A thread's per-thread slot goes when the thread exits, from every pool,
 * arenas made while another thread exits included. Thread X uses PT_STREAM
 * in p0, then gives it to the arenas' pool (add_stream: arenas made later
 * get X's slot), and exits; its exit takes the registry of such pools, then
 * each pool's lock, and waits here for p0's, which the test holds.
 * Meanwhile thread Y allocates on its own PT_STREAM from the arenas' pool:
 * the new arena copies X's slot (X has not reached the arenas' pool yet)
 * and gets Y's own. Its registration used to give up while X held the
 * registry (a trylock: the order is the registry, then a pool's lock), and
 * no later one came (an arena serves one thread): both slots stayed for
 * good, each an open epoch only its gone owner could close, so that every
 * synchronization of the arena fell back to a device synchronize. */
Test(pool_arenas,
     per_thread_slots_go_with_their_threads_from_arenas_made_meanwhile,
     .timeout = 20) {
  static mp__backend_t ops;
  ops = fake_backend;
  ops.stream_kind = pt_kind;
  mp_device_t *d = fake_open((size_t)1 << 30, 0);
  d->ops = &ops;
  mp_pool_t *p0 = make_pool(d, NULL);
  mp_pool_t *pool = make_pool(d, "arenas=2");
  pthread_t tx, ty;
  pt_job_t x = {.pool = p0, .added = pool}, y = {.pool = NULL};
  pt_start(&tx, &x);
  mp__pool_lock(p0);
  gate_open(&x.leave);
  /* X's exit waits for p0's lock (counted among its sleepers). */
  while (atomic_load(&p0->lock) < MP__LOCK_SLEEPER)
    usleep(100);
  y.pool = pool;
  pt_start(&ty, &y);
  cr_expect_eq(arena_pt_slots(pool), 2, "X's slot, copied, and Y's own");
  mp__pool_unlock(p0);
  pthread_join(tx, NULL);
  gate_open(&y.leave);
  pthread_join(ty, NULL);
  cr_expect_eq(arena_pt_slots(pool), 0,
               "per-thread slots of exited threads stayed in the arena");
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  cr_assert_eq(mp_pool_destroy(p0), MP_OK);
  fake_close(d);
  gate_destroy(&x.ready);
  gate_destroy(&x.leave);
  gate_destroy(&y.ready);
  gate_destroy(&y.leave);
}
