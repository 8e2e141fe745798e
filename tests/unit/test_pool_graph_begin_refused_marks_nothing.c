/* test_pool_graph_begin_refused_marks_nothing.c - mp_pool_graph_begin of a
 * stream that already allocates to another graph pool is MP_EBUSY and
 * changes nothing (status.h): the graph pool it names is never marked
 * capturing on that stream, not even for a moment another thread can see,
 * and its stream table does not meet the stream. Before, begin marked the
 * graph pool's slot first (graph.c, mp__graph_begin_owned), then found the
 * route under the parent's lock and took the mark back: meanwhile that
 * graph pool read as capturing (its synchronize refused, stream.c), and
 * the slot stayed in its table. White-box and deterministic: the test
 * holds the parent's lock, a second thread's begin waits for it (seen as
 * a sleeper on the lock word), and the graph pool is read while it waits. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"

typedef struct {
  mp_pool_t *parent, *graph;
  mp_stream_t s;
  mp_status_t st;
} begin_arg_t;

static void *begin_thread(void *v) {
  begin_arg_t *a = v;
  a->st = mp_pool_graph_begin(a->parent, a->graph, a->s);
  return NULL;
}

/* g2's capture marks: its count of capturing slots and whether it met s
 * (under its lock). */
static size_t capturing(mp_pool_t *g) {
  mp__pool_lock(g);
  size_t n = g->ncapturing;
  mp__pool_unlock(g);
  return n;
}

static bool met(mp_pool_t *g, mp_stream_t s) {
  mp__pool_lock(g);
  bool known = mp__stream_known(g, s);
  mp__pool_unlock(g);
  return known;
}

typedef struct {
  mp_device_t *dev;
  mp_pool_t *parent, *g1, *g2;
  mp_stream_t s;
} setup_t;

/* A parent (opts), two graph pools, s routed to the first. */
static setup_t setup(const char *opts) {
  setup_t t;
  cr_assert_eq(mp_device_open("host:capacity=1G", &t.dev), MP_OK, "%s",
               mp_last_error());
  t.parent = make_pool(t.dev, opts);
  cr_assert_eq(mp_pool_graph_create(t.parent, &t.g1), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_graph_create(t.parent, &t.g2), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_stream_create(t.dev, &t.s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(t.parent, t.g1, t.s), MP_OK, "%s",
               mp_last_error());
  return t;
}

static void teardown(setup_t *t) {
  cr_expect_eq(mp_pool_graph_of(t->parent, t->s), t->g1, "the route moved");
  cr_expect_eq(mp_pool_graph_end(t->parent, t->s), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_graph_release(t->g1), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_graph_release(t->g2), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_check(t->parent), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_destroy(t->parent), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_stream_destroy(t->dev, t->s), MP_OK, "%s", mp_last_error());
  mp_device_close(t->dev);
}

static void refused_leaves_g2_alone(const char *opts) {
  setup_t t = setup(opts);
  const char *how = opts != NULL ? opts : "no arenas";
  cr_expect_eq(mp_pool_graph_begin(t.parent, t.g2, t.s), MP_EBUSY, "%s",
               mp_last_error());
  cr_expect(strstr(mp_last_error(), "already allocates to a graph pool") !=
                NULL,
            "%s", mp_last_error());
  cr_expect_eq(capturing(t.g2), 0, "%s: g2 left capturing", how);
  cr_expect(!met(t.g2, t.s), "%s: the refused begin added s to g2's table",
            how);
  teardown(&t);
}

Test(pool_graph_begin_refused_marks_nothing, table_untouched) {
  refused_leaves_g2_alone(NULL);
}

Test(pool_graph_begin_refused_marks_nothing, table_untouched_arenas) {
  refused_leaves_g2_alone("arenas=2");
}

/* The moment between the mark and the refusal: the begin waits for the
 * parent's lock, which the test holds; g2 is read while it waits. */
Test(pool_graph_begin_refused_marks_nothing, no_mark_while_refusing,
     .timeout = 60) {
  setup_t t = setup(NULL);
  begin_arg_t a = {t.parent, t.g2, t.s, MP_OK};
  pthread_t th;
  mp__pool_lock(t.parent);
  cr_assert_eq(pthread_create(&th, NULL, begin_thread, &a), 0);
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  bool waiting = false;
  do {
    waiting = atomic_load(&t.parent->lock) >= MP__LOCK_SLEEPER;
    if (!waiting)
      nanosleep(&(struct timespec){0, 100000}, NULL);
    clock_gettime(CLOCK_MONOTONIC, &now);
  } while (!waiting && now.tv_sec - t0.tv_sec < 30); /* a loaded machine */
  size_t seen = capturing(t.g2);
  mp__pool_unlock(t.parent);
  pthread_join(th, NULL);
  cr_assert(waiting, "the begin never waited for the parent's lock");
  cr_expect_eq(seen, 0,
               "g2 read as capturing while the refused begin was under way");
  cr_expect_eq(a.st, MP_EBUSY, "%s", mp_status_name(a.st));
  cr_expect_eq(capturing(t.g2), 0);
  teardown(&t);
}
