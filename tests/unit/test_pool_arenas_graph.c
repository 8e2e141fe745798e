/* Graph pools of a pool with arenas (arenas=N, src/pool/graph.c): a stream
 * begun on one thread is routed on every thread, whichever arena it uses
 * and in arenas made during the capture; the calling thread's arena lends
 * the graph's ranges and takes each back at the release; the pool refuses
 * to pause, trim or be destroyed meanwhile, and the refusal changes
 * nothing; captures race other threads' allocations without handing graph
 * memory out, and a range given back leaves what its lender cached beside
 * it reusable. The contract shared with pools without arenas is
 * tests/integration/test_pool_arenas_graph.c. White-box: it reads the
 * arenas' stream marks and lent ranges. */
#include <criterion/criterion.h>
#include <stdatomic.h>

#include "../support/pool_helpers.h"
#include "../support/stream_gate.h"
#include "arena_workers.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_arenas_graph, "host:capacity=256M");

static mp_stream_t new_stream(void) {
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  return s;
}

static bool lent_at(mp_pool_t *a, uintptr_t p) {
  return mp__graph_owner(a, p) != NULL;
}

/* Not a range lent to a graph pool, whose first block shares its
 * address. */
static bool serves_at(mp_pool_t *a, uintptr_t p) {
  const mp__block_t *b = mp__map_find(a, p);
  return b != NULL && !(b->flags & MP__B_CHILD);
}

/* The index of the arena that lent the range holding p to a graph pool, or
 * -1. */
static int arena_lending(mp_pool_t *pool, const void *p) {
  return arena_where(pool, p, lent_at);
}

/* The index of the arena whose own live block p is, or -1. */
static int arena_serving(mp_pool_t *pool, const void *p) {
  return arena_where(pool, p, serves_at);
}

static size_t ranges_lent(mp_pool_t *pool, size_t i) {
  mp_pool_t *a = mp__arena_at(pool, i);
  mp__pool_lock(a);
  size_t n = a->ngranges;
  mp__pool_unlock(a);
  return n;
}

/* Every arena made has n slots marked capturing, and its cache is off
 * exactly while it has one. */
static void expect_marks(mp_pool_t *pool, uint32_t n) {
  for (size_t i = 0; i < pool->cfg.arenas; i++) {
    mp_pool_t *a = mp__arena_at(pool, i);
    if (a == NULL)
      continue;
    mp__pool_lock(a);
    cr_expect_eq(a->ncapturing, n, "arena %zu: %u streams capturing", i,
                 a->ncapturing);
    cr_expect_eq(a->cached_off, n > 0, "arena %zu: its cache %s", i,
                 a->cached_off ? "off" : "on");
    mp__pool_unlock(a);
  }
}

/* Nothing live, the pool checks clean and goes, and so do s1 and s2. */
static void expect_empty_and_destroy(mp_pool_t *pool, mp_stream_t s1,
                                     mp_stream_t s2) {
  mp_stats_t st = stats(pool);
  cr_expect_eq(st.allocated_bytes, 0);
  cr_expect_eq(st.live_blocks, 0);
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_stream_destroy(dev, s1);
  mp_stream_destroy(dev, s2);
}

Test(pool_arenas_graph, a_stream_begun_on_one_thread_is_routed_on_every_one) {
  mp_pool_t *pool = make_pool(dev, "arenas=4");
  mp_stream_t s1 = new_stream(), s2 = new_stream();
  /* wa's arena caches a block of the size it asks for next: a capture
   * must not take it. */
  cache_on_worker(pool, &wa, MiB);
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  cr_expect_eq(g->arenas, NULL, "the graph pool is one pool");
  cr_assert_eq(mp_pool_graph_begin(pool, g, s1), MP_OK, "%s", mp_last_error());
  expect_marks(pool, 1);
  job_t on_s1 = {.pool = pool, .bytes = MiB, .tag = 0x21, .count = 1, .s = s1};
  cr_assert_eq(on_worker(&wa, &on_s1, ALLOC), MP_OK, "%s", on_s1.why);
  cr_expect_eq(arena_serving(pool, on_s1.ptrs[0]), -1,
               "a captured allocation came from an arena's cache");
  cr_expect_eq(stats(g).live_blocks, 1);
  int lender = arena_lending(pool, on_s1.ptrs[0]);
  cr_assert_geq(lender, 0, "no arena lent the range");
  /* Another stream on the same thread: the arena, as before. */
  job_t on_s2 = {.pool = pool, .bytes = MiB, .tag = 0x22, .count = 1, .s = s2};
  cr_assert_eq(on_worker(&wa, &on_s2, ALLOC), MP_OK, "%s", on_s2.why);
  cr_expect_eq(arena_holding(pool, on_s2.ptrs[0]), lender,
               "s2 is not captured: wa's arena serves it");
  cr_expect_eq(stats(g).live_blocks, 1);
  /* A thread whose arena is made during the capture: its arena marks s1
   * too, and its allocation on s1 goes to the graph pool. */
  size_t before = arenas_made(pool);
  job_t late = {
      .pool = pool, .bytes = 2 * MiB, .tag = 0x23, .count = 1, .s = s1};
  cr_assert_eq(on_thread(&late, ALLOC), MP_OK, "%s", late.why);
  cr_expect_eq(arenas_made(pool), before + 1, "a new arena");
  expect_marks(pool, 1);
  cr_expect_eq(arena_serving(pool, late.ptrs[0]), -1);
  cr_expect_eq(stats(g).live_blocks, 2);
  cr_expect_eq(mp_pool_graph_of(pool, s1), g);
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_check(g), MP_OK, "%s", mp_last_error());
  /* Frees through the pool from this thread (its own arena): they land in
   * the graph pool. */
  cr_expect_eq(mp_pool_free(pool, on_s1.ptrs[0]), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_free(pool, late.ptrs[0]), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(g).live_blocks, 0);
  cr_assert_eq(mp_pool_graph_end(pool, s1), MP_OK, "%s", mp_last_error());
  expect_marks(pool, 0);
  cr_expect_null(mp_pool_graph_of(pool, s1));
  /* Off the capture, wa's cache serves it again. */
  job_t after = {.pool = pool, .bytes = MiB, .tag = 0x24, .count = 1, .s = s2};
  cr_assert_eq(on_worker(&wa, &after, ALLOC), MP_OK, "%s", after.why);
  cr_expect_eq(arena_holding(pool, after.ptrs[0]), lender);
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  cr_expect_eq(on_worker(&wa, &on_s2, FREE), MP_OK, "%s", on_s2.why);
  cr_expect_eq(on_worker(&wa, &after, FREE), MP_OK, "%s", after.why);
  worker_stop(&wa);
  expect_empty_and_destroy(pool, s1, s2);
}

Test(pool_arenas_graph, ranges_lent_by_two_arenas_go_back_to_each) {
  mp_pool_t *pool = make_pool(dev, "arenas=4");
  mp_stream_t s1 = new_stream(), s2 = new_stream();
  job_t a = {.pool = pool, .bytes = MiB, .tag = 0x31, .count = 1};
  job_t b = {.pool = pool, .bytes = MiB, .tag = 0x32, .count = 1};
  two_arenas(pool, &a, &b);
  int ia = arena_holding(pool, a.ptrs[0]), ib = arena_holding(pool, b.ptrs[0]);
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, g, s1), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, g, s2), MP_OK, "%s", mp_last_error());
  /* Each thread's growth of the graph pool borrows from its own arena; the
   * second request is larger than whatever the first range left free. */
  job_t ga = {.pool = pool, .bytes = 3 * MiB, .tag = 0x33, .count = 1, .s = s1};
  job_t gb = {
      .pool = pool, .bytes = 40 * MiB, .tag = 0x34, .count = 1, .s = s2};
  cr_assert_eq(on_worker(&wa, &ga, ALLOC), MP_OK, "%s", ga.why);
  cr_assert_eq(on_worker(&wb, &gb, ALLOC), MP_OK, "%s", gb.why);
  cr_expect_eq(arena_lending(pool, ga.ptrs[0]), ia);
  cr_expect_eq(arena_lending(pool, gb.ptrs[0]), ib);
  cr_expect_eq(ranges_lent(pool, (size_t)ia), 1);
  cr_expect_eq(ranges_lent(pool, (size_t)ib), 1);
  mp_stats_t gs = stats(g), ps = stats(pool);
  cr_expect_eq(ps.allocated_bytes, gs.reserved_bytes + 2 * MiB,
               "the ranges count as allocated in the arenas");
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  /* Each freed from the other thread: through the other arena, into the
   * graph pool. */
  cr_expect_eq(on_worker(&wb, &ga, FREE), MP_OK, "%s", ga.why);
  cr_expect_eq(on_worker(&wa, &gb, FREE), MP_OK, "%s", gb.why);
  cr_expect_eq(stats(g).live_blocks, 0);
  cr_assert_eq(mp_pool_graph_end(pool, s1), MP_OK);
  cr_assert_eq(mp_pool_graph_end(pool, s2), MP_OK);
  size_t reserved = stats(pool).reserved_bytes;
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  cr_expect_eq(ranges_lent(pool, (size_t)ia), 0);
  cr_expect_eq(ranges_lent(pool, (size_t)ib), 0);
  ps = stats(pool);
  cr_expect_eq(ps.reserved_bytes, reserved, "the ranges stay in the arenas");
  cr_expect_eq(ps.allocated_bytes, 2 * MiB);
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  /* wb's arena serves its 40 MiB again without growth, once s2's work is
   * done (the range went back as used on every stream the arena knows). */
  cr_assert_eq(mp_stream_synchronize(dev, s2), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  job_t again = {.pool = pool, .bytes = 40 * MiB, .tag = 0x35, .count = 1};
  cr_assert_eq(on_worker(&wb, &again, ALLOC), MP_OK, "%s", again.why);
  cr_expect_eq(stats(pool).reserved_bytes, reserved);
  cr_expect_eq(on_worker(&wb, &again, FREE), MP_OK, "%s", again.why);
  cr_expect_eq(on_worker(&wa, &a, FREE), MP_OK, "%s", a.why);
  cr_expect_eq(on_worker(&wb, &b, FREE), MP_OK, "%s", b.why);
  worker_stop(&wa);
  worker_stop(&wb);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_stream_destroy(dev, s1);
  mp_stream_destroy(dev, s2);
}

Test(pool_arenas_graph, pause_and_destroy_refuse_while_a_graph_pool_lives) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, MiB, NULL, &p), MP_OK);
  fill(p, MiB, 0x41);
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  mp_stats_t before = stats(pool);
  size_t made = arenas_made(pool);
  cr_expect_eq(mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT), MP_EBUSY);
  cr_expect(strstr(mp_last_error(), "graph pool") != NULL, "%s",
            mp_last_error());
  cr_expect_eq(mp_pool_destroy(pool), MP_EBUSY);
  cr_expect(strstr(mp_last_error(), "child pool") != NULL, "%s",
            mp_last_error());
  mp_stats_t after = stats(pool);
  cr_expect_eq(memcmp(&before, &after, sizeof before), 0, "stats changed");
  cr_expect_eq(arenas_made(pool), made, "an arena went");
  cr_expect_eq(first_difference(p, MiB, 0x41), MiB, "content changed");
  /* Both pools still work. */
  void *q;
  cr_assert_eq(mp_pool_alloc(g, MiB, NULL, &q), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, q), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(first_difference(p, MiB, 0x41), MiB, "content lost");
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

/* CUDA forbids waiting on a capturing stream: while one is captured, a
 * trim (which synchronizes the arena's streams) is refused, as in a pool
 * without arenas, and gives nothing back. */
Test(pool_arenas_graph, a_trim_during_a_capture_is_refused) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  mp_stream_t s1 = new_stream();
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, 4 * MiB, s1, &p), MP_OK);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, g, s1), MP_OK, "%s", mp_last_error());
  size_t reserved = stats(pool).reserved_bytes;
  cr_expect_eq(mp_pool_trim(pool, 0), MP_EBUSY);
  cr_expect_eq(stats(pool).reserved_bytes, reserved);
  cr_assert_eq(mp_pool_graph_end(pool, s1), MP_OK);
  cr_expect_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(pool).reserved_bytes, 0);
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_stream_destroy(dev, s1);
}

/* Captures on the main thread (create, begin, allocate, end, release) race
 * two threads allocating on another stream: no block of theirs comes from
 * a graph pool, no captured block from an arena, and the pool checks
 * clean after. Meant for TSan too. */
typedef struct racer {
  mp_pool_t *pool;
  mp_stream_t s;
  atomic_bool *stop;
  int stray; /* blocks found outside every arena */
  mp_status_t st;
} racer_t;

static void *racer_run(void *arg) {
  racer_t *r = arg;
  void *ptrs[4] = {0};
  for (unsigned n = 0; !atomic_load(r->stop) && r->st == MP_OK; n++) {
    size_t k = n % 4;
    if (ptrs[k] != NULL && (r->st = mp_pool_free(r->pool, ptrs[k])) != MP_OK)
      break;
    ptrs[k] = NULL;
    size_t bytes = ((size_t)(n % 7) + 1) * 512 * 1024;
    if ((r->st = mp_pool_alloc(r->pool, bytes, r->s, &ptrs[k])) != MP_OK)
      break;
    r->stray += arena_serving(r->pool, ptrs[k]) < 0;
  }
  for (size_t k = 0; k < 4; k++)
    if (ptrs[k] != NULL)
      (void)mp_pool_free(r->pool, ptrs[k]);
  return NULL;
}

Test(pool_arenas_graph, captures_race_allocations_on_other_threads) {
  mp_pool_t *pool = make_pool(dev, "arenas=4");
  mp_stream_t s1 = new_stream(), s2 = new_stream();
  atomic_bool stop = false;
  racer_t r[2] = {{pool, s2, &stop, 0, MP_OK}, {pool, NULL, &stop, 0, MP_OK}};
  pthread_t t[2];
  for (int i = 0; i < 2; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, racer_run, &r[i]), 0);
  int captured_in_arena = 0;
  for (int round = 0; round < 100; round++) {
    mp_pool_t *g;
    cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
    cr_assert_eq(mp_pool_graph_begin(pool, g, s1), MP_OK, "%s",
                 mp_last_error());
    void *x, *y;
    cr_assert_eq(mp_pool_alloc(pool, MiB, s1, &x), MP_OK, "%s",
                 mp_last_error());
    cr_assert_eq(mp_pool_alloc(pool, 3 * MiB, s1, &y), MP_OK, "%s",
                 mp_last_error());
    captured_in_arena += arena_serving(pool, x) >= 0;
    captured_in_arena += arena_serving(pool, y) >= 0;
    cr_assert_eq(mp_pool_free(pool, x), MP_OK, "%s", mp_last_error());
    cr_assert_eq(mp_pool_graph_end(pool, s1), MP_OK);
    cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
    /* The graph's output: its free finishes the graph pool. */
    cr_assert_eq(mp_pool_free(pool, y), MP_OK, "%s", mp_last_error());
  }
  atomic_store(&stop, true);
  for (int i = 0; i < 2; i++) {
    pthread_join(t[i], NULL);
    cr_expect_eq(r[i].st, MP_OK, "racer %d: %d", i, r[i].st);
    cr_expect_eq(r[i].stray, 0, "racer %d got %d blocks of a graph pool", i,
                 r[i].stray);
  }
  cr_expect_eq(captured_in_arena, 0);
  expect_marks(pool, 0);
  expect_empty_and_destroy(pool, s1, s2);
}

/* j's op on worker w, or on this thread where w is NULL. */
static mp_status_t here_or_on(worker_t *w, job_t *j, op_t op) {
  if (w != NULL)
    return on_worker(w, j, op);
  j->op = op;
  (void)job_run(j);
  return j->st;
}

/* rounds captures of s1, each allocating and freeing 1 MiB on worker w
 * (NULL: this thread), whose arena lends the range: none grows the pool. */
static void captures_reuse_the_cache(mp_pool_t *pool, mp_stream_t s1,
                                     worker_t *w, int rounds) {
  size_t reserved = stats(pool).reserved_bytes;
  for (int round = 0; round < rounds; round++) {
    /* s1's work done first: a graph pool borrows only memory no queued
     * work uses, s1's included (graph.c), and the last round's range and
     * frees wait for s1's markers, which the host device's stream thread
     * may not have reached on a busy machine (TSan in CI grew here). */
    cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
    mp_pool_t *g;
    cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
    cr_assert_eq(mp_pool_graph_begin(pool, g, s1), MP_OK, "%s",
                 mp_last_error());
    job_t in = {.pool = pool, .bytes = MiB, .tag = 0xc3, .count = 1, .s = s1};
    cr_assert_eq(here_or_on(w, &in, ALLOC), MP_OK, "%s", in.why);
    cr_expect_geq(arena_lending(pool, in.ptrs[0]), 0, "no arena lent it");
    cr_assert_eq(here_or_on(w, &in, FREE), MP_OK, "%s", in.why);
    cr_assert_eq(mp_pool_graph_end(pool, s1), MP_OK, "%s", mp_last_error());
    cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
    cr_expect_eq(stats(pool).reserved_bytes, reserved,
                 "round %d: the arena grew beside its cache", round);
  }
}

/* The race above, held still: a graph's range goes back to the lending
 * arena, which knows s2, while s2 runs behind (a gate), so the range waits
 * for s2. The memory the arena cached beside it must stay reusable: the
 * next capture's range comes from it, no growth. Merged into the range, it
 * waited for s2 too, the arena could not wait during the capture and grew
 * instead, at every round while the racers' streams ran behind, until the
 * device was full (the race's 3 MiB request failed so). */
Test(pool_arenas_graph, a_range_given_back_leaves_the_lenders_cache_free) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  mp_stream_t s1 = new_stream(), s2 = new_stream();
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, MiB, s2, &p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, 8 * MiB, s1, &p), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s2), MP_OK);
  gate_t gate;
  gate_init(&gate);
  cr_assert_eq(mp_stream_launch_host(dev, s2, gate_wait, &gate), MP_OK);
  captures_reuse_the_cache(pool, s1, NULL, 2);
  gate_open(&gate);
  cr_assert_eq(mp_stream_synchronize(dev, s2), MP_OK);
  gate_destroy(&gate);
  expect_empty_and_destroy(pool, s1, s2);
}

/* The scene of the two tests below: wb's arena met x and wa's arena
 * caches 8 MiB on s1; x then runs behind (gate) and is forgotten, so a
 * graph range wa's arena lends waits for a device sync when it goes back
 * (graph.c, mp__graph_give_back_to_arena). */
static void x_behind_and_forgotten(mp_pool_t *pool, mp_stream_t s1,
                                   mp_stream_t x, gate_t *gate) {
  worker_start(&wa);
  worker_start(&wb);
  job_t on_x = {.pool = pool, .bytes = MiB, .tag = 0xc1, .count = 1, .s = x};
  cr_assert_eq(on_worker(&wb, &on_x, ALLOC), MP_OK, "%s", on_x.why);
  cr_assert_eq(on_worker(&wb, &on_x, FREE), MP_OK, "%s", on_x.why);
  job_t cache = {
      .pool = pool, .bytes = 8 * MiB, .tag = 0xc2, .count = 1, .s = s1};
  cr_assert_eq(on_worker(&wa, &cache, ALLOC), MP_OK, "%s", cache.why);
  cr_assert_eq(on_worker(&wa, &cache, FREE), MP_OK, "%s", cache.why);
  cr_assert_eq(mp_stream_synchronize(dev, NULL), MP_OK);
  gate_init(gate);
  cr_assert_eq(mp_stream_launch_host(dev, x, gate_wait, gate), MP_OK);
  cr_assert_eq(mp_stream_forget(dev, x), MP_OK);
}

/* x_behind_and_forgotten's end: x catches up, and the trim synchronizes
 * the device, so the ranges rejoin the cache and all of it goes back. */
static void x_caught_up(mp_pool_t *pool, mp_stream_t s1, mp_stream_t s2,
                        mp_stream_t x, gate_t *gate) {
  gate_open(gate);
  cr_assert_eq(mp_stream_synchronize(dev, x), MP_OK);
  gate_destroy(gate);
  worker_stop(&wa);
  worker_stop(&wb);
  mp_stream_destroy(dev, x);
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(pool).reserved_bytes, 0);
  expect_empty_and_destroy(pool, s1, s2);
}

/* The same where the range must wait for a device synchronize: another
 * arena met x, which runs behind and is then forgotten, so the lender
 * cannot learn it (graph.c, mp__graph_give_back_to_arena). The range went
 * back marked for the next device sync and merged with the cache beside
 * it, which waited for that sync too; the arena cannot synchronize the
 * device during the next capture and grew instead. */
Test(pool_arenas_graph, a_range_waiting_for_a_device_sync_leaves_cache_free) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  mp_stream_t s1 = new_stream(), s2 = new_stream(), x = new_stream();
  gate_t gate;
  x_behind_and_forgotten(pool, s1, x, &gate);
  captures_reuse_the_cache(pool, s1, &wa, 3);
  x_caught_up(pool, s1, s2, x, &gate);
}

/* The same range, where the block beside it is freed after the range went
 * back: an arena of one stream frees on its plain path, which merged the
 * block (and the cache it also borders) into the range waiting for the
 * device sync, so the next captures, which cannot synchronize the device,
 * grew the arena. Now the plain free too keeps such a pair apart until the
 * sync. */
Test(pool_arenas_graph, a_free_beside_a_range_waiting_for_a_sync_stays_usable) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  mp_stream_t s1 = new_stream(), s2 = new_stream(), x = new_stream();
  gate_t gate;
  x_behind_and_forgotten(pool, s1, x, &gate);
  size_t reserved = stats(pool).reserved_bytes;
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, g, s1), MP_OK, "%s", mp_last_error());
  job_t in = {.pool = pool, .bytes = MiB, .tag = 0xd3, .count = 1, .s = s1};
  cr_assert_eq(on_worker(&wa, &in, ALLOC), MP_OK, "%s", in.why);
  cr_assert_eq(on_worker(&wa, &in, FREE), MP_OK, "%s", in.why);
  cr_assert_eq(mp_pool_graph_end(pool, s1), MP_OK, "%s", mp_last_error());
  /* Beside the range, from the cache, before the range goes back. */
  job_t beside = {.pool = pool, .bytes = MiB, .tag = 0xd4, .count = 1, .s = s1};
  cr_assert_eq(on_worker(&wa, &beside, ALLOC), MP_OK, "%s", beside.why);
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(on_worker(&wa, &beside, FREE), MP_OK, "%s", beside.why);
  cr_expect_eq(stats(pool).reserved_bytes, reserved);
  captures_reuse_the_cache(pool, s1, &wa, 2);
  cr_assert_eq(on_worker(&wa, &beside, ALLOC), MP_OK, "%s", beside.why);
  /* Only a device sync joins the pair: it owes no joining walk before
   * (one at every allocation that found no block, each over every block). */
  int i = arena_serving(pool, beside.ptrs[0]);
  cr_assert_geq(i, 0);
  mp_pool_t *a = mp__arena_at(pool, (size_t)i);
  mp__pool_lock(a);
  bool owed = a->merge_later;
  mp__pool_unlock(a);
  cr_expect_not(owed, "the arena walks its blocks again at each miss");
  cr_assert_eq(on_worker(&wa, &beside, FREE), MP_OK, "%s", beside.why);
  cr_expect_eq(stats(pool).reserved_bytes, reserved,
               "a block freed beside the range waited for the device sync");
  x_caught_up(pool, s1, s2, x, &gate);
}

/* Whether pool's stream table has a live slot for s (owner 0). */
static bool knows(mp_pool_t *pool, mp_stream_t s) {
  mp__pool_lock(pool);
  bool k = mp__stream_known(pool, s);
  mp__pool_unlock(pool);
  return k;
}

/* A capture marks its stream in every arena, adding it to arenas that did
 * not know it; at the end it goes again from those that never used it
 * (and from the pool itself, whose arenas made later would copy it), and
 * stays where a block used it. Taking a mark back never adds a slot. */
Test(pool_arenas_graph, a_capture_leaves_its_stream_only_where_it_was_used) {
  mp_pool_t *pool = make_pool(dev, "arenas=4");
  mp_stream_t s1 = new_stream(), s2 = new_stream();
  /* wa's arena holds a block live: busy, it lends nothing. */
  job_t held = {.pool = pool, .bytes = 4 * MiB, .tag = 0x50, .count = 1};
  worker_start(&wa);
  cr_assert_eq(on_worker(&wa, &held, ALLOC), MP_OK, "%s", held.why);
  int other = -1; /* wa's arena, the only one made */
  for (size_t i = 0; i < pool->cfg.arenas; i++)
    if (mp__arena_at(pool, i) != NULL)
      other = (int)i;
  cr_assert_geq(other, 0);
  mp_pool_t *wa_arena = mp__arena_at(pool, (size_t)other);
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, g, s1), MP_OK, "%s", mp_last_error());
  cr_expect(knows(wa_arena, s1), "marked in every arena");
  cr_expect(knows(pool, s1), "the pool carries the mark for later arenas");
  /* This thread's arena, made now, lends the graph's range on s1. */
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, MiB, s1, &p), MP_OK, "%s", mp_last_error());
  int mine = arena_lending(pool, p);
  cr_assert_geq(mine, 0);
  cr_assert_neq(mine, other);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_pool_graph_end(pool, s1), MP_OK, "%s", mp_last_error());
  expect_marks(pool, 0);
  cr_expect_not(knows(wa_arena, s1), "left in an arena that never used it");
  cr_expect_not(knows(pool, s1), "left in the pool itself");
  cr_expect(knows(mp__arena_at(pool, (size_t)mine), s1),
            "the lending arena's range was allocated on it");
  /* An arena made now does not get it either. */
  job_t late = {.pool = pool, .bytes = MiB, .tag = 0x51, .count = 1, .s = s2};
  cr_assert_eq(on_thread(&late, ALLOC), MP_OK, "%s", late.why);
  int l = arena_holding(pool, late.ptrs[0]);
  cr_assert_geq(l, 0);
  cr_expect_not(knows(mp__arena_at(pool, (size_t)l), s1));
  /* An end without a begin adds nothing anywhere. */
  cr_expect_eq(mp_pool_graph_end(pool, s1), MP_EINVAL);
  cr_expect_not(knows(wa_arena, s1));
  cr_assert_eq(mp_pool_free(pool, late.ptrs[0]), MP_OK);
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(on_worker(&wa, &held, FREE), MP_OK, "%s", held.why);
  worker_stop(&wa);
  expect_empty_and_destroy(pool, s1, s2);
}

/* The arena holding live block p. */
static mp_pool_t *arena_of(mp_pool_t *pool, const void *p) {
  int i = arena_holding(pool, p);
  cr_assert_geq(i, 0);
  return mp__arena_at(pool, (size_t)i);
}

/* With s1's work held back by a gate: does a block freed after all
 * streams in the calling thread's arena serve s2 while s1 may still use
 * it? (It must not.) */
static bool reused_while_s1_busy(mp_pool_t *pool, mp_stream_t s0,
                                 mp_stream_t s1, mp_stream_t s2) {
  gate_t gate;
  gate_init(&gate);
  cr_assert_eq(mp_stream_launch_host(dev, s1, gate_wait, &gate), MP_OK);
  void *y, *z;
  cr_assert_eq(mp_pool_alloc(pool, 3 * MiB, s0, &y), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free_after_all(pool, y), MP_OK); /* y used on s1 */
  cr_assert_eq(mp_stream_synchronize(dev, s0), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, 3 * MiB, s2, &z), MP_OK, "%s",
               mp_last_error());
  bool reused =
      (char *)z < (char *)y + 3 * MiB && (char *)y < (char *)z + 3 * MiB;
  gate_open(&gate);
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  cr_assert_eq(mp_pool_free(pool, z), MP_OK);
  gate_destroy(&gate);
  return reused;
}

/* A stream the application names during a capture, through
 * mp_pool_add_stream or a block's record_stream, is a stream the pool met:
 * it stays after the capture (it was dropped with the capture's mark, and
 * a later free after all streams did not wait for it: the block served
 * another stream while s1 still used it). */
static void named_during_a_capture(bool add) {
  mp_pool_t *pool = make_pool(dev, "arenas=4");
  mp_stream_t s0 = new_stream(), s1 = new_stream(), s2 = new_stream();
  void *keep, *x;
  cr_assert_eq(mp_pool_alloc(pool, MiB, s0, &keep), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, MiB, s0, &x), MP_OK, "%s", mp_last_error());
  mp_pool_t *mine = arena_of(pool, x);
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, g, s1), MP_OK, "%s", mp_last_error());
  if (add)
    cr_assert_eq(mp_pool_add_stream(pool, s1), MP_OK, "%s", mp_last_error());
  else
    cr_assert_eq(mp_pool_record_stream(pool, x, s1), MP_OK, "%s",
                 mp_last_error());
  cr_assert_eq(mp_pool_free(pool, x), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_end(pool, s1), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  cr_expect(knows(mine, s1), "the arena forgot s1");
  if (add)
    cr_expect(knows(pool, s1), "the pool forgot a stream it was given");
  cr_expect_not(reused_while_s1_busy(pool, s0, s1, s2),
                "a block freed after all streams served s2 while s1 used it");
  cr_assert_eq(mp_pool_free(pool, keep), MP_OK);
  mp_stream_destroy(dev, s0);
  expect_empty_and_destroy(pool, s1, s2);
}

Test(pool_arenas_graph, a_stream_added_during_a_capture_stays) {
  named_during_a_capture(true);
}

Test(pool_arenas_graph, a_stream_a_block_used_during_a_capture_stays) {
  named_during_a_capture(false);
}

/* Each capture's slot, dropped at its end, serves the next capture: the
 * table does not grow with captures, even where the head of the list of
 * forgotten slots is held by destroyed streams whose blocks still live
 * (the new slot, put at its end, was never looked at again). */
Test(pool_arenas_graph, captures_reuse_their_slots) {
  mp_pool_t *pool = make_pool(dev, "arenas=4");
  void *held[8];
  for (int i = 0; i < 8; i++) {
    mp_stream_t t = new_stream();
    cr_assert_eq(mp_pool_alloc(pool, 4096, t, &held[i]), MP_OK, "%s",
                 mp_last_error());
    cr_assert_eq(mp_stream_destroy(dev, t), MP_OK);
  }
  mp_pool_t *mine = arena_of(pool, held[0]);
  mp_stream_t s1 = new_stream(), s2 = new_stream();
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  mp__pool_lock(mine);
  uint32_t before = mine->nstreams;
  mp__pool_unlock(mine);
  for (int r = 0; r < 100; r++) {
    cr_assert_eq(mp_pool_graph_begin(pool, g, r % 2 ? s1 : s2), MP_OK, "%s",
                 mp_last_error());
    cr_assert_eq(mp_pool_graph_end(pool, r % 2 ? s1 : s2), MP_OK, "%s",
                 mp_last_error());
  }
  mp__pool_lock(mine);
  uint32_t after = mine->nstreams;
  mp__pool_unlock(mine);
  cr_expect_leq(after, before + 1, "100 captures: %u slots, then %u", before,
                after);
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  for (int i = 0; i < 8; i++)
    cr_assert_eq(mp_pool_free(pool, held[i]), MP_OK);
  expect_empty_and_destroy(pool, s1, s2);
}

/* mp_pool_free_after_all names every stream the arena knows, a capture's
 * mark slot too: that is a use, and the slot stays after the capture.
 * Here the block stays live (imported elsewhere) with its use on s1. It
 * stayed a mark-only slot used by a block: mp_pool_check reported
 * corruption, and the end dropped a slot a live block named. */
Test(pool_arenas_graph, a_free_after_all_streams_during_a_capture_keeps_it) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  mp_stream_t s0 = new_stream(), s1 = new_stream(), s2 = new_stream();
  void *x;
  cr_assert_eq(mp_pool_alloc(pool, 2 * MiB, s0, &x), MP_OK, "%s",
               mp_last_error());
  mp_pool_t *mine = arena_of(pool, x);
  mp_ipc_handle_t h;
  cr_assert_eq(mp_pool_ipc_export(pool, x, &h), MP_OK, "%s", mp_last_error());
  void *imported = NULL;
  cr_assert_eq(mp_ipc_import(dev, &h, &imported), MP_OK, "%s", mp_last_error());
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, g, s1), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free_after_all(pool, x), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_end(pool, s1), MP_OK, "%s", mp_last_error());
  cr_expect(knows(mine, s1), "a stream a live block uses was dropped");
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_close(dev, imported), MP_OK, "%s", mp_last_error());
  size_t held = SIZE_MAX;
  cr_assert_eq(mp_pool_ipc_poll(pool, &held), MP_OK, "%s", mp_last_error());
  cr_expect_eq(held, 0);
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  mp_stream_destroy(dev, s0);
  expect_empty_and_destroy(pool, s1, s2);
}

/* A graph pool's growth on s1 asks an idle arena for a loan first. The
 * arena knows s1 only by the capture's mark: a loan that misses (its
 * cached block still pending on s0) must leave s1 as it found it, gone
 * after the capture. The lookup before the take counted as a use, and s1
 * stayed in an arena that never served it. */
Test(pool_arenas_graph, a_loan_that_misses_leaves_no_stream_behind) {
  mp_pool_t *pool = make_pool(dev, "arenas=4");
  mp_stream_t s0 = new_stream(), s1 = new_stream(), s2 = new_stream();
  job_t cached = {
      .pool = pool, .bytes = 32 * MiB, .tag = 0x61, .count = 1, .s = s0};
  worker_start(&wa);
  cr_assert_eq(on_worker(&wa, &cached, ALLOC), MP_OK, "%s", cached.why);
  mp_pool_t *lender = arena_of(pool, cached.ptrs[0]);
  int li = arena_holding(pool, cached.ptrs[0]);
  /* Its free on s0 stays pending behind the gate. */
  gate_t gate;
  gate_init(&gate);
  cr_assert_eq(mp_stream_launch_host(dev, s0, gate_wait, &gate), MP_OK);
  cr_assert_eq(on_worker(&wa, &cached, FREE), MP_OK, "%s", cached.why);
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, g, s1), MP_OK, "%s", mp_last_error());
  cr_expect(knows(lender, s1), "marked");
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, 4 * MiB, s1, &p), MP_OK, "%s",
               mp_last_error());
  cr_expect_neq(arena_lending(pool, p), li, "the pending block was lent");
  cr_assert_eq(mp_pool_free(pool, p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_end(pool, s1), MP_OK, "%s", mp_last_error());
  cr_expect_not(knows(lender, s1),
                "a loan that missed left s1 in the arena that was asked");
  gate_open(&gate);
  cr_assert_eq(mp_stream_synchronize(dev, s0), MP_OK);
  gate_destroy(&gate);
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  worker_stop(&wa);
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  mp_stream_destroy(dev, s0);
  expect_empty_and_destroy(pool, s1, s2);
}

/* While s1 is captured, another stream's allocation that the arena's cache
 * serves takes that arena's lock only: a thread holding the pool's own lock
 * (here the test, as a graph_begin or a lookup of another thread would)
 * does not hold it back. Every allocation of every thread took the pool's
 * lock while any capture ran. */
Test(pool_arenas_graph, another_stream_during_a_capture_takes_no_pool_lock) {
  mp_pool_t *pool = make_pool(dev, "arenas=4");
  mp_stream_t s1 = new_stream(), s2 = new_stream();
  cache_on_worker(pool, &wa, MiB);
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, g, s1), MP_OK, "%s", mp_last_error());
  expect_marks(pool, 1);
  job_t on_s2 = {.pool = pool, .bytes = MiB, .tag = 0x71, .count = 1, .s = s2};
  mp__pool_lock(pool);
  bool ran = on_worker_within(&wa, &on_s2, ALLOC, 5000);
  mp__pool_unlock(pool);
  cr_assert_eq(on_worker_wait(&wa, &on_s2), MP_OK, "%s", on_s2.why);
  cr_expect(ran, "the allocation on s2 waited 5 s for the pool's lock");
  cr_expect_geq(arena_serving(pool, on_s2.ptrs[0]), 0,
                "the arena's cache did not serve s2");
  cr_expect_eq(stats(g).live_blocks, 0);
  cr_expect_eq(on_worker(&wa, &on_s2, FREE), MP_OK, "%s", on_s2.why);
  cr_assert_eq(mp_pool_graph_end(pool, s1), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  worker_stop(&wa);
  expect_empty_and_destroy(pool, s1, s2);
}

/* Whether arena a holds memory at base. */
static bool reserved_at(mp_pool_t *a, uintptr_t base) {
  mp__pool_lock(a);
  bool r = false;
  for (mp__segment_t *g = a->segs; g != NULL; g = g->next)
    r |= g->base <= base && base < g->base + g->size;
  mp__pool_unlock(a);
  return r;
}

/* wa allocates [base, base + size)'s size on s2 while gate holds back
 * stream x: it must get other memory; then the gate opens, x's work ends
 * and the block goes. */
static void range_kept_until_gate(mp_pool_t *pool, uintptr_t base, size_t size,
                                  mp_stream_t s2, gate_t *gate, mp_stream_t x) {
  job_t again = {.pool = pool, .bytes = size, .tag = 0x83, .count = 1, .s = s2};
  cr_assert_eq(on_worker(&wa, &again, ALLOC), MP_OK, "%s", again.why);
  uintptr_t q = (uintptr_t)again.ptrs[0];
  cr_expect(q >= base + size || base >= q + size,
            "the range served s2 while work held back on %p ran", (void *)x);
  gate_open(gate);
  cr_assert_eq(mp_stream_synchronize(dev, x), MP_OK);
  gate_destroy(gate);
  cr_expect_eq(on_worker(&wa, &again, FREE), MP_OK, "%s", again.why);
}

/* wb's arena meets x (a block allocated and freed there); then *g, a graph
 * pool capturing s1, gets ga's 3 MiB block on wa: returns the index of the
 * arena that lent its range. */
static int lent_beside_x(mp_pool_t *pool, mp_stream_t x, mp_stream_t s1,
                         mp_pool_t **g, job_t *ga) {
  job_t on_x = {.pool = pool, .bytes = MiB, .tag = 0x81, .count = 1, .s = x};
  cr_assert_eq(on_worker(&wb, &on_x, ALLOC), MP_OK, "%s", on_x.why);
  cr_assert_eq(on_worker(&wb, &on_x, FREE), MP_OK, "%s", on_x.why);
  cr_assert_eq(mp_stream_synchronize(dev, x), MP_OK);
  cr_assert_eq(mp_pool_graph_create(pool, g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, *g, s1), MP_OK, "%s", mp_last_error());
  *ga =
      (job_t){.pool = pool, .bytes = 3 * MiB, .tag = 0x82, .count = 1, .s = s1};
  cr_assert_eq(on_worker(&wa, ga, ALLOC), MP_OK, "%s", ga->why);
  int lender = arena_lending(pool, ga->ptrs[0]);
  cr_assert_geq(lender, 0);
  return lender;
}

/* A released graph's replays may run on any stream the pool knows, also
 * one only another arena has met: the range goes back to the lending arena
 * waiting for that stream's work too. It went back as used only on the
 * lender's own streams, and served another stream while a replay on x
 * still ran. */
static void range_waits_for_x(bool forget) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  mp_stream_t s1 = new_stream(), s2 = new_stream(), x = new_stream();
  worker_start(&wa);
  worker_start(&wb);
  /* x: met by wb's arena only. */
  mp_pool_t *g;
  job_t ga;
  int lender = lent_beside_x(pool, x, s1, &g, &ga);
  uintptr_t base = g->segs->base;
  size_t size = g->segs->size;
  cr_assert_eq(mp_pool_graph_end(pool, s1), MP_OK, "%s", mp_last_error());
  /* A replay of the graph on x, still running at the release. */
  gate_t gate;
  gate_init(&gate);
  cr_assert_eq(mp_stream_launch_host(dev, x, gate_wait, &gate), MP_OK);
  cr_assert_eq(on_worker(&wa, &ga, FREE), MP_OK, "%s", ga.why);
  if (forget) /* its work still queued: a handle no arena can learn */
    cr_assert_eq(mp_stream_forget(dev, x), MP_OK);
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, NULL), MP_OK);
  range_kept_until_gate(pool, base, size, s2, &gate, x);
  /* Once x's work is done, the lender serves the range's size from it. */
  job_t later = {.pool = pool, .bytes = size, .tag = 0x84, .count = 1, .s = s2};
  cr_assert_eq(on_worker(&wa, &later, ALLOC), MP_OK, "%s", later.why);
  cr_expect_eq(arena_holding(pool, later.ptrs[0]), lender);
  cr_expect_eq(on_worker(&wa, &later, FREE), MP_OK, "%s", later.why);
  worker_stop(&wa);
  worker_stop(&wb);
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  mp_stream_destroy(dev, x);
  expect_empty_and_destroy(pool, s1, s2);
}

Test(pool_arenas_graph, a_released_range_waits_for_streams_other_arenas_met) {
  range_waits_for_x(false);
}

/* The same with x forgotten (its work still queued) before the release:
 * the lender cannot learn it, and waits for a device synchronize. The
 * other arena's forgotten slot was passed over. */
Test(pool_arenas_graph, a_released_range_waits_for_a_forgotten_stream_too) {
  range_waits_for_x(true);
}

/* An arena that runs out during a capture takes back what another arena
 * caches: that arena never used the captured stream (its slot is the
 * capture's mark only), so its synchronization is not refused. Every
 * arena's was while any stream was captured, and a 60 MiB request failed
 * beside 100 MiB cached. */
Test(pool_arenas_graph, a_capture_leaves_other_arenas_cache_reclaimable) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  mp_stream_t s1 = new_stream(), s2 = new_stream();
  worker_start(&wa);
  worker_start(&wb);
  /* wa's arena: 120 MiB live (busy: it lends nothing) and 100 MiB cached,
   * of a 256 MiB device. */
  job_t keep = {.pool = pool, .bytes = 120 * MiB, .tag = 0x91, .count = 1};
  job_t cached = {.pool = pool, .bytes = 100 * MiB, .tag = 0x92, .count = 1};
  cr_assert_eq(on_worker(&wa, &keep, ALLOC), MP_OK, "%s", keep.why);
  cr_assert_eq(on_worker(&wa, &cached, ALLOC), MP_OK, "%s", cached.why);
  cr_assert_eq(on_worker(&wa, &cached, FREE), MP_OK, "%s", cached.why);
  cr_assert_eq(mp_stream_synchronize(dev, NULL), MP_OK);
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, g, s1), MP_OK, "%s", mp_last_error());
  job_t other = {.pool = pool, .bytes = 60 * MiB, .tag = 0x93, .count = 1};
  cr_expect_eq(on_worker(&wb, &other, ALLOC), MP_OK, "%s", other.why);
  if (other.st == MP_OK)
    cr_expect_eq(on_worker(&wb, &other, FREE), MP_OK, "%s", other.why);
  /* The captured stream's growth in wb's arena's graph pool too. */
  job_t capt = {
      .pool = pool, .bytes = 30 * MiB, .tag = 0x94, .count = 1, .s = s1};
  cr_expect_eq(on_worker(&wb, &capt, ALLOC), MP_OK, "%s", capt.why);
  if (capt.st == MP_OK)
    cr_expect_eq(on_worker(&wb, &capt, FREE), MP_OK, "%s", capt.why);
  cr_assert_eq(mp_pool_graph_end(pool, s1), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  cr_expect_eq(on_worker(&wa, &keep, FREE), MP_OK, "%s", keep.why);
  worker_stop(&wa);
  worker_stop(&wb);
  expect_empty_and_destroy(pool, s1, s2);
}

/* A forget of x under way at a graph release, past the lender's watcher
 * but not yet the arena that met x: the lender must not learn x (it would
 * hold a destroyed stream as live, never told it went). The watcher `hold`
 * sits between the two arenas' and waits there up to 1 s for the lender to
 * learn x. A count of forgets begun alone, read while one was under way,
 * let the lender learn it. */
typedef struct {
  mp_stream_t x;
  mp_pool_t *lender;
  atomic_int reached;
} hold_t;

static bool met_live(mp_pool_t *a, mp_stream_t s) {
  mp__pool_lock(a);
  bool live = false;
  for (uint32_t i = 0; i < a->nstreams; i++)
    live |= a->streams[i].s == s && !a->streams[i].gone;
  mp__pool_unlock(a);
  return live;
}

static void hold_watch(void *ctx, mp_stream_t s) {
  hold_t *h = ctx;
  if (s != h->x)
    return;
  atomic_store(&h->reached, 1);
  for (int i = 0; i < 100 && !met_live(h->lender, h->x); i++) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

static void *forget_x(void *arg) {
  hold_t *h = arg;
  mp_stream_forget(dev, h->x);
  return NULL;
}

static void *release_graph(void *arg) {
  mp_pool_graph_release(arg);
  return NULL;
}

Test(pool_arenas_graph, a_release_learns_no_stream_being_forgotten) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  mp_stream_t s1 = new_stream(), s2 = new_stream(), x = new_stream();
  worker_start(&wa);
  job_t w0 = {.pool = pool, .bytes = MiB, .tag = 0xa1, .count = 1, .s = s2};
  cr_assert_eq(on_worker(&wa, &w0, ALLOC), MP_OK, "%s", w0.why);
  cr_assert_eq(on_worker(&wa, &w0, FREE), MP_OK, "%s", w0.why);
  /* wa's arena, made before the watcher: told of forgets before it. */
  hold_t h = {.x = x};
  cr_assert_eq(mp__device_watch(dev, hold_watch, &h), MP_OK);
  /* wb's arena, made after the watcher: told of forgets after it. */
  worker_start(&wb);
  mp_pool_t *g;
  job_t ga;
  int lender = lent_beside_x(pool, x, s1, &g, &ga);
  h.lender = mp__arena_at(pool, (size_t)lender);
  cr_assert_eq(mp_pool_graph_end(pool, s1), MP_OK, "%s", mp_last_error());
  cr_assert_eq(on_worker(&wa, &ga, FREE), MP_OK, "%s", ga.why);
  pthread_t tf, tr;
  cr_assert_eq(pthread_create(&tf, NULL, forget_x, &h), 0);
  while (!atomic_load(&h.reached))
    sched_yield();
  cr_assert_eq(pthread_create(&tr, NULL, release_graph, g), 0);
  pthread_join(tf, NULL);
  pthread_join(tr, NULL);
  mp__device_unwatch(dev, hold_watch, &h);
  cr_expect_not(met_live(h.lender, x),
                "the lender holds the forgotten stream as live");
  worker_stop(&wa);
  worker_stop(&wb);
  mp_stream_destroy(dev, x);
  cr_expect_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  expect_empty_and_destroy(pool, s1, s2);
}

/* *g, a graph pool whose capture of s1 got a 3 MiB block on wa (freed,
 * the capture ended): its range [*base, *base + *size), lent by the arena
 * returned. */
static mp_pool_t *graph_range_on_wa(mp_pool_t *pool, mp_stream_t s1,
                                    mp_pool_t **g, uintptr_t *base,
                                    size_t *size) {
  cr_assert_eq(mp_pool_graph_create(pool, g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, *g, s1), MP_OK, "%s", mp_last_error());
  job_t ga = {.pool = pool, .bytes = 3 * MiB, .tag = 0xb1, .count = 1, .s = s1};
  cr_assert_eq(on_worker(&wa, &ga, ALLOC), MP_OK, "%s", ga.why);
  int li = arena_lending(pool, ga.ptrs[0]);
  cr_assert_geq(li, 0);
  *base = (*g)->segs->base;
  *size = (*g)->segs->size;
  cr_assert_eq(on_worker(&wa, &ga, FREE), MP_OK, "%s", ga.why);
  cr_assert_eq(mp_pool_graph_end(pool, s1), MP_OK, "%s", mp_last_error());
  return mp__arena_at(pool, (size_t)li);
}

/* A range given back to an arena during a capture of a stream y that the
 * arena knows only through the capture's mark: it waits for y's work from
 * before the capture (a replay may run there), and the slot goes with the
 * mark, as a slot only a capture held. */
Test(pool_arenas_graph, a_range_released_during_a_capture_waits_for_it) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  mp_stream_t s1 = new_stream(), s2 = new_stream(), y = new_stream();
  worker_start(&wa);
  mp_pool_t *g, *g2;
  uintptr_t base;
  size_t size;
  mp_pool_t *lender = graph_range_on_wa(pool, s1, &g, &base, &size);
  /* A replay of g on y, held back; then y is captured. */
  gate_t gate;
  gate_init(&gate);
  cr_assert_eq(mp_stream_launch_host(dev, y, gate_wait, &gate), MP_OK);
  cr_assert_eq(mp_pool_graph_create(pool, &g2), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, g2, y), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  /* The lender's slot for y, a mark's, now holds the range's work: no
   * sync (it would count y's epoch done) while y is captured. */
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  (void)mp_pool_trim(pool, 0);
  cr_expect(reserved_at(lender, base),
            "a trim gave the range back while y's work ran");
  cr_assert_eq(mp_pool_graph_end(pool, y), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g2), MP_OK, "%s", mp_last_error());
  cr_expect_not(knows(lender, y), "y stayed in the lending arena");
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  range_kept_until_gate(pool, base, size, s2, &gate, y);
  worker_stop(&wa);
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  mp_stream_destroy(dev, y);
  expect_empty_and_destroy(pool, s1, s2);
}

/* The same, but the capture's end can record no marker on y (no event:
 * host memory fails meanwhile). The lender's slot for y, whose open epoch
 * holds the range's work, stays a stream the arena met: a later sync
 * outside y's capture, here a trim during another capture, asks y and
 * gives the range back. Forgotten without a marker, only a device
 * synchronize outside every capture would free it, and the trim was
 * MP_EBUSY. */
Test(pool_arenas_graph, a_capture_end_without_a_marker_keeps_the_stream) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  mp_stream_t s1 = new_stream(), s3 = new_stream(), y = new_stream();
  worker_start(&wa);
  mp_pool_t *g, *g2, *g3;
  uintptr_t base;
  size_t size;
  mp_pool_t *lender = graph_range_on_wa(pool, s1, &g, &base, &size);
  cr_assert_eq(mp_pool_graph_create(pool, &g2), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, g2, y), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  /* No cached event in the lender, and none to be made: its close of y
   * at the end records nothing. */
  mp__pool_lock(lender);
  while (lender->nevents > 0)
    mp_event_destroy(dev, lender->events[--lender->nevents]);
  mp__pool_unlock(lender);
  mp__fault_host_every(true);
  mp_status_t end = mp_pool_graph_end(pool, y);
  mp__fault_host_every(false);
  cr_assert_eq(end, MP_OK, "%s", mp_last_error());
  cr_expect(knows(lender, y), "y went without the marker its range waits on");
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g2), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_synchronize(dev, y), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  cr_assert_eq(mp_pool_graph_create(pool, &g3), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, g3, s3), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  cr_expect_not(reserved_at(lender, base), "the range stayed reserved");
  cr_assert_eq(mp_pool_graph_end(pool, s3), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g3), MP_OK, "%s", mp_last_error());
  worker_stop(&wa);
  mp_stream_destroy(dev, y);
  expect_empty_and_destroy(pool, s1, s3);
}
