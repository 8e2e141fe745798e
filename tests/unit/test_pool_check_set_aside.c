/* mp_pool_check while the preload shim has a capturing stream's slots set
 * aside around its real cuStreamDestroy (mp__stream_set_aside, stream.c):
 * another thread's check in that window sees a consistent pool, before and
 * after the slots are given back or dropped. A pool with arenas keeps a
 * slot that only carries the capture's mark (mark_only), which the set
 * aside leaves marked but matched by no handle. White-box: it calls the
 * shim's set-aside entry points itself. */
#include <criterion/criterion.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"

MP_DEVICE_SUITE(pool_check_set_aside, "host:capacity=64M");

/* The parent's slot for s carries only the capture's mark. */
static bool marked_only(mp_pool_t *pool, mp_stream_t s) {
  mp__pool_lock(pool);
  bool found = false;
  for (uint32_t k = 0; k < pool->nstreams; k++)
    if (pool->streams[k].s == s && pool->streams[k].mark_only)
      found = true;
  mp__pool_unlock(pool);
  return found;
}

static void check_ok(mp_pool_t *pool, const char *when) {
  cr_assert_eq(mp_pool_check(pool), MP_OK, "%s: %s", when, mp_last_error());
}

static void run(bool destroyed) {
  mp_pool_t *pool = make_pool(dev, "arenas=2"), *graph = NULL;
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_create(pool, &graph), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, graph, s), MP_OK, "%s",
               mp_last_error());
  cr_assert(marked_only(pool, s), "the test needs a mark-only slot");
  check_ok(pool, "before the set-aside");
  mp__stream_set_aside(dev, s);
  check_ok(pool, "while the slot is set aside");
  mp__stream_set_aside_end(dev, s, destroyed, false);
  check_ok(pool, destroyed ? "after the drop" : "after the slot came back");
  if (!destroyed)
    cr_assert_eq(mp_pool_graph_end(pool, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(graph), MP_OK, "%s", mp_last_error());
  check_ok(pool, "after the release");
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
}

Test(pool_check_set_aside, a_set_aside_slot_given_back_passes_the_check) {
  run(false);
}

Test(pool_check_set_aside, a_set_aside_slot_dropped_passes_the_check) {
  run(true);
}
