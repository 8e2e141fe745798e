/* A graph pool grows by borrowing a range of its parent, and a range the
 * parent cannot give asks the parent's out-of-memory handler, inside that
 * growth (the graph pool in flight). A handler that snapshots the graph
 * pool (pool.h: "dump a snapshot") gets it, the pool as it was before the
 * growth, instead of waiting for the growth to end: that growth is its own
 * caller's, so it waited for itself, for good (the test timed out). With
 * arenas or without. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

typedef struct {
  mp_pool_t *graph;
  char path[64];
  mp_status_t st;
  unsigned calls;
} ctx_t;

static int snapshot_graph(mp_pool_t *pool, size_t bytes, mp_status_t st,
                          void *arg) {
  (void)pool;
  (void)bytes;
  (void)st;
  ctx_t *c = arg;
  c->calls++;
  c->st = mp_pool_snapshot(c->graph, c->path);
  return 0;
}

static void run(const char *opts) {
  mp_device_t *dev = fake_open(GiB, 0);
  mp_pool_t *parent = make_pool(dev, opts);
  ctx_t c = {.st = MP_EINVAL};
  snprintf(c.path, sizeof c.path, "/tmp/mp_snap_growth_%ld.pickle",
           (long)getpid());
  cr_assert_eq(mp_pool_graph_create(parent, &c.graph), MP_OK, "%s",
               mp_last_error());
  void *x, *more = NULL;
  cr_assert_eq(mp_pool_alloc(c.graph, MiB, NULL, &x), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_set_oom_handler(parent, snapshot_graph, &c), MP_OK);
  mp_status_t st = mp_pool_alloc(c.graph, 16 * MiB, NULL, &more);
  cr_expect(st == MP_ELIMIT || st == MP_ENOMEM, "%s: %d %s", opts, st,
            mp_last_error());
  cr_expect_eq(c.calls, 1, "%s", opts);
  cr_expect_eq(c.st, MP_OK, "%s", opts);
  struct stat sb;
  cr_expect(stat(c.path, &sb) == 0 && sb.st_size > 0, "%s: no snapshot", opts);
  unlink(c.path);
  cr_expect_eq(mp_pool_check(c.graph), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(c.graph, x), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(c.graph), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_destroy(parent), MP_OK, "%s", mp_last_error());
  fake_close(dev);
}

Test(pool_snapshot_from_graph_growth, without_arenas, .timeout = 20) {
  run("max_bytes=8M");
}

Test(pool_snapshot_from_graph_growth, with_arenas, .timeout = 20) {
  run("arenas=2,max_bytes=8M");
}
