/* A graph pool grows by borrowing a range of its parent, and a range the
 * parent cannot give asks the parent's out-of-memory handler, inside that
 * growth (the graph pool in flight). A handler that snapshots, checks or
 * dumps the graph pool (pool.h: "dump a snapshot") gets it, the pool as it
 * was before the growth, instead of waiting for the growth to end: that
 * growth is its own caller's, so it waited for itself, for good (the test
 * timed out). One that allocates from the graph pool is refused (MP_EBUSY)
 * rather than waiting so. With arenas or without. A hang ends in ctest's
 * timeout (Criterion's per-test timers leak under LeakSanitizer when tests
 * run in parallel: test_pool_host_function_no_wait.c). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

enum call { SNAPSHOT, CHECK, DUMP, ALLOC, DEFRAG, PAUSE, TRIM };

typedef struct {
  mp_pool_t *graph;
  enum call call;
  char path[64];
  mp_status_t st;
  char why[512];
  unsigned calls;
  long wrote; /* DUMP: bytes written */
} ctx_t;

static int snapshot_graph(mp_pool_t *pool, size_t bytes, mp_status_t st,
                          void *arg) {
  (void)pool;
  (void)bytes;
  (void)st;
  ctx_t *c = arg;
  c->calls++;
  FILE *f = NULL;
  void *p = NULL;
  switch (c->call) {
  case SNAPSHOT: c->st = mp_pool_snapshot(c->graph, c->path); break;
  case CHECK: c->st = mp_pool_check(c->graph); break;
  case DUMP:
    f = tmpfile();
    c->st = f != NULL ? mp_pool_dump(c->graph, f, "text") : MP_EIO;
    c->wrote = f != NULL ? ftell(f) : -1;
    if (f != NULL)
      fclose(f);
    break;
  case DEFRAG: c->st = mp_pool_defragment(c->graph, NULL, NULL); break;
  case PAUSE: c->st = mp_pool_pause(c->graph, 0); break;
  case TRIM: c->st = mp_pool_trim(c->graph, 0); break;
  case ALLOC:
    c->st = mp_pool_alloc(c->graph, 4 * MiB, NULL, &p);
    if (c->st == MP_OK)
      (void)mp_pool_free(c->graph, p);
    break;
  }
  snprintf(c->why, sizeof c->why, "%s", mp_last_error());
  return 0;
}

static void run(const char *opts, enum call call) {
  mp_device_t *dev = fake_open(GiB, 0);
  mp_pool_t *parent = make_pool(dev, opts);
  ctx_t c = {.st = MP_EINVAL, .call = call};
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
  if (call == ALLOC) {
    cr_expect_eq(c.st, MP_EBUSY, "%s: %s", opts, c.why);
    cr_expect_neq(strstr(c.why, "growing in this thread already"), NULL, "%s",
                  c.why);
  } else if (call >= DEFRAG) {
    cr_expect_eq(c.st, MP_EBUSY, "%s: %s", opts, c.why);
    cr_expect_neq(strstr(c.why, "during this graph pool's own growth"), NULL,
                  "%s", c.why);
  } else {
    cr_expect_eq(c.st, MP_OK, "%s: %s", opts, c.why);
  }
  struct stat sb;
  if (call == SNAPSHOT)
    cr_expect(stat(c.path, &sb) == 0 && sb.st_size > 0, "%s: no snapshot",
              opts);
  if (call == DUMP)
    cr_expect_gt(c.wrote, 0, "%s: nothing dumped", opts);
  unlink(c.path);
  cr_expect_eq(mp_pool_check(c.graph), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(c.graph, x), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(c.graph), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_destroy(parent), MP_OK, "%s", mp_last_error());
  fake_close(dev);
}

Test(pool_calls_from_graph_growth, snapshot_without_arenas) {
  run("max_bytes=8M", SNAPSHOT);
}

Test(pool_calls_from_graph_growth, snapshot_with_arenas) {
  run("arenas=2,max_bytes=8M", SNAPSHOT);
}

Test(pool_calls_from_graph_growth, check_and_dump_see_it_as_it_is) {
  run("max_bytes=8M", CHECK);
  run("arenas=2,max_bytes=8M", CHECK);
  run("max_bytes=8M", DUMP);
  run("arenas=2,max_bytes=8M", DUMP);
}

Test(pool_calls_from_graph_growth, an_allocation_from_it_is_ebusy) {
  run("max_bytes=8M", ALLOC);
  run("arenas=2,max_bytes=8M", ALLOC);
}

/* Device work on it waited for the growth (defragment, pause: a pause of a
 * graph pool is refused, but after that wait), and a trim: MP_EBUSY. */
Test(pool_calls_from_graph_growth, device_work_on_it_is_ebusy) {
  for (enum call k = DEFRAG; k <= TRIM; k++) {
    run("max_bytes=8M", k);
    run("arenas=2,max_bytes=8M", k);
  }
}
