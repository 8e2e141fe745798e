/* test_pool_oom_retry.c - the out-of-memory handler's retry (core.c's
 * mp__pool_oom_retry, arena.c's path) seen from the inside: what one
 * allocation leaves in the history, the name a refusal meets after the
 * handler, and the pool after a retry that fails, for every kind of
 * allocation (mp_pool_alloc, mp_pool_alloc_contiguous, mp_pool_create_child),
 * with arenas or without. White-box: it reads the history rings. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "../support/oom_kinds.h"
#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_oom_retry, "host:capacity=64M");

/* The oom events in p's history, or its arenas'. */
static size_t oom_events(const mp_pool_t *p) {
  size_t n = 0;
  size_t rings = p->arenas != NULL ? p->cfg.arenas : 1;
  for (size_t i = 0; i < rings; i++) {
    const mp_pool_t *x = p->arenas != NULL ? mp__arena_at(p, i) : p;
    if (x == NULL || x->hist.ev == NULL)
      continue;
    uint64_t kept = x->hist.total < x->hist.cap ? x->hist.total : x->hist.cap;
    for (uint64_t e = 0; e < kept; e++)
      n += x->hist.ev[e].action == MP__H_OOM;
  }
  return n;
}

/* A pool of configuration c with an event history, its handler x's. */
static mp_pool_t *history_pool(size_t c, mp_pool_oom_handler_t fn, void *x,
                               void **cache) {
  char opts[64];
  snprintf(opts, sizeof opts, "%s,history=1000", configs[c]);
  mp_pool_t *p = make_pool(dev, opts);
  cr_assert_eq(mp_pool_alloc(p, 40 * MiB, NULL, cache), MP_OK);
  cr_assert_eq(mp_pool_set_oom_handler(p, fn, x), MP_OK);
  return p;
}

/* The history has one oom event for an allocation that fails, none for one
 * the handler's retry serves, with arenas as without. */
Test(pool_oom_retry, one_oom_event_per_failed_allocation) {
  for (size_t c = 0; c < sizeof configs / sizeof *configs; c++)
    for (kind_t k = PIECES; k <= ALLOC; k++) {
      const char *opts = configs[c];
      engine_t e = {.answer = 1};
      mp_pool_t *p = history_pool(c, drop_cache, &e, &e.cache);
      asked_t a = {0};
      cr_assert_eq(ask(p, k, 48 * MiB, &a), MP_OK, "%s, %s: %s", opts,
                   kind_name(k), mp_last_error());
      cr_expect_eq(e.calls, 1);
      cr_expect_eq(oom_events(p), 0, "%s, %s: served", opts, kind_name(k));
      asked_t b = {0};
      cr_expect_eq(ask(p, k, 32 * MiB, &b), MP_ENOMEM, "%s, %s", opts,
                   kind_name(k));
      cr_expect_eq(e.calls, 2);
      cr_expect_eq(oom_events(p), 1, "%s, %s: failed", opts, kind_name(k));
      cr_expect_eq(stats(p).oom_count, 1, "%s, %s", opts, kind_name(k));
      give_back(p, k, &a);
      check(p);
      cr_assert_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
    }
}

/* The oom event the handler's retry takes back leaves the ring as it was,
 * the oldest event it overwrote (and that event's stack) back in place. */
Test(pool_oom_retry, taking_an_event_back_gives_its_slot_back) {
  mp_pool_t *p = make_pool(dev, "history=2,history_stacks=1");
  mp__pool_lock(p);
  mp__history_record(p, MP__H_ALLOC, 0x1000, 1, 0);
  mp__history_record(p, MP__H_ALLOC, 0x2000, 2, 0);
  mp__hevent_t ev[2] = {p->hist.ev[0], p->hist.ev[1]};
  void *frames[2 * MP__HIST_FRAMES];
  memcpy(frames, p->hist.frames, sizeof frames);
  uint64_t total = p->hist.total;
  size_t next = p->hist.next;
  mp__hkept_t kept;
  mp__history_save_next(p, &kept);
  mp__history_record(p, MP__H_OOM, 0, 3, 0);
  cr_expect_eq(p->hist.ev[next].action, MP__H_OOM);
  mp__history_take_back(p, &kept);
  cr_expect_eq(p->hist.total, total);
  cr_expect_eq(p->hist.next, next);
  cr_expect_eq(memcmp(p->hist.ev, ev, sizeof ev), 0);
  cr_expect_eq(memcmp(p->hist.frames, frames, sizeof frames), 0);
  mp__pool_unlock(p);
  cr_assert_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
}

/* Host memory running out at each point in turn of an allocation whose
 * handler frees its cache and asks for the retry (the first try's block
 * records kept for the second, the live map's room asked twice): each
 * failure leaves the pool consistent, nothing taken, nothing leaked (ASan
 * builds). */
Test(pool_oom_retry, host_faults_at_each_point_of_a_retried_allocation) {
  for (size_t c = 0; c < sizeof configs / sizeof *configs; c++)
    for (kind_t k = PIECES; k <= ALLOC; k++)
      for (long n = 0;; n++) {
        mp_pool_t *p = make_pool(dev, configs[c]);
        engine_t e = {.answer = 1};
        cr_assert_eq(mp_pool_alloc(p, 40 * MiB, NULL, &e.cache), MP_OK);
        cr_assert_eq(mp_pool_set_oom_handler(p, drop_cache, &e), MP_OK);
        asked_t a = {0};
        mp__fault_host_after(n);
        mp_status_t st = ask(p, k, 48 * MiB, &a);
        bool fired = !mp__fault_host_pending();
        mp__fault_host_after(-1);
        cr_expect(st == MP_OK || st == MP_ENOMEM, "%s, %s, fault %ld: %s",
                  configs[c], kind_name(k), n, mp_last_error());
        if (st == MP_OK)
          give_back(p, k, &a);
        if (e.cache != NULL)
          cr_assert_eq(mp_pool_free(p, e.cache), MP_OK);
        check(p);
        mp_stats_t s = stats(p);
        cr_expect_eq(s.live_blocks, 0, "%s, %s, fault %ld", configs[c],
                     kind_name(k), n);
        cr_expect_eq(s.allocated_bytes, 0, "%s, %s, fault %ld", configs[c],
                     kind_name(k), n);
        cr_assert_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
        if (!fired)
          break;
      }
}

/* The handler allocates from the pool itself, and that allocation fails
 * too (no handler is called for it: one runs on this thread): the
 * allocation the handler served counts nothing, the handler's failed one
 * counts once, in oom_count and the history, with arenas as without. */
typedef struct nested {
  engine_t e;
  int depth;
} nested_t;

static int allocating_handler(mp_pool_t *pool, size_t bytes, mp_status_t status,
                              void *ctx) {
  nested_t *x = ctx;
  if (x->depth > 0) {
    x->e.calls++;
    return 0;
  }
  x->depth++;
  void *pieces[2];
  size_t sizes[2] = {32 * MiB, 32 * MiB};
  cr_expect_eq(mp_pool_alloc_contiguous(pool, 2, sizes, NULL, pieces),
               MP_ENOMEM);
  x->depth--;
  return drop_cache(pool, bytes, status, &x->e);
}

Test(pool_oom_retry, a_handler_allocating_from_its_pool_counts_its_failure) {
  for (size_t c = 0; c < sizeof configs / sizeof *configs; c++)
    for (kind_t k = PIECES; k <= ALLOC; k++) {
      const char *opts = configs[c];
      nested_t x = {.e = {.answer = 1}};
      mp_pool_t *p = history_pool(c, allocating_handler, &x, &x.e.cache);
      asked_t a = {0};
      cr_assert_eq(ask(p, k, 48 * MiB, &a), MP_OK, "%s, %s: %s", opts,
                   kind_name(k), mp_last_error());
      cr_expect_eq(x.e.calls, 1, "%s, %s", opts, kind_name(k));
      cr_expect_eq(stats(p).oom_count, 1, "%s, %s", opts, kind_name(k));
      cr_expect_eq(oom_events(p), 1, "%s, %s", opts, kind_name(k));
      give_back(p, k, &a);
      check(p);
      cr_assert_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
    }
}

/* A graph pool's allocation the parent cannot serve counts once in the
 * parent's oom_count and leaves one oom event in its history, however
 * often the graph pool's ladder borrows (a range with free bytes left
 * makes its second growth rung run): without a handler, with one that
 * frees nothing, with one whose retry fails too, with arenas as without.
 * Each borrow counted before: 2 for one failed allocation. */
Test(pool_oom_retry, a_failed_graph_pool_allocation_counts_once_in_its_parent) {
  for (size_t c = 0; c < sizeof configs / sizeof *configs; c++)
    for (int answer = -1; answer < 2; answer++) {
      const char *opts = configs[c];
      engine_t e = {.answer = answer};
      void *held;
      mp_pool_t *p = history_pool(c, drop_cache, &e, &held);
      if (answer < 0)
        cr_assert_eq(mp_pool_set_oom_handler(p, NULL, NULL), MP_OK);
      mp_pool_t *g;
      cr_assert_eq(mp_pool_graph_create(p, &g), MP_OK, "%s", mp_last_error());
      void *small, *x;
      cr_assert_eq(mp_pool_alloc(g, MiB, NULL, &small), MP_OK, "%s",
                   mp_last_error());
      cr_assert_gt(stats(g).reserved_bytes, MiB);
      for (int n = 1; n <= 2; n++) {
        cr_expect_eq(mp_pool_alloc(g, 40 * MiB, NULL, &x), MP_ENOMEM,
                     "%s, answer %d", opts, answer);
        cr_expect_eq(stats(p).oom_count, n, "%s, answer %d: %llu after %d",
                     opts, answer, (unsigned long long)stats(p).oom_count, n);
        cr_expect_eq(oom_events(p), n, "%s, answer %d: %zu events after %d",
                     opts, answer, oom_events(p), n);
        cr_expect_eq(stats(g).oom_count, n, "%s, answer %d", opts, answer);
      }
      cr_assert_eq(mp_pool_free(g, small), MP_OK, "%s", mp_last_error());
      cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
      cr_assert_eq(mp_pool_free(p, held), MP_OK, "%s", mp_last_error());
      check(p);
      cr_assert_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
    }
}
