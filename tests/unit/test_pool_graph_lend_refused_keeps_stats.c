/* test_pool_graph_lend_refused_keeps_stats.c - a graph pool's growth on a
 * pool with arenas borrows a range that an arena makes live, then lends
 * it (graph.c, mp__graph_lend, the arena's claim), which needs host
 * memory once the arena's list of lent ranges is full. Refused there, the
 * range goes back to the arena, and the refusal changes nothing: the
 * parent's counters are as they were before the call, as after any
 * refused allocation. White-box: fault.c fails the n-th host allocation,
 * for each n until the allocation succeeds, so the lend's own refusal is
 * among those tried; the list's first size is 8 (graph.c,
 * mp__graph_room). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "internal.h"
#include "pool/pool_internal.h"

#define MiB   ((size_t)1 << 20)
#define BIG   (16 * MiB) /* more than a range left free: a range each */
#define NLENT 8

MP_DEVICE_SUITE(pool_graph_lend_refused_keeps_stats, "host:capacity=512M");

/* The counters a refused call must leave as they were. */
static void expect_same(const mp_stats_t *a, const mp_stats_t *b, long n,
                        const char *why) {
#define SAME(f)                                                                \
  cr_expect_eq(a->f, b->f, "host failure %ld (%s): " #f " %zu, was %zu", n,    \
               why, (size_t)b->f, (size_t)a->f)
  SAME(allocated_bytes);
  SAME(requested_bytes);
  SAME(peak_allocated_bytes);
  SAME(peak_requested_bytes);
  SAME(alloc_count);
  SAME(free_count);
  SAME(live_blocks);
  SAME(oom_count);
#undef SAME
}

/* The ranges the arenas of pool lend, and the room of the fullest list. */
static size_t ranges_lent(mp_pool_t *pool, size_t *room) {
  size_t n = 0;
  *room = SIZE_MAX;
  for (size_t i = 0; i < pool->cfg.arenas; i++) {
    mp_pool_t *a = mp__arena_at(pool, i);
    if (a == NULL)
      continue;
    mp__pool_lock(a);
    n += a->ngranges;
    if (a->ngranges > 0 && a->granges_cap - a->ngranges < *room)
      *room = a->granges_cap - a->ngranges;
    mp__pool_unlock(a);
  }
  return n;
}

Test(pool_graph_lend_refused_keeps_stats, a_refused_lend_changes_nothing) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, g, s), MP_OK, "%s", mp_last_error());
  /* The calling thread's arena lends NLENT ranges: its list is full. */
  void *live[NLENT];
  for (int i = 0; i < NLENT; i++)
    cr_assert_eq(mp_pool_alloc(pool, BIG, s, &live[i]), MP_OK, "%s",
                 mp_last_error());
  size_t room;
  cr_assert_eq(ranges_lent(pool, &room), NLENT);
  cr_assert_eq(room, 0, "the list has room for %zu more", room);
  mp_stats_t before = stats(pool);
  bool lend_refused = false;
  void *p = NULL;
  mp_status_t st = MP_ENOMEM;
  for (long n = 0; n < 64; n++) {
    mp__fault_host_after(n);
    st = mp_pool_alloc(pool, BIG, s, &p);
    mp__fault_host_after(-1);
    if (st == MP_OK)
      break;
    char why[512];
    snprintf(why, sizeof why, "%s", mp_last_error());
    cr_expect_eq(st, MP_ENOMEM, "host failure %ld: %s: %s", n,
                 mp_status_name(st), why);
    if (strstr(why, "graph ranges") != NULL)
      lend_refused = true;
    mp_stats_t now = stats(pool);
    expect_same(&before, &now, n, why);
    cr_expect_eq(ranges_lent(pool, &room), NLENT);
  }
  cr_assert_eq(st, MP_OK, "never served: %s", mp_last_error());
  cr_expect(lend_refused, "no try was refused for the lent ranges' list");
  cr_assert_eq(mp_pool_free(pool, p), MP_OK, "%s", mp_last_error());
  for (int i = 0; i < NLENT; i++)
    cr_assert_eq(mp_pool_free(pool, live[i]), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_end(pool, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
}
