/* The parent's out-of-memory handler, asked for a range a graph pool
 * borrows, releases that graph pool and asks for the retry: the retry
 * takes no new range of the parent for a graph that is gone (pool.h: an
 * allocation on a released graph pool is MP_EINVAL), as the graph pool's
 * own handler's retry is refused (test_pool_graph.c). The allocation is
 * refused naming the release, the parent keeps nothing more allocated, and
 * the live block still frees, taking the pool with it. With arenas or
 * without. Before, the retry borrowed a range and the released pool handed
 * out a new block in it. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

typedef struct {
  mp_pool_t *graph;
  void *y; /* freed by free_and_release */
  unsigned calls;
} ctx_t;

static int release_and_lift(mp_pool_t *pool, size_t bytes, mp_status_t st,
                            void *arg) {
  (void)bytes;
  (void)st;
  ctx_t *c = arg;
  c->calls++;
  cr_expect_eq(mp_pool_graph_release(c->graph), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_set_max_fraction(pool, 1.0), MP_OK, "%s",
               mp_last_error());
  return 1;
}

/* A handler that frees a block of the graph pool, releases the pool and
 * asks no retry: the graph pool's ladder went on and found the freed
 * block, so the released pool handed it out again. */
static int free_and_release(mp_pool_t *pool, size_t bytes, mp_status_t st,
                            void *arg) {
  (void)pool, (void)bytes, (void)st;
  ctx_t *c = arg;
  c->calls++;
  cr_expect_eq(mp_pool_free(c->graph, c->y), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_graph_release(c->graph), MP_OK, "%s", mp_last_error());
  return 0;
}

/* With no_retry the graph pool also holds a 16 MiB block y, which the
 * handler frees (free_and_release), else release_and_lift. */
static void run(const char *opts, bool no_retry) {
  mp_device_t *dev = fake_open(GiB, 0);
  mp_pool_t *parent = make_pool(dev, opts);
  ctx_t c = {0};
  cr_assert_eq(mp_pool_graph_create(parent, &c.graph), MP_OK, "%s",
               mp_last_error());
  void *x, *more = NULL;
  cr_assert_eq(mp_pool_alloc(c.graph, MiB, NULL, &x), MP_OK, "%s",
               mp_last_error());
  if (no_retry)
    cr_assert_eq(mp_pool_alloc(c.graph, 16 * MiB, NULL, &c.y), MP_OK, "%s",
                 mp_last_error());
  cr_assert_eq(mp_pool_set_oom_handler(
                   parent, no_retry ? free_and_release : release_and_lift, &c),
               MP_OK);
  mp_stats_t before = stats(parent);
  mp_status_t st = mp_pool_alloc(c.graph, 16 * MiB, NULL, &more);
  cr_expect_eq(c.calls, 1, "%s", opts);
  cr_expect_eq(st, MP_EINVAL, "%s: a block of a released graph pool: %p", opts,
               more);
  cr_expect(strstr(mp_last_error(), "released") != NULL, "%s", mp_last_error());
  if (!no_retry)
    cr_expect_eq(stats(parent).allocated_bytes, before.allocated_bytes,
                 "%s: a range lent to a graph that is gone", opts);
  if (st == MP_OK)
    cr_expect_eq(mp_pool_free(c.graph, more), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(c.graph, x), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(parent).allocated_bytes, 0, "the pool went with x");
  cr_assert_eq(mp_pool_check(parent), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_destroy(parent), MP_OK, "%s", mp_last_error());
  fake_close(dev);
}

Test(pool_graph_parent_handler_release, without_arenas) {
  run("max_bytes=8M", false);
}

Test(pool_graph_parent_handler_release, with_arenas) {
  run("arenas=2,max_bytes=8M", false);
}

Test(pool_graph_parent_handler_release, no_retry_without_arenas) {
  run("max_bytes=24M", true);
}

Test(pool_graph_parent_handler_release, no_retry_with_arenas) {
  run("arenas=2,max_bytes=24M", true);
}
