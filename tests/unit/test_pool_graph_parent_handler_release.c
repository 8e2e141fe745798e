/* The parent's out-of-memory handler, asked for a range a graph pool
 * borrows, releases that graph pool and asks for the retry: the retry
 * takes no new range of the parent for a graph that is gone (pool.h: an
 * allocation on a released graph pool is MP_EINVAL), as the graph pool's
 * own handler's retry is refused (test_pool_graph.c). The allocation is
 * refused naming the release, the parent keeps nothing more allocated, and
 * the live block still frees, taking the pool with it. With arenas or
 * without. Before, the retry borrowed a range and the released pool handed
 * out a new block in it.
 *
 * The same when the handler waits for another thread that releases the
 * graph pool (mp_pool_graph_release, or mp_pool_destroy of the graph
 * pool), and frees a block of it first where no retry is asked: before,
 * only a release made on the growing thread was seen, and the released
 * pool handed out a block (a new range, or the freed block). */
#include <criterion/criterion.h>
#include <pthread.h>
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
  bool other_thread; /* the release is another thread's, waited for */
  bool destroy;      /* mp_pool_destroy of the graph pool, not its release */
  void *(*release)(void *); /* the release, run there */
  mp_status_t st[2];        /* its free and release */
} ctx_t;

/* Releases the graph pool (mp_pool_graph_release, or mp_pool_destroy). */
static mp_status_t release_graph(ctx_t *c) {
  return c->destroy ? mp_pool_destroy(c->graph)
                    : mp_pool_graph_release(c->graph);
}

static void *release_only(void *arg) {
  ctx_t *c = arg;
  c->st[1] = release_graph(c);
  return NULL;
}

static void *free_y_and_release(void *arg) {
  ctx_t *c = arg;
  c->st[0] = mp_pool_free(c->graph, c->y);
  c->st[1] = release_graph(c);
  return NULL;
}

/* Runs c->release here, or on another thread and waits for it. */
static void release_here_or_there(ctx_t *c) {
  c->calls++;
  if (c->other_thread) {
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, c->release, c), 0);
    pthread_join(t, NULL);
  } else {
    c->release(c);
  }
  cr_expect_eq(c->st[0], MP_OK);
  cr_expect_eq(c->st[1], MP_OK);
}

static int release_and_lift(mp_pool_t *pool, size_t bytes, mp_status_t st,
                            void *arg) {
  (void)bytes;
  (void)st;
  ctx_t *c = arg;
  c->release = release_only;
  release_here_or_there(c);
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
  c->release = free_y_and_release;
  release_here_or_there(c);
  return 0;
}

/* With no_retry the graph pool also holds a 16 MiB block y, which the
 * handler frees (free_and_release), else release_and_lift; how: ON_THREAD
 * (the growing one), OTHER_THREAD, or OTHER_THREAD_DESTROY. */
enum { ON_THREAD, OTHER_THREAD, OTHER_THREAD_DESTROY };

static void run_how(const char *opts, bool no_retry, int how) {
  mp_device_t *dev = fake_open(GiB, 0);
  mp_pool_t *parent = make_pool(dev, opts);
  ctx_t c = {.other_thread = how != ON_THREAD,
             .destroy = how == OTHER_THREAD_DESTROY};
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

static void run(const char *opts, bool no_retry) {
  run_how(opts, no_retry, ON_THREAD);
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

Test(pool_graph_parent_handler_release, other_thread_without_arenas) {
  run_how("max_bytes=8M", false, OTHER_THREAD);
}

Test(pool_graph_parent_handler_release, other_thread_with_arenas) {
  run_how("arenas=2,max_bytes=8M", false, OTHER_THREAD);
}

Test(pool_graph_parent_handler_release, other_thread_no_retry_without_arenas) {
  run_how("max_bytes=24M", true, OTHER_THREAD);
}

Test(pool_graph_parent_handler_release, other_thread_no_retry_with_arenas) {
  run_how("arenas=2,max_bytes=24M", true, OTHER_THREAD);
}

Test(pool_graph_parent_handler_release, other_thread_destroy_without_arenas) {
  run_how("max_bytes=8M", false, OTHER_THREAD_DESTROY);
}

Test(pool_graph_parent_handler_release, other_thread_destroy_with_arenas) {
  run_how("arenas=2,max_bytes=8M", false, OTHER_THREAD_DESTROY);
}
