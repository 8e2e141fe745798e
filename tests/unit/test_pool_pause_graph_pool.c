/* test_pool_pause_graph_pool.c - mp_pool_pause of a graph pool is
 * MP_ENOTSUP, as of a child pool, and its message says what a graph pool
 * is: ranges borrowed from its parent, which pauses only once the graph
 * pool is gone. It called the graph pool a child pool, a kind the caller
 * never made, and sent them to pause the parent, which is MP_EBUSY while
 * the graph pool lives; that refusal (without arenas) named "1 child
 * pools" only. Nothing changes: the graph pool still serves. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_pause_graph_pool, "host:capacity=64M");

static void graph_pool_pause_says_graph(const char *opts) {
  mp_pool_t *pool = make_pool(dev, opts);
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_pause(g, MP_PAUSE_KEEP_CONTENT), MP_ENOTSUP);
  cr_expect_neq(strstr(mp_last_error(), "graph pool"), NULL, "%s: %s", opts,
                mp_last_error());
  cr_expect_eq(strstr(mp_last_error(), "child pool"), NULL, "%s: %s", opts,
               mp_last_error());
  cr_expect_eq(mp_pool_resume(g), MP_EINVAL, "%s", opts);
  /* The parent, as the message says, while the graph pool lives: busy,
   * and saying a graph pool may be why. */
  cr_expect_eq(mp_pool_pause(pool, 0), MP_EBUSY, "%s", opts);
  cr_expect_neq(strstr(mp_last_error(), "graph pool live"), NULL, "%s: %s",
                opts, mp_last_error());
  void *p;
  cr_expect_eq(mp_pool_alloc(g, MiB, NULL, &p), MP_OK, "%s: %s", opts,
               mp_last_error());
  cr_expect_eq(mp_pool_free(g, p), MP_OK);
  check(g);
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_pause(pool, 0), MP_OK, "%s: %s", opts, mp_last_error());
  cr_expect_eq(mp_pool_resume(pool), MP_OK, "%s: %s", opts, mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

Test(pool_pause_graph_pool, is_enotsup_and_says_graph_pool) {
  graph_pool_pause_says_graph("arenas=0");
  graph_pool_pause_says_graph("arenas=2");
}

Test(pool_pause_graph_pool, a_child_pool_is_still_called_a_child) {
  mp_pool_t *pool = make_pool(dev, NULL);
  mp_pool_t *c;
  cr_assert_eq(mp_pool_create_child(pool, 8 * MiB, &c), MP_OK);
  cr_expect_eq(mp_pool_pause(c, 0), MP_ENOTSUP);
  cr_expect_neq(strstr(mp_last_error(), "child pool"), NULL, "%s",
                mp_last_error());
  cr_assert_eq(mp_pool_destroy(c), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}
