/* Host-memory failures in the pool's bookkeeping (fault.c): for k = 0, 1,
 * 2, ... the k-th host allocation of an operation fails, until one k lets
 * it through. Every failure must be MP_ENOMEM with a message that says host
 * memory ran out, change nothing a caller sees (live blocks, bytes
 * allocated), leave the pool consistent (mp_pool_check), leak nothing (the
 * ASan run), and the same operation must work once the fault is gone.
 * Covered: pool create (with a history ring), the first allocation
 * (stream table, segment and block records, live map), virtual-range
 * growth (chunk and hole tables), record slabs and live-map growth under
 * many live blocks, stream-table growth, graph pools (create, begin,
 * growth borrowed from the parent), and frees (which need no host memory:
 * they always succeed), and snapshots (to a FILE and to a path: no
 * buffer freed twice, no temporary left behind). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../support/pool_helpers.h"
#include "../support/stream_gate.h"
#include "join_scene.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

typedef mp_status_t (*op_fn)(mp_pool_t *p, void *ctx);

/* What a failed operation must leave as it was. */
typedef struct seen {
  size_t live_blocks, allocated_bytes, requested_bytes;
} seen_t;

static seen_t seen_of(mp_pool_t *p) {
  mp_stats_t s = stats(p);
  return (seen_t){s.live_blocks, s.allocated_bytes, s.requested_bytes};
}

/* Runs op with the k-th host allocation failing, k = 0, 1, ..., until it
 * succeeds (the fault then may not have fired: it is disarmed). Returns how
 * many tries failed. */
static int until_ok(mp_pool_t *p, op_fn op, void *ctx) {
  for (long k = 0; k < 10000; k++) {
    seen_t before = seen_of(p);
    mp__fault_host_after(k);
    mp_status_t st = op(p, ctx);
    bool fired = !mp__fault_host_pending();
    mp__fault_host_after(-1);
    if (st == MP_OK)
      return (int)k;
    cr_assert(fired, "k=%ld: status %d without the fault firing: %s", k, st,
              mp_last_error());
    cr_assert_eq(st, MP_ENOMEM, "k=%ld: status %d: %s", k, st, mp_last_error());
    cr_assert(strstr(mp_last_error(), "host memory") != NULL,
              "k=%ld: unclear message '%s'", k, mp_last_error());
    check(p);
    seen_t after = seen_of(p);
    cr_assert(memcmp(&before, &after, sizeof before) == 0,
              "k=%ld: a failed operation changed the live blocks", k);
  }
  cr_assert_fail("the operation never succeeded");
  return -1;
}

typedef struct allocs {
  void **ptrs;
  size_t n, size;
  mp_stream_t *streams; /* NULL: the default stream */
} allocs_t;

/* Allocates the next block of a->ptrs. */
static mp_status_t alloc_next(mp_pool_t *p, void *ctx) {
  allocs_t *a = ctx;
  mp_stream_t s = a->streams ? a->streams[a->n] : NULL;
  mp_status_t st = mp_pool_alloc(p, a->size, s, &a->ptrs[a->n]);
  if (st == MP_OK)
    a->n++;
  return st;
}

static void free_all(mp_pool_t *p, allocs_t *a) {
  for (size_t i = 0; i < a->n; i++)
    cr_assert_eq(mp_pool_free(p, a->ptrs[i]), MP_OK, "%s", mp_last_error());
  a->n = 0;
}

Test(pool_host_faults, create_fails_cleanly_until_host_memory_suffices) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_assert_eq(mp_pool_config_parse(&cfg, "history=64,history_stacks=1"), MP_OK,
               "%s", mp_last_error());
  int failed = 0;
  mp_pool_t *p = NULL;
  for (long k = 0;; k++) {
    mp__fault_host_after(k);
    mp_status_t st = mp_pool_create(dev, &cfg, &p);
    mp__fault_host_after(-1);
    if (st == MP_OK)
      break;
    cr_assert_eq(st, MP_ENOMEM, "k=%ld: %s", k, mp_last_error());
    cr_assert(strstr(mp_last_error(), "host memory") != NULL, "'%s'",
              mp_last_error());
    cr_assert_eq(fake_of(dev)->used, 0);
    failed++;
  }
  cr_expect_geq(failed, 3, "the pool, its history and its stacks");
  void *x;
  cr_assert_eq(mp_pool_alloc(p, 4096, NULL, &x), MP_OK);
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  check(p);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  cr_expect_eq(fake_of(dev)->used, 0);
  fake_close(dev);
}

/* The first allocation of a pool: its stream table, the segment, the block
 * records (a slab; the free index's nodes are the records) and the live
 * map all come then. */
static void first_alloc(size_t granule, const char *opts, int min_failed) {
  mp_device_t *dev = fake_open((size_t)1 << 30, granule);
  mp_pool_t *p = make_pool(dev, opts);
  void *ptrs[1];
  allocs_t a = {ptrs, 0, 4096, NULL};
  int failed = until_ok(p, alloc_next, &a);
  cr_expect_geq(failed, min_failed, "stream table, records, map at least");
  cr_assert_eq(a.n, 1);
  check(p);
  free_all(p, &a);
  check(p);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  cr_expect_eq(fake_of(dev)->used, 0);
  fake_close(dev);
}

Test(pool_host_faults, first_alloc_of_a_plain_pool) {
  first_alloc(0, NULL, 3);
}

Test(pool_host_faults, first_alloc_of_a_virtual_pool) {
  first_alloc(2 * MiB, "virtual=1", 3);
}

/* With arenas the first allocation of a thread also makes its arena (a
 * pool, its virtual range): a failure there is MP_ENOMEM as well. (Later
 * failures inside the arena are retried by its out-of-memory path.) */
Test(pool_host_faults, first_alloc_of_a_pool_with_arenas) {
  first_alloc(2 * MiB, "virtual=1,arenas=1", 2);
}

/* Many live blocks: record slabs (256 records each) and the live map
 * (doubling at half full) grow; every allocation goes through the ladder
 * of faults. */
static void many_live(size_t granule, const char *opts, size_t size, size_t n) {
  mp_device_t *dev = fake_open((size_t)8 << 30, granule);
  mp_pool_t *p = make_pool(dev, opts);
  void **ptrs = calloc(n, sizeof *ptrs);
  allocs_t a = {ptrs, 0, size, NULL};
  int failed = 0;
  while (a.n < n)
    failed += until_ok(p, alloc_next, &a);
  cr_expect_geq(failed, 4, "growth of the tables failed %d times", failed);
  check(p);
  free_all(p, &a);
  check(p);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  cr_expect_eq(fake_of(dev)->used, 0);
  free(ptrs);
  fake_close(dev);
}

Test(pool_host_faults, record_slabs_and_live_map_grow_under_faults) {
  many_live(0, NULL, 4096, 600);
}

Test(pool_host_faults, virtual_range_tables_grow_under_faults) {
  /* 2 MiB blocks in a pool of 2 MiB steps: a mapped chunk each, so the
   * chunk table (16, then doubling) grows. */
  many_live(2 * MiB, "virtual=1,segment_bytes=2M", 2 * MiB, 40);
}

/* n blocks of size, every other one freed and the free chunks trimmed
 * (holes in the middle of the range: the hole table), then n/2 blocks of
 * size2 grown into them, under faults each time. */
static void holes_under_faults(const char *opts, size_t n, size_t size,
                               size_t size2) {
  mp_device_t *dev = fake_open((size_t)8 << 30, 2 * MiB);
  mp_pool_t *p = make_pool(dev, opts);
  void **ptrs = calloc(n, sizeof *ptrs), **again = calloc(n, sizeof *again);
  allocs_t a = {ptrs, 0, size, NULL};
  int failed = 0;
  while (a.n < n)
    failed += until_ok(p, alloc_next, &a);
  cr_expect_geq(failed, 2, "the chunk table grew (16, 32) under faults");
  for (size_t i = 0; i < n; i += 2)
    cr_assert_eq(mp_pool_free(p, ptrs[i]), MP_OK);
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK, "%s", mp_last_error());
  check(p);
  cr_expect_eq(stats(p).reserved_bytes, n / 2 * size,
               "the free chunks went back");
  allocs_t b = {again, 0, size2, NULL};
  while (b.n < n / 2)
    (void)until_ok(p, alloc_next, &b);
  check(p);
  free_all(p, &b);
  for (size_t i = 1; i < n; i += 2)
    cr_assert_eq(mp_pool_free(p, ptrs[i]), MP_OK);
  check(p);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  cr_expect_eq(fake_of(dev)->used, 0);
  fake_close(dev);
  free(ptrs);
  free(again);
}

Test(pool_host_faults, virtual_range_holes_under_faults) {
  holes_under_faults("virtual=1,segment_bytes=2M", 40, 2 * MiB, 2 * MiB);
}

Test(pool_host_faults, stream_table_grows_under_faults) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *p = make_pool(dev, NULL);
  enum { N = 40 };
  mp_stream_t streams[N];
  for (size_t i = 0; i < N; i++)
    cr_assert_eq(mp_stream_create(dev, &streams[i]), MP_OK);
  void *ptrs[N];
  allocs_t a = {ptrs, 0, 4096, streams};
  int failed = 0;
  while (a.n < N)
    failed += until_ok(p, alloc_next, &a);
  cr_expect_geq(failed, 3, "the table grew (slots, hash) under faults");
  check(p);
  free_all(p, &a);
  check(p);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  for (size_t i = 0; i < N; i++)
    mp_stream_destroy(dev, streams[i]);
  cr_expect_eq(fake_of(dev)->used, 0);
  fake_close(dev);
}

Test(pool_host_faults, frees_need_no_host_memory) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  mp_pool_t *p = make_pool(dev, "virtual=1");
  enum { N = 64 };
  mp_stream_t s[2];
  for (int i = 0; i < 2; i++)
    cr_assert_eq(mp_stream_create(dev, &s[i]), MP_OK);
  void *ptrs[N];
  for (size_t i = 0; i < N; i++)
    cr_assert_eq(mp_pool_alloc(p, 4096 * (i + 1), s[i % 2], &ptrs[i]), MP_OK);
  for (size_t i = 0; i < N; i++) {
    mp__fault_host_after((long)(i % 4));
    mp_status_t st = i % 3 == 0   ? mp_pool_free(p, ptrs[i])
                     : i % 3 == 1 ? mp_pool_free_async(p, ptrs[i], s[0])
                                  : mp_pool_free_after_all(p, ptrs[i]);
    mp__fault_host_after(-1);
    cr_assert_eq(st, MP_OK, "free %zu: %s", i, mp_last_error());
  }
  check(p);
  mp_stats_t st = stats(p);
  cr_expect_eq(st.live_blocks, 0);
  cr_expect_eq(st.allocated_bytes, 0);
  /* What was freed serves again. */
  void *x;
  cr_assert_eq(mp_pool_alloc(p, 4096, s[0], &x), MP_OK);
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  for (int i = 0; i < 2; i++)
    mp_stream_destroy(dev, s[i]);
  cr_expect_eq(fake_of(dev)->used, 0);
  fake_close(dev);
}

/* The live map must grow (128 blocks live, doubling at half of 256) on an
 * allocation that also needs new device memory: a failure to grow the map
 * leaves the device memory as it was, whichever host allocation fails. */
Test(pool_host_faults, a_live_map_failure_leaves_the_device_memory_alone) {
  mp_device_t *dev = fake_open((size_t)8 << 30, 2 * MiB);
  mp_pool_t *p = make_pool(dev, NULL);
  enum { LIVE = 128 };
  void *ptrs[LIVE + 1];
  for (int i = 0; i < LIVE; i++)
    cr_assert_eq(mp_pool_alloc(p, 4096, NULL, &ptrs[i]), MP_OK);
  int map_failed = 0;
  for (long k = 0; k < 100; k++) {
    size_t used = fake_of(dev)->used, reserved = stats(p).reserved_bytes;
    mp__fault_host_after(k);
    mp_status_t st = mp_pool_alloc(p, 64 * MiB, NULL, &ptrs[LIVE]);
    mp__fault_host_after(-1);
    if (st == MP_OK)
      break;
    cr_assert_eq(st, MP_ENOMEM, "%s", mp_last_error());
    if (strstr(mp_last_error(), "block map") == NULL)
      continue; /* another table: growth's own faults are covered above */
    map_failed++;
    cr_expect_eq(fake_of(dev)->used, used, "k=%ld: device memory taken", k);
    cr_expect_eq(stats(p).reserved_bytes, reserved,
                 "k=%ld: reserved bytes changed", k);
    check(p);
  }
  cr_expect_geq(map_failed, 1, "the map never failed to grow");
  cr_assert_eq(mp_pool_free(p, ptrs[LIVE]), MP_OK);
  for (int i = 0; i < LIVE; i++)
    cr_assert_eq(mp_pool_free(p, ptrs[i]), MP_OK);
  check(p);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  fake_close(dev);
}

/* stream_waits=1: a free whose block and its free neighbours name more
 * streams than a record holds merges them through the pool's join stream
 * (stream.c, mp__deps_join), made on first need. When the stream table
 * cannot take the join stream (its growth fails), the free still succeeds
 * and the pool stays usable. Five gated streams keep the deps unfinished;
 * three more fill the table's first 8 slots, so that the join stream's
 * slot needs host memory. */
Test(pool_host_faults, a_free_whose_join_stream_cannot_be_added_succeeds,
     .timeout = 60) {
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host:capacity=1G", &dev), MP_OK, "%s",
               mp_last_error());
  join_scene_t j;
  join_scene_streams(dev, &j);
  bool fired = true;
  for (long k = 0; fired && k < 1000; k++) {
    mp_pool_t *p = make_pool(dev, "stream_waits=1");
    join_scene_set(dev, p, &j);
    mp__fault_host_after(k);
    mp_status_t st = mp_pool_free(p, j.x[JS_NG - 1]);
    fired = !mp__fault_host_pending();
    mp__fault_host_after(-1);
    cr_assert_eq(st, MP_OK, "k=%ld: %s", k, mp_last_error());
    join_scene_open(dev, &j);
    check(p);
    cr_expect_eq(stats(p).live_blocks, 2);
    void *y;
    cr_assert_eq(mp_pool_alloc(p, JS_NG * 8 * MiB, j.os[1], &y), MP_OK);
    cr_assert_eq(mp_pool_free(p, y), MP_OK);
    cr_assert_eq(mp_pool_free(p, j.guard), MP_OK);
    cr_assert_eq(mp_pool_free(p, j.low), MP_OK);
    cr_assert_eq(mp_pool_destroy(p), MP_OK);
  }
  cr_expect(!fired, "the free never ran without a fault");
  for (int i = 0; i < JS_NG; i++)
    mp_stream_destroy(dev, j.gs[i]);
  for (int i = 0; i < JS_NO; i++)
    mp_stream_destroy(dev, j.os[i]);
  mp_device_close(dev);
}

/* A graph pool grows by borrowing a range of its parent: a host failure in
 * the parent (its stream table, records, live map) or in the graph's range
 * table is host memory running out, reported as such, not a full device
 * (the graph pool's ladder used to take it for one and replace the message
 * with "out of device memory"). Begin and create fail cleanly too. */
static void *one_alloc_free(void *arg) {
  void *x;
  cr_assert_eq(mp_pool_alloc(arg, 4096, NULL, &x), MP_OK);
  cr_assert_eq(mp_pool_free(arg, x), MP_OK);
  return NULL;
}

static void graph_growth_under_faults(const char *opts) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  mp_pool_t *p = make_pool(dev, opts);
  if (p->arenas != NULL) {
    /* Another thread's arena: begin marks it too, and a failure there is
     * taken back in every arena. */
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, one_alloc_free, p), 0);
    pthread_join(t, NULL);
  }
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  mp_pool_t *g = NULL;
  for (long k = 0;; k++) {
    mp__fault_host_after(k);
    mp_status_t st = mp_pool_graph_create(p, &g);
    mp__fault_host_after(-1);
    if (st == MP_OK)
      break;
    cr_assert_eq(st, MP_ENOMEM, "k=%ld: %s", k, mp_last_error());
    check(p);
  }
  for (long k = 0;; k++) {
    mp__fault_host_after(k);
    mp_status_t st = mp_pool_graph_begin(p, g, s);
    mp__fault_host_after(-1);
    if (st == MP_OK)
      break;
    cr_assert_eq(st, MP_ENOMEM, "k=%ld: %s", k, mp_last_error());
    cr_assert_null(mp_pool_graph_of(p, s), "a failed begin routes nothing");
    check(p);
  }
  enum { N = 8 };
  void *ptrs[N];
  mp_stream_t streams[N];
  for (size_t i = 0; i < N; i++)
    streams[i] = s;
  allocs_t a = {ptrs, 0, 3 * MiB, streams};
  int failed = 0;
  while (a.n < N) {
    failed += until_ok(p, alloc_next, &a);
    check(g);
  }
  cr_expect_geq(failed, 3, "graph ranges, parent records and map");
  cr_expect_eq(stats(g).live_blocks, N);
  cr_expect_eq(stats(p).oom_count, 0, "a host failure counted as the device's");
  free_all(p, &a);
  check(g);
  cr_assert_eq(mp_pool_graph_end(p, s), MP_OK);
  cr_assert_eq(mp_pool_graph_release(g), MP_OK);
  check(p);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  mp_stream_destroy(dev, s);
  cr_expect_eq(fake_of(dev)->used, 0);
  fake_close(dev);
}

Test(pool_host_faults, graph_pool_growth_under_faults_says_host_memory) {
  graph_growth_under_faults(NULL);
}

/* The same on a pool with arenas: the range is the calling thread's
 * arena's, whose out-of-memory path took a host failure for the device's
 * (it reclaimed, and its message said "out of device memory"). */
Test(pool_host_faults, graph_pool_of_arenas_under_faults_says_host_memory) {
  graph_growth_under_faults("arenas=4");
}

static int handler_calls;

static int count_handler(mp_pool_t *pool, size_t bytes, mp_status_t st,
                         void *ctx) {
  (void)pool, (void)bytes, (void)st, (void)ctx;
  handler_calls++;
  return 0;
}

/* Host memory gone while the pool (or an arena) grows, for every retry of
 * its out-of-memory path: the failure says host memory, counts no device
 * out-of-memory and asks no handler (which frees device memory); nothing
 * changes. Before, the arenas' path took it for a full device (its last
 * message said "out of device memory" and the handler was called), and
 * without arenas the handler was called for it. */
static void lasting_host_failure(const char *opts) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *p = make_pool(dev, opts);
  handler_calls = 0;
  cr_assert_eq(mp_pool_set_oom_handler(p, count_handler, NULL), MP_OK);
  void *x;
  cr_assert_eq(mp_pool_alloc(p, 4096, NULL, &x), MP_OK, "%s", mp_last_error());
  seen_t before = seen_of(p);
  void *y = NULL;
  mp__fault_host_every(true);
  mp_status_t st = mp_pool_alloc(p, 64 * MiB, NULL, &y);
  mp__fault_host_every(false);
  cr_expect_eq(st, MP_ENOMEM, "%s", opts);
  cr_expect(strstr(mp_last_error(), "host memory") != NULL, "%s: '%s'", opts,
            mp_last_error());
  cr_expect_eq(handler_calls, 0, "%s", opts);
  cr_expect_eq(stats(p).oom_count, 0, "%s", opts);
  seen_t after = seen_of(p);
  cr_expect(memcmp(&before, &after, sizeof before) == 0, "%s", opts);
  check(p);
  /* Host memory back: the same request is served. */
  cr_assert_eq(mp_pool_alloc(p, 64 * MiB, NULL, &y), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(p, y), MP_OK);
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  cr_expect_eq(fake_of(dev)->used, 0);
  fake_close(dev);
}

Test(pool_host_faults, a_lasting_host_failure_in_an_arena_says_host_memory) {
  lasting_host_failure("arenas=2");
}

Test(pool_host_faults, a_lasting_host_failure_without_arenas_asks_no_handler) {
  lasting_host_failure("arenas=0");
}

/* The out-of-memory handler frees device memory and asks for a retry,
 * which meets host memory running out (the test arms the fault there). */
static int handler_then_no_host(mp_pool_t *pool, size_t bytes, mp_status_t st,
                                void *ctx) {
  (void)bytes, (void)st;
  void **x = ctx;
  cr_assert_eq(mp_pool_free(pool, *x), MP_OK);
  *x = NULL;
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  mp__fault_host_every(true);
  return 1;
}

/* A host failure in the retry after the handler says host memory, with
 * or without arenas (with arenas it read "out of device memory ...
 * reserved 0 B"). */
static void host_failure_after_the_handler(const char *opts) {
  mp_device_t *dev = fake_open(64 * MiB, 0);
  mp_pool_t *p = make_pool(dev, opts);
  void *x, *y = NULL;
  cr_assert_eq(mp_pool_set_oom_handler(p, handler_then_no_host, &x), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 60 * MiB, NULL, &x), MP_OK, "%s",
               mp_last_error());
  mp_status_t st = mp_pool_alloc(p, 16 * MiB, NULL, &y);
  mp__fault_host_every(false);
  cr_expect_eq(st, MP_ENOMEM);
  cr_expect(strstr(mp_last_error(), "host memory") != NULL, "%s: '%s'",
            opts ? opts : "no arenas", mp_last_error());
  cr_expect_null(y);
  check(p);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  fake_close(dev);
}

Test(pool_host_faults, a_host_failure_after_the_handler_says_host_memory) {
  host_failure_after_the_handler(NULL);
  host_failure_after_the_handler("arenas=2");
}

/* The handler's own allocation from the pool runs out of device memory
 * (counted in the pool), then it frees device memory and asks for a retry,
 * which meets host memory running out. */
static int handler_fails_then_no_host(mp_pool_t *pool, size_t bytes,
                                      mp_status_t st, void *ctx) {
  (void)bytes, (void)st;
  void *big = NULL;
  cr_assert_eq(mp_pool_alloc(pool, (size_t)1 << 30, NULL, &big), MP_ENOMEM);
  return handler_then_no_host(pool, bytes, st, ctx);
}

/* A graph pool's range whose retry after the parent's handler fails for
 * host memory says host memory and counts no out of memory in the graph
 * pool, with or without arenas, even when the handler's own allocation
 * from the parent ran out of device memory. Before, without arenas the
 * borrow told host from device by the parent's oom_count, which that
 * failure had moved: the graph pool took it for a full device ("out of
 * device memory", counted). */
static void graph_host_failure_after_the_handler(const char *opts) {
  mp_device_t *dev = fake_open(64 * MiB, 0);
  mp_pool_t *p = make_pool(dev, opts);
  void *x, *y = NULL;
  cr_assert_eq(mp_pool_alloc(p, 60 * MiB, NULL, &x), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_set_oom_handler(p, handler_fails_then_no_host, &x),
               MP_OK);
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(p, &g), MP_OK, "%s", mp_last_error());
  mp_status_t st = mp_pool_alloc(g, 16 * MiB, NULL, &y);
  mp__fault_host_every(false);
  const char *name = opts ? opts : "no arenas";
  cr_expect_eq(st, MP_ENOMEM, "%s", name);
  cr_expect(strstr(mp_last_error(), "host memory") != NULL, "%s: '%s'", name,
            mp_last_error());
  cr_expect_null(y);
  cr_expect_null(x, "%s: the handler ran", name);
  cr_expect_eq(stats(g).oom_count, 0, "%s", name);
  cr_expect_eq(stats(g).reserved_bytes, 0, "%s", name);
  check(g);
  check(p);
  /* Host memory back: the same request is served. */
  cr_assert_eq(mp_pool_alloc(g, 16 * MiB, NULL, &y), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(g, y), MP_OK);
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  check(p);
  cr_assert_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
  cr_expect_eq(fake_of(dev)->used, 0);
  fake_close(dev);
}

Test(pool_host_faults, a_graph_pools_host_failure_after_the_handler) {
  graph_host_failure_after_the_handler(NULL);
  graph_host_failure_after_the_handler("arenas=2");
}

/* Growth in pieces (map_piece) when host memory for its records runs out
 * at each point in turn. */
Test(pool_host_faults, growth_in_pieces_under_faults) {
  many_live(2 * MiB, "virtual=1,segment_bytes=2M,map_piece=2M", 8 * MiB, 12);
}

/* Trim leaving holes between pieces, then growth into them, under the same
 * faults. */
Test(pool_host_faults, pieces_into_holes_under_faults) {
  holes_under_faults("virtual=1,segment_bytes=2M,map_piece=2M", 12, 8 * MiB,
                     6 * MiB);
}

/* mp_pool_alloc_movable's handle needs host memory too (the process-wide
 * handle table's first chunk): refused for want of it, the allocation
 * leaves no trace in the counts either. Failed before: the block was
 * allocated first and freed again, counted as an allocation and a free. */
Test(pool_host_faults, a_movable_allocation_without_a_handle_counts_nothing) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  mp_pool_t *p = make_pool(dev, NULL);
  void *warm;
  cr_assert_eq(mp_pool_alloc(p, MiB, NULL, &warm), MP_OK);
  cr_assert_eq(mp_pool_free(p, warm), MP_OK);
  mp_handle_t *h = NULL;
  int failed = 0;
  for (long k = 0; k < 100; k++) {
    mp_stats_t before = stats(p);
    mp__fault_host_after(k);
    mp_status_t st = mp_pool_alloc_movable(p, MiB, NULL, &h);
    mp__fault_host_after(-1);
    if (st == MP_OK)
      break;
    failed++;
    cr_assert_eq(st, MP_ENOMEM, "k=%ld: %s", k, mp_last_error());
    cr_assert(strstr(mp_last_error(), "host memory") != NULL, "'%s'",
              mp_last_error());
    mp_stats_t after = stats(p);
    cr_expect_eq(after.alloc_count, before.alloc_count, "k=%ld", k);
    cr_expect_eq(after.free_count, before.free_count, "k=%ld", k);
    cr_expect_eq(after.live_blocks, before.live_blocks, "k=%ld", k);
    check(p);
  }
  cr_assert_gt(failed, 0, "the handle table needed no host memory");
  cr_assert_not_null(mp_handle_ptr(h));
  cr_assert_eq(mp_handle_free(h), MP_OK);
  check(p);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  fake_close(dev);
}

/* vm_unmap refused, and from then on no host memory. */
static mp_status_t refuse_unmap_and_host(mp_device_t *dev, void *addr,
                                         size_t bytes) {
  (void)dev;
  (void)addr;
  (void)bytes;
  mp__fault_host_every(true);
  return mp__fail(MP_EDRIVER, "fake vm_unmap refused");
}

/* A trim's unmap that the device refuses puts the chunk back as free
 * memory, which takes block records; with none spare and no host memory
 * for more, the chunk was left out of the range's tables while still
 * mapped: reserved_bytes said less than the device held, a later growth
 * mapped over it, and the range's release never unmapped it. The records
 * for putting it back are taken before the call. */
Test(pool_host_faults, a_refused_unmap_without_host_memory_stays_counted) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  mp__backend_t be = *dev->ops;
  be.vm_unmap = refuse_unmap_and_host;
  mp_pool_t *p = make_pool(dev, "map_piece=2M");
  void *x, *y;
  /* Three pieces: x in the first two and a half, y the rest; x freed
   * leaves a free block [0, 5M) under y, whose top whole chunk [2M, 4M)
   * is unmapped in its middle: both records of the split are used and
   * none comes free. */
  cr_assert_eq(mp_pool_alloc(p, 5 * MiB, NULL, &x), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 1 * MiB, NULL, &y), MP_OK);
  cr_assert_eq((char *)y - (char *)x, 5 * MiB);
  cr_assert_eq(stats(p).reserved_bytes, 6 * MiB);
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  /* Two spare records only: the unmap's own. */
  mp__block_t *kept = NULL;
  while (p->rec_free != NULL && p->rec_free->next_rec != NULL &&
         p->rec_free->next_rec->next_rec != NULL) {
    mp__block_t *r = p->rec_free;
    p->rec_free = r->next_rec;
    r->next_rec = kept;
    kept = r;
  }
  const mp__backend_t *ops = dev->ops;
  dev->ops = &be;
  (void)mp_pool_trim(p, 0);
  dev->ops = ops;
  mp__fault_host_every(false);
  check(p);
  cr_expect_eq(stats(p).reserved_bytes, fake_of(dev)->used);
  cr_expect_eq(stats(p).segment_count, fake_of(dev)->nmap);
  while (kept != NULL) {
    mp__block_t *r = kept;
    kept = r->next_rec;
    mp__rec_free(p, r);
  }
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK);
  cr_expect_eq(stats(p).reserved_bytes, 2 * MiB);
  cr_expect_eq(stats(p).reserved_bytes, fake_of(dev)->used);
  cr_assert_eq(mp_pool_free(p, y), MP_OK);
  fake_pool_finish(p, dev);
}

/* A snapshot copies the pool's blocks, segments, events and stacks under
 * the lock; any of those copies failing said out of host memory, and the
 * ones made before it were then freed twice (glibc stopped the process). */
static mp_status_t snapshot_to_file(mp_pool_t *p, void *ctx) {
  (void)ctx;
  FILE *f = tmpfile();
  cr_assert_not_null(f);
  mp_status_t st = mp_pool_snapshot_file(p, f);
  long size = ftell(f);
  fclose(f);
  /* A failed one wrote nothing. */
  cr_assert(st == MP_OK || size == 0, "status %d but %ld bytes written", st,
            size);
  return st;
}

static size_t entries(const char *dir) {
  size_t n = 0;
  DIR *d = opendir(dir);
  cr_assert_not_null(d);
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

static mp_status_t snapshot_to_path(mp_pool_t *p, void *ctx) {
  const char *dir = ctx;
  char path[256];
  snprintf(path, sizeof path, "%s/s.pickle", dir);
  mp_status_t st = mp_pool_snapshot(p, path);
  /* Whole or nothing: a failed one leaves no file and no temporary. */
  cr_assert_eq(entries(dir), st == MP_OK ? 1u : 0u, "status %d: %s", st,
               st == MP_OK ? "" : mp_last_error());
  return st;
}

Test(pool_host_faults, a_snapshot_without_host_memory_frees_nothing_twice) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  mp_pool_t *p = make_pool(dev, "history=64,history_stacks=1");
  void *a, *b;
  cr_assert_eq(mp_pool_alloc(p, 4096, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 3 * MiB, NULL, &b), MP_OK);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  /* blocks, segments, events, stacks, the events' link: five copies. */
  cr_expect_geq(until_ok(p, snapshot_to_file, NULL), 5);
  char dir[] = "/tmp/mp_snap_faults_XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  cr_expect_geq(until_ok(p, snapshot_to_path, dir), 5);
  char path[sizeof dir + 16];
  snprintf(path, sizeof path, "%s/s.pickle", dir);
  cr_assert_eq(unlink(path), 0);
  cr_assert_eq(rmdir(dir), 0);
  cr_assert_eq(mp_pool_free(p, b), MP_OK);
  fake_pool_finish(p, dev);
}

/* Defragmentation whose evacuation cannot get host memory for its list of
 * a segment's blocks evacuates nothing from that segment: MP_OK, every
 * movable block's data where its handle says, nothing read or written past
 * the list of segments tried (it crashed: the segment was tried again). */
Test(pool_host_faults, an_evacuation_without_host_memory_moves_nothing) {
  for (long k = 0; k < 8; k++) {
    mp_device_t *dev = fake_open((size_t)1 << 30, 0);
    mp_pool_t *p =
        make_pool(dev, "virtual=0,segment_bytes=2M,align=512,max_bytes=64M");
    /* Three segments of movable blocks, none with room for another's. */
    size_t sz[5] = {MiB, MiB, MiB, MiB, MiB / 2};
    mp_handle_t *h[5];
    for (int i = 0; i < 5; i++) {
      cr_assert_eq(mp_pool_alloc_movable(p, sz[i], NULL, &h[i]), MP_OK);
      memset(mp_handle_ptr(h[i]), 0x30 + i, sz[i]);
    }
    cr_assert_eq(stats(p).segment_count, 3);
    mp__fault_host_after(k);
    size_t moved = 1;
    mp_status_t st = mp_pool_defragment(p, NULL, &moved);
    mp__fault_host_after(-1);
    cr_expect(st == MP_OK || st == MP_ENOMEM, "k=%ld: %d %s", k, st,
              mp_last_error());
    cr_expect_eq(moved, 0, "k=%ld: nothing fits elsewhere", k);
    check(p);
    for (int i = 0; i < 5; i++) {
      const unsigned char *d = mp_handle_ptr(h[i]);
      cr_expect(d[0] == 0x30 + i && d[sz[i] - 1] == 0x30 + i, "k=%ld %d", k, i);
      cr_assert_eq(mp_handle_free(h[i]), MP_OK);
    }
    fake_pool_finish(p, dev);
  }
}

/* A release whose look at the streams the graph pool met runs out of host
 * memory still succeeds (the range then waits for a device synchronize),
 * and, as a success, leaves the thread's last failure message as it was:
 * before, the refused look's "out of host memory" stayed in
 * mp_last_error() behind an MP_OK. */
static void release_under_faults(const char *opts) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  mp_pool_t *p = make_pool(dev, opts);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  int fired_n = 0;
  for (long k = 0; k < 1000; k++) {
    mp_pool_t *g = graph_used_once(p, s, 3 * MiB);
    int foreign;
    cr_assert_eq(mp_pool_free(p, &foreign), MP_EINVAL);
    char before[512];
    snprintf(before, sizeof before, "%s", mp_last_error());
    mp__fault_host_after(k);
    mp_status_t st = mp_pool_graph_release(g);
    bool fired = !mp__fault_host_pending();
    mp__fault_host_after(-1);
    cr_assert_eq(st, MP_OK, "%s k=%ld: %s", opts, k, mp_last_error());
    cr_expect_str_eq(mp_last_error(), before,
                     "%s k=%ld: a release that succeeded left a message", opts,
                     k);
    check(p);
    if (!fired)
      break;
    fired_n++;
  }
  cr_expect_geq(fired_n, 1, "%s: no look of the release ran out", opts);
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  cr_assert_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
  mp_stream_destroy(dev, s);
  cr_expect_eq(fake_of(dev)->used, 0);
  fake_close(dev);
}

Test(pool_host_faults, a_release_short_of_host_memory_leaves_no_message) {
  release_under_faults("arenas=0");
  release_under_faults("arenas=2");
}
