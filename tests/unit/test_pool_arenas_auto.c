/* arenas_auto=1 (MP_POOL_ARENAS_AUTO, src/pool/arena.c, "Solo" and "The
 * lane"): a pool with arenas that runs solo on its first arena (the first
 * allocating thread's), through the plain path of a pool without arenas,
 * until threads contend for that arena's lock, and then in the lane: that
 * thread keeps the plain path, every other thread takes the arenas' path.
 * White-box: it reads which pool the hot path works on, its gate and which
 * arena holds a block. */
#include <criterion/criterion.h>
#include <stdatomic.h>

#include "../support/pool_helpers.h"
#include "arena_workers.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_arenas_auto, "host:capacity=64M");

/* The index of the arena the pool's hot path works on (solo, or the
 * lane), or -1. */
static int hot_at(mp_pool_t *pool) {
  mp_pool_t *hot = mp__pool_hot(pool);
  for (size_t i = 0; hot != pool && i < pool->cfg.arenas; i++)
    if (mp__arena_at(pool, i) == hot)
      return (int)i;
  return -1;
}

/* Solo: every thread on that arena's plain path. */
static bool solo(mp_pool_t *pool) {
  mp_pool_t *hot = mp__pool_hot(pool);
  return hot != pool && atomic_load(&hot->solo_of) == pool;
}

/* The index of the arena the pool runs solo on, or -1. */
static int solo_at(mp_pool_t *pool) {
  return solo(pool) ? hot_at(pool) : -1;
}

/* The lane: solo ended, and the arena that ran solo keeps its plain path
 * for the thread that made it; every other thread goes through its gate
 * to the arenas' path. */
static bool lane(mp_pool_t *pool) {
  mp_pool_t *hot = mp__pool_hot(pool);
  return hot != pool && atomic_load(&hot->solo_of) == NULL &&
         atomic_load(&hot->gate) == pool;
}

/* A thread numbered now, by its first allocation from a pool with arenas,
 * so that the next thread to use arenas is not numbered 0 mod N. */
static void number_a_thread(void) {
  mp_pool_t *other = make_pool(dev, "arenas=2");
  job_t j = {.pool = other, .bytes = 4096, .tag = 1, .count = 1};
  cr_assert_eq(on_thread(&j, ALLOC), MP_OK, "%s", j.why);
  cr_assert_eq(on_thread(&j, FREE), MP_OK, "%s", j.why);
  cr_assert_eq(mp_pool_destroy(other), MP_OK, "%s", mp_last_error());
}

Test(pool_arenas_auto, one_thread_runs_solo_on_its_arena) {
  mp_pool_t *pool = make_pool(dev, "arenas=4,arenas_auto=1");
  cr_expect(!solo(pool) && arenas_made(pool) == 0,
            "a new auto pool made an arena before its first allocation");
  void *p[10];
  for (int i = 0; i < 10; i++) {
    cr_assert_eq(mp_pool_alloc(pool, (size_t)(i + 1) * 4096, NULL, &p[i]),
                 MP_OK, "%s", mp_last_error());
    cr_assert(solo(pool), "the first allocation did not start solo");
    cr_expect_eq(arena_holding(pool, p[i]), (int)mp__arena_mine(pool),
                 "block %d is in arena %d, not the thread's %zu", i,
                 arena_holding(pool, p[i]), mp__arena_mine(pool));
  }
  cr_expect_eq(arenas_made(pool), 1, "%zu arenas made by one thread",
               arenas_made(pool));
  cr_expect_geq(stats(pool).allocated_bytes, 55 * 4096);
  check(pool);
  for (int i = 0; i < 10; i++)
    cr_assert_eq(mp_pool_free(pool, p[i]), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(pool).allocated_bytes, 0);
  cr_expect(solo(pool), "one thread ended solo");
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

/* Threads that use the pool one after the other never contend: each runs
 * on the solo arena, and the pool stays solo. */
Test(pool_arenas_auto, threads_taking_turns_stay_solo) {
  mp_pool_t *pool = make_pool(dev, "arenas=4,arenas_auto=1");
  job_t j = {.pool = pool, .bytes = 64 * 1024, .tag = 3, .count = 4};
  for (int round = 0; round < 3; round++) {
    cr_assert_eq(on_thread(&j, ALLOC), MP_OK, "%s", j.why);
    for (int i = 0; i < 4; i++)
      cr_expect_eq(arena_holding(pool, j.ptrs[i]), solo_at(pool),
                   "round %d: a new thread's block is in arena %d", round,
                   arena_holding(pool, j.ptrs[i]));
    cr_assert_eq(on_thread(&j, FREE), MP_OK, "%s", j.why);
  }
  cr_expect(solo(pool), "threads taking turns ended solo");
  cr_expect_eq(arenas_made(pool), 1);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

typedef struct pairs {
  mp_pool_t *pool;
  _Atomic bool *stop;
  void *kept[4]; /* allocated before the pairs, freed by the test */
  mp_status_t st;
  char why[256];
} pairs_t;

static void *do_pairs(void *arg) {
  pairs_t *w = arg;
  w->st = MP_OK;
  for (int i = 0; i < 4 && w->st == MP_OK; i++)
    w->st = mp_pool_alloc(w->pool, 8192, NULL, &w->kept[i]);
  void *x[16] = {0};
  for (unsigned i = 0; w->st == MP_OK && !atomic_load(w->stop); i++) {
    unsigned k = i % 16;
    if (x[k] != NULL)
      w->st = mp_pool_free(w->pool, x[k]);
    if (w->st == MP_OK)
      w->st = mp_pool_alloc(w->pool, 512 + (i * 7919u) % 65536, NULL, &x[k]);
  }
  for (int k = 0; k < 16 && w->st == MP_OK; k++)
    if (x[k] != NULL)
      w->st = mp_pool_free(w->pool, x[k]);
  snprintf(w->why, sizeof w->why, "%s", mp_last_error());
  return NULL;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Two threads doing pairs contend for the solo arena's lock: the pool leaves
 * solo for the lane (within 60 s, however slow the machine), threads made
 * after that take arenas of their own, and what was allocated solo is freed
 * from any thread. */
Test(pool_arenas_auto, contention_switches_to_per_thread_arenas) {
  mp_pool_t *pool = make_pool(dev, "arenas=4,arenas_auto=1");
  _Atomic bool stop = false;
  pairs_t w[2] = {{.pool = pool, .stop = &stop}, {.pool = pool, .stop = &stop}};
  pthread_t t[2];
  /* Solo first: the first arena made before the workers start. */
  void *first;
  cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, &first), MP_OK);
  int at = solo_at(pool);
  cr_assert(at >= 0, "the first allocation did not start solo");
  for (int i = 0; i < 2; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, do_pairs, &w[i]), 0);
  double t0 = now_s();
  while (solo(pool) && now_s() - t0 < 60)
    usleep(1000);
  bool switched = !solo(pool);
  usleep(20000); /* some pairs on the arenas' path too */
  atomic_store(&stop, true);
  for (int i = 0; i < 2; i++) {
    pthread_join(t[i], NULL);
    cr_assert_eq(w[i].st, MP_OK, "worker %d: %s", i, w[i].why);
  }
  cr_assert(switched, "two threads doing pairs for 60 s left the pool solo");
  cr_expect(lane(pool) && hot_at(pool) == at,
            "after solo the pool is not in the lane of arena %d (hot on %d)",
            at, hot_at(pool));
  /* Two new threads, numbered one after the other: two arenas. */
  job_t a = {.pool = pool, .bytes = 4096, .tag = 1, .count = 1};
  job_t b = a;
  cr_assert_eq(on_thread(&a, ALLOC), MP_OK, "%s", a.why);
  cr_assert_eq(on_thread(&b, ALLOC), MP_OK, "%s", b.why);
  int ia = arena_holding(pool, a.ptrs[0]), ib = arena_holding(pool, b.ptrs[0]);
  cr_expect(ia >= 0 && ib >= 0 && ia != ib,
            "two new threads' blocks are in arenas %d and %d", ia, ib);
  /* The blocks the workers allocated solo, from this thread. */
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < 4; k++) {
      cr_expect_eq(arena_holding(pool, w[i].kept[k]), at);
      cr_assert_eq(mp_pool_free(pool, w[i].kept[k]), MP_OK, "%s",
                   mp_last_error());
    }
  cr_assert_eq(mp_pool_free(pool, a.ptrs[0]), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, b.ptrs[0]), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, first), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_expect_eq(stats(pool).allocated_bytes, 0);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

typedef struct oom_seen {
  mp_pool_t *pool; /* what the handler was called with */
  void *drop;      /* freed by the handler */
  int calls;
} oom_seen_t;

static int free_one(mp_pool_t *pool, size_t bytes, mp_status_t st, void *ctx) {
  (void)bytes;
  (void)st;
  oom_seen_t *o = ctx;
  o->pool = pool;
  o->calls++;
  if (o->drop == NULL)
    return 0;
  mp_status_t fst = mp_pool_free(pool, o->drop);
  o->drop = NULL;
  return fst == MP_OK;
}

/* Solo, an allocation past the cap reaches the pool's own handler, called
 * with the pool (not its solo arena), and the retry after it succeeds. */
Test(pool_arenas_auto, the_pools_handler_answers_a_solo_failure) {
  mp_pool_t *pool = make_pool(dev, "arenas=2,arenas_auto=1,max_bytes=8M");
  oom_seen_t o = {0};
  cr_assert_eq(mp_pool_set_oom_handler(pool, free_one, &o), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, 6 * MiB, NULL, &o.drop), MP_OK, "%s",
               mp_last_error());
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, 4 * MiB, NULL, &p), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(o.calls, 1, "the handler ran %d times", o.calls);
  cr_expect(o.pool == pool, "the handler got %p, not the pool %p",
            (void *)o.pool, (void *)pool);
  cr_expect(solo(pool));
  /* Nothing left to free: the failure is the pool's, MP_ELIMIT. */
  void *q;
  cr_expect_eq(mp_pool_alloc(pool, 6 * MiB, NULL, &q), MP_ELIMIT);
  cr_expect_eq(o.calls, 2);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

/* Fills pool with 1 MiB blocks into p[from..max) until one fails; returns
 * the count reached and the failure in *st. */
static int fill_mib(mp_pool_t *pool, void **p, int from, int max,
                    mp_status_t *st) {
  int n = from;
  while (n < max && (*st = mp_pool_alloc(pool, MiB, NULL, &p[n])) == MP_OK)
    n++;
  return n;
}

/* Solo, the solo arena holds the whole cap (it asks for no share), also
 * the cap mp_pool_set_max_fraction moves. */
/* The solo arena's share of the cap, read under its lock. */
static size_t solo_cap(mp_pool_t *pool) {
  cr_assert(solo(pool));
  mp_pool_t *a = mp__pool_hot(pool);
  mp__pool_lock(a);
  size_t cap = a->cap;
  mp__pool_unlock(a);
  return cap;
}

Test(pool_arenas_auto, a_solo_pool_fills_its_whole_cap) {
  mp_pool_t *pool = make_pool(dev, "arenas=4,arenas_auto=1,max_bytes=16M");
  void *p[40];
  cr_assert_eq(mp_pool_alloc(pool, MiB, NULL, &p[0]), MP_OK, "%s",
               mp_last_error());
  /* Given when it was made, not asked for by an out-of-memory path. */
  cr_expect_eq(solo_cap(pool), 16 * MiB, "the solo arena's first share: %zu",
               solo_cap(pool));
  mp_status_t st = MP_OK;
  int n = fill_mib(pool, p, 1, 40, &st);
  cr_expect_eq(n, 16, "%d blocks of 1 MiB under a 16 MiB cap", n);
  cr_expect_eq(st, MP_ELIMIT, "%s", mp_last_error());
  cr_assert_eq(mp_pool_set_max_fraction(pool, 0.5), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(solo_cap(pool), 32 * MiB,
               "the solo arena's share after set_max_fraction: %zu",
               solo_cap(pool));
  n = fill_mib(pool, p, n, 40, &st);
  cr_expect_eq(n, 32, "%d blocks of 1 MiB under a 32 MiB cap", n);
  cr_expect(solo(pool));
  check(pool);
  for (int i = 0; i < n; i++)
    cr_assert_eq(mp_pool_free(pool, p[i]), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

/* Bad frees in solo are the plain path's errors and change nothing. */
Test(pool_arenas_auto, a_bad_free_in_solo_changes_nothing) {
  mp_pool_t *pool = make_pool(dev, "arenas=2,arenas_auto=1");
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, &p), MP_OK);
  mp_stats_t before = stats(pool);
  int local;
  cr_expect_eq(mp_pool_free(pool, &local), MP_EINVAL);
  cr_expect_eq(mp_pool_free(pool, (char *)p + 64), MP_EINVAL);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_free(pool, p), MP_EINVAL, "a double free");
  mp_stats_t after = stats(pool);
  cr_expect_eq(after.reserved_bytes, before.reserved_bytes);
  cr_expect_eq(after.allocated_bytes, 0);
  cr_expect(solo(pool));
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

/* Pause and resume in solo: the solo arena pauses as any arena, its plain path
 * is refused meanwhile, and the content comes back. */
Test(pool_arenas_auto, a_solo_pool_pauses_and_resumes) {
  mp_pool_t *pool = make_pool(dev, "arenas=2,arenas_auto=1");
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, 3 * MiB, NULL, &p), MP_OK);
  fill(p, 3 * MiB, 0x5a);
  cr_assert_eq(mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(stats(pool).reserved_bytes, 0);
  void *q;
  cr_expect_eq(mp_pool_alloc(pool, 4096, NULL, &q), MP_EBUSY);
  cr_expect_eq(mp_pool_free(pool, p), MP_EBUSY);
  cr_assert_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(first_difference(p, 3 * MiB, 0x5a), 3 * MiB);
  cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, &q), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(arena_holding(pool, q), solo_at(pool));
  cr_assert_eq(mp_pool_free(pool, q), MP_OK);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

/* arenas_auto=1 needs arenas to switch to; with a history it never runs
 * solo (the arenas' path keeps the rings), and works as arenas=N. */
Test(pool_arenas_auto, config_needs_arenas_and_history_keeps_the_arenas_path) {
  const char *bad[] = {"arenas_auto=1", "arenas=1,arenas_auto=1"};
  for (int i = 0; i < 2; i++) {
    mp_pool_config_t cfg;
    mp_pool_config_init(&cfg);
    cr_assert_eq(mp_pool_config_parse(&cfg, bad[i]), MP_OK, "%s",
                 mp_last_error());
    mp_pool_t *p = NULL;
    cr_expect_eq(mp_pool_create(dev, &cfg, &p), MP_EINVAL, "%s", bad[i]);
    cr_expect_null(p);
    cr_expect(strstr(mp_last_error(), "arenas_auto=1 needs arenas=N") != NULL,
              "%s: %s", bad[i], mp_last_error());
  }
  mp_pool_t *pool = make_pool(dev, "arenas=2,arenas_auto=1,history=64");
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, &p), MP_OK);
  cr_expect(mp__pool_hot(pool) == pool, "a pool with a history runs solo");
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

typedef struct pieces_job {
  mp_pool_t *pool;
  void *out[2];
  mp_status_t st;
  char why[256]; /* mp_last_error() of the job's thread, after it */
} pieces_job_t;

static void *do_pieces(void *arg) {
  pieces_job_t *j = arg;
  const size_t sizes[2] = {4096, 8192};
  j->st = mp_pool_alloc_contiguous(j->pool, 2, sizes, NULL, j->out);
  snprintf(j->why, sizeof j->why, "%s", mp_last_error());
  return NULL;
}

/* mp_pool_alloc_contiguous takes the arenas' path: the first thread's
 * pieces start solo on its arena, and a second thread gets its pieces in
 * another arena: a free of them from any thread finds them (the solo path
 * looked only in the solo arena: "was not allocated from this pool"). */
Test(pool_arenas_auto, a_solo_free_finds_pieces_of_another_arena) {
  mp_pool_t *pool = make_pool(dev, "arenas=2,arenas_auto=1");
  pieces_job_t j[2] = {{.pool = pool}, {.pool = pool}};
  for (int i = 0; i < 2; i++) {
    on_new_thread(do_pieces, &j[i]);
    cr_assert_eq(j[i].st, MP_OK, "%s", mp_last_error());
  }
  int ia = arena_holding(pool, j[0].out[0]);
  int ib = arena_holding(pool, j[1].out[0]);
  cr_expect(ia != ib, "two threads' pieces in arenas %d and %d", ia, ib);
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < 2; k++)
      cr_expect_eq(mp_pool_free(pool, j[i].out[k]), MP_OK,
                   "piece %d of thread %d (arena %d): %s", k, i,
                   arena_holding(pool, j[i].out[k]), mp_last_error());
  cr_expect_eq(stats(pool).allocated_bytes, 0);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

/* The solo arena is the first allocating thread's own: after the switch
 * that thread finds what it cached solo in its arena, with no loan and no
 * growth. (Arena 0 ran solo before: a first thread not numbered 0 mod N
 * then borrowed its own cache back from arena 0, or grew.) */
Test(pool_arenas_auto, the_first_thread_keeps_its_solo_cache) {
  number_a_thread();
  mp_pool_t *pool = make_pool(dev, "arenas=4,arenas_auto=1");
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, 8 * MiB, NULL, &p), MP_OK, "%s",
               mp_last_error());
  int at = solo_at(pool);
  cr_expect_eq(at, (int)mp__arena_mine(pool),
               "solo on arena %d, not the first thread's arena %zu", at,
               mp__arena_mine(pool));
  cr_assert_eq(mp_pool_free(pool, p), MP_OK, "%s", mp_last_error());
  cr_assert(at >= 0);
  mp_pool_t *a = mp__arena_at(pool, (size_t)at);
  mp__pool_lock(a);
  size_t reserved = a->st.reserved_bytes;
  mp__pool_unlock(a);
  /* Another thread's arena ends solo. */
  pieces_job_t j = {.pool = pool};
  on_new_thread(do_pieces, &j);
  cr_assert_eq(j.st, MP_OK, "%s", mp_last_error());
  cr_assert(!solo(pool), "another thread's arena left the pool solo");
  cr_assert_eq(mp_pool_alloc(pool, 8 * MiB, NULL, &p), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(arena_holding(pool, p), (int)mp__arena_mine(pool),
               "after the switch the first thread's block is in arena %d, "
               "not its own %zu",
               arena_holding(pool, p), mp__arena_mine(pool));
  mp__pool_lock(a);
  cr_expect_eq(a->st.reserved_bytes, reserved, "its arena grew");
  mp__pool_unlock(a);
  for (int k = 0; k < 2; k++)
    cr_assert_eq(mp_pool_free(pool, j.out[k]), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, p), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

/* A graph pool made before the first allocation keeps solo from starting:
 * its routed stream needs the arenas' path. */
Test(pool_arenas_auto, a_graph_pool_made_first_keeps_the_pool_off_solo) {
  mp_pool_t *pool = make_pool(dev, "arenas=2,arenas_auto=1");
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, &p), MP_OK, "%s",
               mp_last_error());
  cr_expect(!solo(pool), "the first allocation after a graph pool ran solo");
  cr_expect_eq(arenas_made(pool), 1);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

/* A call that read the pool's hot pointer just before solo ended runs the
 * former solo arena's plain path. If a capture began meanwhile, its
 * stream is routed to a graph pool, which only the arenas' path finds:
 * the call must still allocate there. mp_pool_alloc on the arena itself
 * is that plain path (an arena's hot is itself). */
Test(pool_arenas_auto, a_stale_solo_alloc_on_a_captured_stream_uses_the_graph) {
  mp_pool_t *pool = make_pool(dev, "arenas=2,arenas_auto=1");
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, &p), MP_OK);
  mp_pool_t *x = mp__pool_hot(pool);
  cr_assert(solo(pool));
  cr_assert_eq(mp_pool_free(pool, p), MP_OK, "%s", mp_last_error());
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, g, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(x, 64 * 1024, s, &p), MP_OK, "%s",
               mp_last_error());
  mp_stats_t gs;
  cr_assert_eq(mp_pool_get_stats(g, &gs), MP_OK);
  cr_expect_geq(gs.allocated_bytes, 64 * 1024,
                "the graph pool holds %zu bytes: the block came from arena %d",
                gs.allocated_bytes, arena_holding(pool, p));
  cr_assert_eq(mp_pool_graph_end(pool, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
}

/* The solo arena holds the whole cap. While its growth is in flight (its
 * lock dropped for the device's map), another thread's arena is made: two
 * threads' first allocations at once (the second read the hot pointer
 * before the first arena was made), or a contiguous call as here. That
 * arena's share must count what the solo arena holds once the growth
 * lands, not the whole cap the growth was checked against, or every
 * request of the new arena fails until the growth lands, under a cap the
 * pool is far from. White-box: the growth in flight is set by hand (the
 * solo arena holds nothing free, so no trim waits for it), as in
 * test_pool_arenas_max_fraction.c. */
Test(pool_arenas_auto, a_solo_growth_in_flight_leaves_room_for_another_arena) {
  mp_pool_t *pool = make_pool(dev, "arenas=2,arenas_auto=1,max_bytes=16M");
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, 2 * MiB, NULL, &p), MP_OK, "%s",
               mp_last_error());
  cr_assert(solo(pool));
  mp_pool_t *a = mp__pool_hot(pool);
  mp__pool_lock(a);
  cr_assert_eq(mp__free_bytes(a), 0, "a trim would wait for the growth");
  a->inflight = true; /* a 4 MiB growth, checked against the whole cap */
  a->grow_inflight = 4 * MiB;
  mp__pool_unlock(a);
  pieces_job_t j = {.pool = pool};
  on_new_thread(do_pieces, &j);
  mp__pool_lock(a);
  a->inflight = false; /* landed (nothing, here) */
  a->grow_inflight = 0;
  mp__pool_unlock(a);
  cr_expect_eq(j.st, MP_OK,
               "12 KiB in another arena beside the solo arena's 4 MiB growth "
               "in flight, under a 16 MiB cap: %s",
               j.why);
  cr_expect(!solo(pool));
  cr_expect_leq(stats(pool).reserved_bytes, 16 * MiB);
  check(pool);
  for (int k = 0; k < 2 && j.st == MP_OK; k++)
    cr_assert_eq(mp_pool_free(pool, j.out[k]), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, p), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

typedef struct gate_seen {
  mp_pool_t *pool;
  mp_pool_t *gate; /* mp__pool_gate of the pool's hot, on the thread */
} gate_seen_t;

static void *read_gate(void *arg) {
  gate_seen_t *g = arg;
  g->gate = mp__pool_gate(mp__pool_hot(g->pool));
  return NULL;
}

/* Solo ends in the lane: the first thread keeps the former solo arena's
 * plain path (its gate lets that thread through), every other thread goes
 * to the arenas' path and an arena of its own, and the first thread frees
 * their blocks on its plain path too (a miss there looks in the other
 * arenas); a bad free from it is still the right error and changes
 * nothing. */
Test(pool_arenas_auto, in_the_lane_the_first_thread_frees_any_arenas_blocks) {
  mp_pool_t *pool = make_pool(dev, "arenas=4,arenas_auto=1");
  void *first;
  cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, &first), MP_OK);
  int at = solo_at(pool);
  cr_assert(at >= 0, "the first allocation did not start solo");
  /* Another thread's arena (mp_pool_alloc_contiguous takes the arenas'
   * path) ends solo. */
  pieces_job_t pj = {.pool = pool};
  on_new_thread(do_pieces, &pj);
  cr_assert_eq(pj.st, MP_OK, "%s", pj.why);
  cr_assert(lane(pool) && hot_at(pool) == at,
            "another thread's arena did not start the lane of arena %d (hot "
            "on %d, solo %d)",
            at, hot_at(pool), solo(pool));
  cr_expect_null(mp__pool_gate(mp__pool_hot(pool)),
                 "the first thread does not take its plain path");
  gate_seen_t gs = {.pool = pool};
  on_new_thread(read_gate, &gs);
  cr_expect_eq(gs.gate, pool, "another thread is not sent to the arenas");
  /* Another thread's blocks are in an arena of its own. */
  job_t j = {.pool = pool, .bytes = 64 * 1024, .tag = 7, .count = 3};
  cr_assert_eq(on_thread(&j, ALLOC), MP_OK, "%s", j.why);
  int other = arena_holding(pool, j.ptrs[0]);
  cr_assert(other >= 0 && other != at, "another thread's block in arena %d",
            other);
  void *mine;
  cr_assert_eq(mp_pool_alloc(pool, 64 * 1024, NULL, &mine), MP_OK);
  cr_expect_eq(arena_holding(pool, mine), at);
  mp_stats_t before = stats(pool);
  /* Bad frees from the first thread: errors, and nothing changes. */
  int local;
  cr_expect_eq(mp_pool_free(pool, &local), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "not allocated from this pool") != NULL,
            "a foreign pointer: %s", mp_last_error());
  cr_expect_eq(mp_pool_free(pool, (char *)j.ptrs[0] + 64), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "points inside the block") != NULL,
            "an interior pointer of another arena's block: %s",
            mp_last_error());
  mp_stats_t same = stats(pool);
  cr_expect_eq(same.allocated_bytes, before.allocated_bytes);
  cr_expect_eq(same.reserved_bytes, before.reserved_bytes);
  /* Its frees of the other thread's blocks, plain and stream-ordered. */
  cr_assert_eq(mp_pool_free(pool, j.ptrs[0]), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free_async(pool, j.ptrs[1], NULL), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free_after_all(pool, j.ptrs[2]), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(stats(pool).allocated_bytes,
               before.allocated_bytes - 3 * 64 * 1024);
  cr_expect_eq(mp_pool_free(pool, j.ptrs[0]), MP_EINVAL, "a double free");
  cr_expect(strstr(mp_last_error(), "double free") != NULL, "%s",
            mp_last_error());
  /* The other thread frees the first thread's block. */
  job_t f = {.pool = pool, .count = 1, .ptrs = {mine}};
  cr_assert_eq(on_thread(&f, FREE), MP_OK, "%s", f.why);
  for (int k = 0; k < 2; k++)
    cr_assert_eq(mp_pool_free(pool, pj.out[k]), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, first), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(pool).allocated_bytes, 0);
  cr_expect(lane(pool), "the lane ended");
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

/* A graph pool routes a captured stream on the arenas' path: making one
 * ends solo, or the lane (in_lane: another thread's arena started it), for
 * good, and the pool still serves and frees. */
static void a_graph_pool_ends(bool in_lane) {
  mp_pool_t *pool = make_pool(dev, "arenas=2,arenas_auto=1");
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, &p), MP_OK);
  pieces_job_t pj = {.pool = pool};
  if (in_lane) {
    on_new_thread(do_pieces, &pj);
    cr_assert_eq(pj.st, MP_OK, "%s", pj.why);
    cr_assert(lane(pool));
  }
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  cr_expect(mp__pool_hot(pool) == pool, "a pool with a graph pool is still %s",
            in_lane ? "in the lane" : "solo");
  cr_assert_eq(mp_pool_free(pool, p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, &p), MP_OK);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK, "%s", mp_last_error());
  for (int k = 0; in_lane && k < 2; k++)
    cr_assert_eq(mp_pool_free(pool, pj.out[k]), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

Test(pool_arenas_auto, a_graph_pool_ends_solo) {
  a_graph_pool_ends(false);
}

Test(pool_arenas_auto, a_graph_pool_ends_the_lane) {
  a_graph_pool_ends(true);
}

/* In the lane the first thread's plain path grows within its arena's
 * share of the cap, and past it takes the arenas' out-of-memory path: the
 * other arena's unused share comes back, the pool never holds more than
 * the cap (mp_pool_check: no arena above its share, the shares within the
 * cap), and mp_pool_set_max_fraction's new cap is shared, not handed whole
 * to the lane arena as it is to a solo one. A pause refuses the first
 * thread's plain path, and the resume gives it back. */
Test(pool_arenas_auto, in_the_lane_the_first_thread_keeps_to_the_cap) {
  mp_pool_t *pool = make_pool(dev, "arenas=4,arenas_auto=1,max_bytes=16M");
  void *p[40];
  cr_assert_eq(mp_pool_alloc(pool, MiB, NULL, &p[0]), MP_OK, "%s",
               mp_last_error());
  pieces_job_t pj = {.pool = pool};
  on_new_thread(do_pieces, &pj);
  cr_assert_eq(pj.st, MP_OK, "%s", pj.why);
  cr_assert(lane(pool), "another thread's arena did not start the lane");
  job_t j = {.pool = pool, .bytes = 4 * MiB, .tag = 9, .count = 2};
  cr_assert_eq(on_thread(&j, ALLOC), MP_OK, "%s", j.why);
  mp_status_t st = MP_OK;
  int n = fill_mib(pool, p, 1, 40, &st);
  cr_expect_eq(st, MP_ELIMIT, "%s", mp_last_error());
  cr_expect(n >= 4 && n <= 8,
            "%d blocks of 1 MiB beside another arena's 8 MiB under a 16 MiB "
            "cap",
            n);
  cr_expect_leq(stats(pool).reserved_bytes, 16 * MiB);
  check(pool);
  /* The other thread's blocks go (freed from this thread, through the
   * lane's forward): their room comes back to the first thread. */
  for (int k = 0; k < 2; k++) {
    cr_assert_eq(mp_pool_free(pool, j.ptrs[k]), MP_OK, "%s", mp_last_error());
    cr_assert_eq(mp_pool_free(pool, pj.out[k]), MP_OK, "%s", mp_last_error());
  }
  n = fill_mib(pool, p, n, 40, &st);
  cr_expect_eq(n, 16, "%d blocks of 1 MiB once the other arena's went", n);
  cr_expect_leq(stats(pool).reserved_bytes, 16 * MiB);
  check(pool);
  cr_assert_eq(mp_pool_set_max_fraction(pool, 0.5), MP_OK, "%s",
               mp_last_error());
  mp_pool_t *a = mp__pool_hot(pool);
  mp__pool_lock(a);
  size_t share = a->cap;
  mp__pool_unlock(a);
  cr_expect_lt(share, 32 * MiB, "the lane arena took the whole new cap");
  n = fill_mib(pool, p, n, 40, &st);
  cr_expect_eq(n, 32, "%d blocks of 1 MiB under a 32 MiB cap", n);
  cr_expect_leq(stats(pool).reserved_bytes, 32 * MiB);
  check(pool);
  cr_assert_eq(mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  void *q;
  cr_expect_eq(mp_pool_alloc(pool, 4096, NULL, &q), MP_EBUSY);
  cr_expect_eq(mp_pool_free(pool, p[0]), MP_EBUSY);
  cr_assert_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  cr_expect(lane(pool), "a pause ended the lane");
  for (int i = 0; i < n; i++)
    cr_assert_eq(mp_pool_free(pool, p[i]), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(pool).allocated_bytes, 0);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

/* In the lane, mp_pool_set_max_fraction lowered below what the arenas
 * hold gives nothing back, and cached memory still serves (as on the
 * arenas' path, and as in a pool without arenas): the first thread's
 * plain path gets its own cached block back, though another thread's arena
 * holds the whole new cap. */
Test(pool_arenas_auto, in_the_lane_a_lowered_cap_leaves_the_first_its_cache) {
  mp_pool_t *pool = make_pool(dev, "arenas=4,arenas_auto=1,max_bytes=32M");
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, 4 * MiB, NULL, &p), MP_OK, "%s",
               mp_last_error());
  int at = solo_at(pool);
  cr_assert(at >= 0);
  /* Another thread's arena starts the lane (mp_pool_alloc_contiguous
   * takes the arenas' path); a third thread's arena keeps 4 MiB live. */
  pieces_job_t pj = {.pool = pool};
  on_new_thread(do_pieces, &pj);
  cr_assert_eq(pj.st, MP_OK, "%s", pj.why);
  cr_assert(lane(pool));
  job_t j = {.pool = pool, .bytes = 4 * MiB, .tag = 3, .count = 1};
  cr_assert_eq(on_thread(&j, ALLOC), MP_OK, "%s", j.why);
  cr_assert(arena_holding(pool, j.ptrs[0]) != at);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK, "%s", mp_last_error());
  size_t reserved = stats(pool).reserved_bytes;
  /* 4 MiB of the device's 64: what the other arena holds. */
  cr_assert_eq(mp_pool_set_max_fraction(pool, 4.0 / 64), MP_OK, "%s",
               mp_last_error());
  void *q;
  cr_assert_eq(mp_pool_alloc(pool, 4 * MiB, NULL, &q), MP_OK,
               "the first thread's cached 4 MiB under a 4 MiB cap: %s",
               mp_last_error());
  cr_expect_eq(arena_holding(pool, q), at);
  cr_expect_eq(stats(pool).reserved_bytes, reserved, "nothing grew");
  cr_expect_eq(stats(pool).oom_count, 0);
  check(pool);
  cr_assert_eq(mp_pool_free(pool, q), MP_OK, "%s", mp_last_error());
  cr_assert_eq(on_thread(&j, FREE), MP_OK, "%s", j.why);
  for (int k = 0; k < 2; k++)
    cr_assert_eq(mp_pool_free(pool, pj.out[k]), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}
