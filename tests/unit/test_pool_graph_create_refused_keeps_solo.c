/* test_pool_graph_create_refused_keeps_solo.c - arenas_auto=1 (arena.c,
 * "Solo"): a graph pool ends solo for good, as a stream it routes must
 * reach the arenas' path; a mp_pool_graph_create that is refused (the
 * parent paused) makes no graph pool and changes nothing, so the pool
 * stays solo. White-box: it reads which pool the hot path works on.
 * Failed before: the refused create had ended solo already (a performance
 * loss for the rest of the pool's life). */
#include <criterion/criterion.h>
#include <stdatomic.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"

MP_DEVICE_SUITE(pool_graph_create_refused_keeps_solo, "host:capacity=64M");

/* Solo: every thread on the first arena's plain path. */
static bool solo(mp_pool_t *pool) {
  mp_pool_t *hot = mp__pool_hot(pool);
  return hot != pool && atomic_load(&hot->solo_of) == pool;
}

Test(pool_graph_create_refused_keeps_solo, a_paused_parent_stays_solo) {
  mp_pool_t *pool = make_pool(dev, "arenas=2,arenas_auto=1");
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, &p), MP_OK, "%s",
               mp_last_error());
  cr_assert(solo(pool), "the first allocation did not start solo");
  cr_assert_eq(mp_pool_pause(pool, 0), MP_OK, "%s", mp_last_error());
  mp_pool_t *g = NULL;
  cr_expect_eq(mp_pool_graph_create(pool, &g), MP_EBUSY, "%s", mp_last_error());
  cr_expect_null(g);
  cr_assert_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  cr_expect(solo(pool), "a refused mp_pool_graph_create ended solo");
  cr_assert_eq(mp_pool_free(pool, p), MP_OK, "%s", mp_last_error());
  cr_expect(solo(pool), "solo ended at a free after the refused create");
  /* One made does end it. */
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  cr_expect(!solo(pool), "a graph pool made left the pool solo");
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}
