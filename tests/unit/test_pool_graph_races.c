/* mp_pool_graph_begin and mp_pool_graph_end racing on one stream: each
 * takes the graph pool's lock and the parent's one after the other, never
 * both, so another thread's call can run between the two halves. Whatever
 * the order, a stream routed to a graph pool leaves it marked capturing
 * (its release is refused until the end), and one that is not routed
 * leaves nothing marked. The test holds the parent's lock itself to order
 * the halves: the end's parent half first, then the begin's graph half.
 * Also a begin while a synchronize waits, the lock dropped, for a growth
 * in flight (which the test holds itself). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

typedef struct call {
  mp_pool_t *parent, *graph;
  mp_stream_t s;
  mp_status_t st;
} call_t;

static void *begin_call(void *arg) {
  call_t *c = arg;
  c->st = mp_pool_graph_begin(c->parent, c->graph, c->s);
  return NULL;
}

static void *end_call(void *arg) {
  call_t *c = arg;
  c->st = mp_pool_graph_end(c->parent, c->s);
  return NULL;
}

/* How many takers sleep on pool's lock. */
static unsigned lock_sleepers(mp_pool_t *pool) {
  return atomic_load(&pool->lock) / MP__LOCK_SLEEPER;
}

/* How many threads wait for pool's flag (inflight, syncing) to drop. */
static unsigned idle_waiters(mp_pool_t *pool) {
  mp__pool_lock(pool);
  unsigned w = pool->idle_waiters;
  mp__pool_unlock(pool);
  return w;
}

/* Waits (at most 10 s) until count(pool) reaches n. */
static void wait_count(unsigned (*count)(mp_pool_t *), mp_pool_t *pool,
                       unsigned n, const char *what) {
  struct timespec ms = {0, 1000000};
  for (int i = 0; i < 30000; i++) { /* 30 s: a loaded machine */
    if (count(pool) >= n)
      return;
    nanosleep(&ms, NULL);
  }
  cr_assert_fail("%u %s never came", n, what);
}

static void wait_sleepers(mp_pool_t *pool, unsigned n) {
  wait_count(lock_sleepers, pool, n, "takers asleep on the lock");
}

Test(pool_graph_races, a_begin_racing_an_end_leaves_its_route_marked) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *parent = make_pool(dev, NULL);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  /* Rounds: the parent's lock does not promise which sleeper gets it
   * first; the end before the begin is the order that lost the mark. */
  for (int round = 0; round < 8; round++) {
    mp_pool_t *g;
    cr_assert_eq(mp_pool_graph_create(parent, &g), MP_OK, "%s",
                 mp_last_error());
    cr_assert_eq(mp_pool_graph_begin(parent, g, s), MP_OK, "%s",
                 mp_last_error());
    call_t end = {parent, g, s, MP_OK}, begin = {parent, g, s, MP_OK};
    pthread_t te, tb;
    mp__pool_lock(parent);
    cr_assert_eq(pthread_create(&te, NULL, end_call, &end), 0);
    wait_sleepers(parent, 1);
    /* The begin marks the graph pool's slot (still marked by the first
     * begin), then sleeps on the parent's lock behind the end. */
    cr_assert_eq(pthread_create(&tb, NULL, begin_call, &begin), 0);
    wait_sleepers(parent, 2);
    mp__pool_unlock(parent);
    pthread_join(te, NULL);
    pthread_join(tb, NULL);
    cr_assert_eq(end.st, MP_OK, "%s", mp_last_error());
    if (mp_pool_graph_of(parent, s) == g) {
      /* The begin came second and routes s: the graph pool must still
       * count a stream allocating to it. */
      cr_assert_eq(begin.st, MP_OK);
      cr_assert_eq(mp_pool_graph_release(g), MP_EBUSY,
                   "round %d: released while s still allocates to it", round);
      cr_assert_eq(mp_pool_graph_end(parent, s), MP_OK, "%s", mp_last_error());
    } else {
      cr_assert_eq(begin.st, MP_EBUSY, "%s", mp_last_error());
    }
    cr_assert_eq(mp_pool_graph_release(g), MP_OK, "round %d: %s", round,
                 mp_last_error());
    cr_assert_null(mp_pool_graph_of(parent, s));
  }
  cr_assert_eq(mp_pool_check(parent), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(parent), MP_OK, "%s", mp_last_error());
  fake_close(dev);
}

typedef struct trim_call {
  mp_pool_t *pool;
  mp_status_t st;
} trim_call_t;

static void *trim_call(void *arg) {
  trim_call_t *c = arg;
  c->st = mp_pool_trim(c->pool, 0);
  return NULL;
}

/* A synchronize first waits, the lock dropped, for a growth or release in
 * flight; a begin may route a stream of the pool to a graph pool
 * meanwhile. The synchronize must then refuse, as it does when the
 * capture was there first: it cannot wait for a capturing stream, and
 * counting that stream's frees done without waiting hands its memory on
 * (here, trim gives it back to the device) while its work may still run.
 * The test holds a "growth" in flight itself, so the trim waits. */
Test(pool_graph_races, a_begin_while_a_synchronize_waits_makes_it_refuse) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *parent = make_pool(dev, NULL);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(parent, &g), MP_OK, "%s", mp_last_error());
  void *x;
  cr_assert_eq(mp_pool_alloc(parent, (size_t)1 << 20, s, &x), MP_OK);
  cr_assert_eq(mp_pool_free(parent, x), MP_OK);
  size_t reserved = stats(parent).reserved_bytes;
  cr_assert_gt(reserved, 0);
  mp__pool_lock(parent);
  mp__pool_device_begin(parent); /* a growth in flight: lock dropped */
  trim_call_t t = {parent, MP_OK};
  pthread_t tt;
  cr_assert_eq(pthread_create(&tt, NULL, trim_call, &t), 0);
  wait_count(idle_waiters, parent, 1, "waiters for the growth");
  cr_assert_eq(mp_pool_graph_begin(parent, g, s), MP_OK, "%s", mp_last_error());
  mp__pool_device_end(parent);
  mp__pool_unlock(parent);
  pthread_join(tt, NULL);
  cr_expect_eq(t.st, MP_EBUSY, "trim synchronized beside a capturing stream");
  cr_expect_eq(stats(parent).reserved_bytes, reserved);
  cr_expect_eq(fake_of(dev)->frees, 0);
  cr_assert_eq(mp_pool_graph_end(parent, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_check(parent), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(parent), MP_OK, "%s", mp_last_error());
  fake_close(dev);
}
