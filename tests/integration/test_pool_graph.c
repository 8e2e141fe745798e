/* Graph-private pools on the host device: allocations on a stream that
 * allocates to a graph pool come from it, its memory goes to no one else
 * until the graph pool is released, several captures share one graph pool,
 * and released memory returns to the parent. (Every test here runs on a
 * parent with arenas too: test_pool_arenas_graph.c.) */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include <mempool/mempool.h>

#include "../support/pool_helpers.h"
#include "../support/stream_gate.h"

#define MiB ((size_t)1 << 20)

static mp_device_t *dev;
static mp_pool_t *parent;
static mp_stream_t s1, s2;

/* The parent's config: test_pool_arenas_graph.c runs every test here on
 * a parent with arenas. */
#ifndef POOL_GRAPH_CONF
#define POOL_GRAPH_CONF ""
#endif

static void setup(void) {
  cr_assert_eq(mp_device_open("host", &dev), MP_OK, "%s", mp_last_error());
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_assert_eq(mp_pool_config_parse(&cfg, POOL_GRAPH_CONF), MP_OK);
  cr_assert_eq(mp_pool_create(dev, &cfg, &parent), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_stream_create(dev, &s1), MP_OK);
  cr_assert_eq(mp_stream_create(dev, &s2), MP_OK);
}
static void teardown(void) {
  cr_expect_eq(mp_pool_destroy(parent), MP_OK, "%s", mp_last_error());
  mp_stream_destroy(dev, s1);
  mp_stream_destroy(dev, s2);
  mp_device_close(dev);
}

static bool inside(const void *p, const void *base, size_t bytes) {
  return (uintptr_t)p >= (uintptr_t)base &&
         (uintptr_t)p < (uintptr_t)base + bytes;
}

Test(pool_graph, allocations_on_a_begun_stream_come_from_the_graph_pool,
     .init = setup, .fini = teardown) {
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(parent, &g), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(g).reserved_bytes, 0, "nothing reserved ahead");
  cr_assert_eq(mp_pool_graph_begin(parent, g, s1), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_graph_of(parent, s1), g);
  cr_expect_null(mp_pool_graph_of(parent, s2));
  void *a, *b;
  cr_assert_eq(mp_pool_alloc(parent, 3 * MiB, s1, &a), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_alloc(parent, MiB, s2, &b), MP_OK);
  mp_stats_t gs = stats(g), ps = stats(parent);
  cr_expect_eq(gs.live_blocks, 1);
  cr_expect_geq(gs.reserved_bytes, 3 * MiB);
  cr_expect_eq(ps.live_blocks, 2, "the graph's range and b");
  cr_expect_eq(ps.allocated_bytes, gs.reserved_bytes + MiB);
  cr_expect_eq(mp_pool_check(g), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_check(parent), MP_OK, "%s", mp_last_error());
  /* A free through the parent lands in the graph pool. */
  cr_assert_eq(mp_pool_free(parent, a), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(g).live_blocks, 0);
  cr_assert_eq(mp_pool_free(parent, b), MP_OK);
  cr_assert_eq(mp_pool_graph_end(parent, s1), MP_OK);
  cr_expect_null(mp_pool_graph_of(parent, s1));
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
}

Test(pool_graph, memory_freed_in_a_capture_is_reused_only_by_the_graph_pool,
     .init = setup, .fini = teardown) {
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(parent, &g), MP_OK);
  cr_assert_eq(mp_pool_graph_begin(parent, g, s1), MP_OK);
  void *a, *again;
  cr_assert_eq(mp_pool_alloc(parent, MiB, s1, &a), MP_OK);
  cr_assert_eq(mp_pool_free(parent, a), MP_OK);
  /* Inside the capture, on its stream: reused at once (stream order). */
  cr_assert_eq(mp_pool_alloc(parent, MiB, s1, &again), MP_OK);
  cr_expect_eq(again, a);
  cr_assert_eq(mp_pool_free(parent, again), MP_OK);
  cr_assert_eq(mp_pool_graph_end(parent, s1), MP_OK);
  size_t pinned = stats(g).reserved_bytes;
  /* Outside the capture nobody gets it, on any stream, even after a trim
   * of the parent. */
  cr_assert_eq(mp_pool_trim(parent, 0), MP_OK, "%s", mp_last_error());
  void *p[8];
  for (int i = 0; i < 8; i++) {
    cr_assert_eq(mp_pool_alloc(parent, MiB, i % 2 ? s1 : s2, &p[i]), MP_OK);
    cr_expect_not(inside(p[i], a, pinned),
                  "graph memory %p handed out outside the capture", p[i]);
  }
  cr_expect_eq(stats(g).reserved_bytes, pinned, "the graph keeps its memory");
  for (int i = 0; i < 8; i++)
    cr_assert_eq(mp_pool_free(parent, p[i]), MP_OK);
  /* A later capture sharing the graph pool reuses it (PyTorch's pool=),
   * on another stream once s1's work is done: the host device runs s1's
   * work on a thread of its own, and until it has, stream order lets the
   * graph pool borrow more from the parent instead (a failure 2 to 4 times
   * in 60 runs under load before this wait). */
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  cr_assert_eq(mp_pool_graph_begin(parent, g, s2), MP_OK);
  void *b;
  cr_assert_eq(mp_pool_alloc(parent, MiB, s2, &b), MP_OK);
  cr_expect(inside(b, a, pinned), "a shared graph pool serves the next one");
  cr_expect_eq(stats(g).reserved_bytes, pinned);
  cr_assert_eq(mp_pool_free(parent, b), MP_OK);
  cr_assert_eq(mp_pool_graph_end(parent, s2), MP_OK);
  cr_expect_eq(mp_pool_check(g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g), MP_OK);
}

/* A graph replays on whichever stream it is launched on, after nothing
 * queued before the capture unless launched on the capturing stream: a
 * range the graph pool borrows must not still be in use by work queued
 * before the capture, on any stream, the capturing one included (a block
 * freed on s1 before the capture is reusable on s1 by stream order, but
 * not by a graph launched on s2). Once that work is done, it is borrowed. */
Test(pool_graph, a_capture_borrows_no_block_work_before_it_still_uses,
     .init = setup, .fini = teardown) {
  gate_t gate;
  gate_init(&gate);
  void *x;
  cr_assert_eq(mp_pool_alloc(parent, 4 * MiB, s1, &x), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, s1, gate_wait, &gate), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(parent, x), MP_OK); /* s1's gated work uses x */
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(parent, &g), MP_OK);
  cr_assert_eq(mp_pool_graph_begin(parent, g, s1), MP_OK, "%s",
               mp_last_error());
  void *y;
  cr_assert_eq(mp_pool_alloc(parent, 3 * MiB, s1, &y), MP_OK, "%s",
               mp_last_error());
  cr_expect_not(inside(y, x, 4 * MiB) || inside(x, y, 3 * MiB),
                "the graph borrowed %p, which work before the capture still "
                "uses (%p)",
                y, x);
  cr_assert_eq(mp_pool_free(parent, y), MP_OK);
  cr_assert_eq(mp_pool_graph_end(parent, s1), MP_OK);
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  gate_open(&gate);
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  /* Done now: a capture borrows it instead of growing the parent. */
  cr_assert_eq(mp_pool_trim(parent, 0), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(parent, 4 * MiB, s1, &x), MP_OK);
  cr_assert_eq(mp_pool_free(parent, x), MP_OK);
  /* Its free's marker on s1 passed (else stream order still holds it). */
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  size_t reserved = stats(parent).reserved_bytes;
  cr_assert_eq(mp_pool_graph_create(parent, &g), MP_OK);
  cr_assert_eq(mp_pool_graph_begin(parent, g, s2), MP_OK);
  cr_assert_eq(mp_pool_alloc(parent, 3 * MiB, s2, &y), MP_OK);
  cr_expect(inside(y, x, 4 * MiB), "done memory %p not borrowed (%p)", x, y);
  cr_expect_eq(stats(parent).reserved_bytes, reserved, "the parent grew");
  cr_assert_eq(mp_pool_free(parent, y), MP_OK);
  cr_assert_eq(mp_pool_graph_end(parent, s2), MP_OK);
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  gate_destroy(&gate);
}

/* A released graph pool's ranges go back to the parent once the work of
 * every stream that used them has passed, a stream only the graph pool
 * met included (here s3, named by mp_pool_record_stream on graph memory,
 * its work held at a gate): until then the parent grows instead. */
Test(pool_graph, a_released_range_waits_for_streams_only_the_graph_met,
     .init = setup, .fini = teardown) {
  gate_t gate;
  gate_init(&gate);
  mp_stream_t s3;
  cr_assert_eq(mp_stream_create(dev, &s3), MP_OK);
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(parent, &g), MP_OK);
  cr_assert_eq(mp_pool_graph_begin(parent, g, s1), MP_OK);
  void *y;
  cr_assert_eq(mp_pool_alloc(parent, 3 * MiB, s1, &y), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_graph_end(parent, s1), MP_OK);
  cr_assert_eq(mp_pool_record_stream(parent, y, s3), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_stream_launch_host(dev, s3, gate_wait, &gate), MP_OK);
  cr_assert_eq(mp_pool_free(parent, y), MP_OK); /* s3's gated work uses y */
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  size_t lent = stats(g).reserved_bytes;
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  void *z;
  cr_assert_eq(mp_pool_alloc(parent, 3 * MiB, s2, &z), MP_OK, "%s",
               mp_last_error());
  bool clash = inside(z, y, lent) || inside(y, z, 3 * MiB);
  gate_open(&gate);
  cr_expect_not(clash, "s2 got %p while s3's work still uses %p", z, y);
  cr_assert_eq(mp_pool_free(parent, z), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s3), MP_OK);
  /* Done now: the range serves the parent again. */
  cr_assert_eq(mp_pool_alloc(parent, 3 * MiB, s2, &z), MP_OK);
  cr_expect_eq(mp_pool_check(parent), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(parent, z), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s2), MP_OK);
  mp_stream_destroy(dev, s3);
  gate_destroy(&gate);
}

Test(pool_graph, released_graph_memory_returns_to_the_parent, .init = setup,
     .fini = teardown) {
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(parent, &g), MP_OK);
  cr_assert_eq(mp_pool_graph_begin(parent, g, s1), MP_OK);
  void *a;
  cr_assert_eq(mp_pool_alloc(parent, 4 * MiB, s1, &a), MP_OK);
  cr_assert_eq(mp_pool_free(parent, a), MP_OK);
  cr_assert_eq(mp_pool_graph_end(parent, s1), MP_OK);
  mp_stats_t before = stats(parent);
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  mp_stats_t after = stats(parent);
  cr_expect_eq(after.reserved_bytes, before.reserved_bytes,
               "the memory stays with the parent");
  cr_expect_eq(after.allocated_bytes, 0);
  cr_expect_eq(after.live_blocks, 0);
  cr_expect_eq(mp_pool_check(parent), MP_OK, "%s", mp_last_error());
  /* The parent hands it out again: on s1, the stream the range was
   * borrowed on, at once (another stream would wait for s1's marker, which
   * depends on stream-thread timing). */
  void *b;
  cr_assert_eq(mp_pool_alloc(parent, 4 * MiB, s1, &b), MP_OK);
  cr_expect_eq(b, a, "the released range serves the parent");
  cr_expect_eq(stats(parent).reserved_bytes, before.reserved_bytes);
  cr_assert_eq(mp_pool_free(parent, b), MP_OK);
}

Test(pool_graph, a_released_graph_pool_goes_with_its_last_live_block,
     .init = setup, .fini = teardown) {
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(parent, &g), MP_OK);
  cr_assert_eq(mp_pool_graph_begin(parent, g, s1), MP_OK);
  void *out, *tmp;
  cr_assert_eq(mp_pool_alloc(parent, MiB, s1, &out), MP_OK);
  cr_assert_eq(mp_pool_alloc(parent, MiB, s1, &tmp), MP_OK);
  cr_assert_eq(mp_pool_free(parent, tmp), MP_OK);
  cr_assert_eq(mp_pool_graph_end(parent, s1), MP_OK);
  cr_assert_eq(mp_pool_graph_release(g), MP_OK);
  /* The graph's output is still live: its range stays lent. */
  cr_expect_gt(stats(parent).allocated_bytes, 0);
  cr_expect_eq(mp_pool_destroy(parent), MP_EBUSY);
  cr_assert_eq(mp_pool_free(parent, out), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(parent).allocated_bytes, 0);
  cr_expect_eq(mp_pool_check(parent), MP_OK, "%s", mp_last_error());
}

/* A graph pool whose capture allocated out (1 MiB), released: its live
 * block keeps it. */
static mp_pool_t *released_with_a_live_block(void **out) {
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(parent, &g), MP_OK);
  cr_assert_eq(mp_pool_graph_begin(parent, g, s1), MP_OK);
  cr_assert_eq(mp_pool_alloc(parent, MiB, s1, out), MP_OK);
  cr_assert_eq(mp_pool_graph_end(parent, s1), MP_OK);
  cr_assert_eq(mp_pool_graph_release(g), MP_OK);
  return g;
}

/* st, an allocation on the released graph pool, was refused naming the
 * release, with the parent as it was (before); out, the live block, still
 * frees, and the pool goes with it. */
static void expect_refused_then_gone(mp_status_t st, mp_stats_t before,
                                     void *out) {
  cr_expect_eq(st, MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "released") != NULL, "%s", mp_last_error());
  cr_expect_eq(stats(parent).allocated_bytes, before.allocated_bytes);
  cr_expect_eq(stats(parent).reserved_bytes, before.reserved_bytes);
  cr_assert_eq(mp_pool_free(parent, out), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(parent).allocated_bytes, 0);
  cr_expect_eq(mp_pool_check(parent), MP_OK, "%s", mp_last_error());
}

/* A released graph pool kept by a live block takes no new block: it
 * borrowed more of the parent for a graph that is gone, and kept it until
 * that block too was freed. The live block still frees. */
Test(pool_graph, a_released_graph_pool_takes_no_new_block, .init = setup,
     .fini = teardown) {
  void *out, *more = NULL;
  mp_pool_t *g = released_with_a_live_block(&out);
  mp_stats_t before = stats(parent);
  mp_status_t st = mp_pool_alloc(g, 8 * MiB, s1, &more);
  cr_expect_null(more);
  expect_refused_then_gone(st, before, out);
}

/* So does mp_pool_alloc_contiguous: its pieces borrowed from the parent
 * for the gone graph as mp_pool_alloc's block did. */
Test(pool_graph, a_released_graph_pool_takes_no_new_pieces, .init = setup,
     .fini = teardown) {
  void *out, *more[2] = {NULL, NULL};
  mp_pool_t *g = released_with_a_live_block(&out);
  mp_stats_t before = stats(parent);
  size_t sizes[2] = {4 * MiB, 4 * MiB};
  mp_status_t st = mp_pool_alloc_contiguous(g, 2, sizes, s1, more);
  cr_expect_null(more[0]);
  expect_refused_then_gone(st, before, out);
}

/* The out-of-memory handler of a graph pool releases it, lifts the
 * parent's cap and asks for the retry: the retry is refused too (it took a
 * new block of the parent for the gone graph). */
static int release_and_lift(mp_pool_t *pool, size_t bytes, mp_status_t st,
                            void *ctx) {
  (void)bytes;
  (void)st;
  (void)ctx;
  cr_expect_eq(mp_pool_graph_release(pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_set_max_fraction(parent, 1.0), MP_OK, "%s",
               mp_last_error());
  return 1;
}

Test(pool_graph, a_graph_pool_its_handler_released_takes_no_retry_block,
     .init = setup, .fini = teardown) {
  size_t total = 0;
  cr_assert_eq(mp_device_mem_info(dev, NULL, &total), MP_OK);
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(parent, &g), MP_OK);
  void *out, *more = NULL;
  cr_assert_eq(mp_pool_alloc(g, MiB, s1, &out), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_set_max_fraction(parent, (double)(8 * MiB) / total),
               MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_set_oom_handler(g, release_and_lift, NULL), MP_OK);
  mp_stats_t before = stats(parent);
  mp_status_t st = mp_pool_alloc(g, 16 * MiB, s1, &more);
  cr_expect_null(more);
  expect_refused_then_gone(st, before, out);
}

Test(pool_graph, bad_calls_are_refused_and_change_nothing, .init = setup,
     .fini = teardown) {
  mp_pool_t *g, *g2, *child;
  cr_expect_eq(mp_pool_graph_create(NULL, &g), MP_EINVAL);
  cr_expect_eq(mp_pool_graph_create(parent, NULL), MP_EINVAL);
  cr_assert_eq(mp_pool_graph_create(parent, &g), MP_OK);
  cr_expect_eq(mp_pool_graph_create(g, &g2), MP_EINVAL, "not from a graph");
  /* Neither would ever let the graph pool finish (it goes with its last
   * free or release), and the parent could then never be destroyed. */
  mp_handle_t *h;
  cr_expect_eq(mp_pool_create_child(g, MiB, &child), MP_EINVAL,
               "a child of a graph pool");
  cr_expect_eq(mp_pool_alloc_movable(g, 4096, NULL, &h), MP_EINVAL,
               "a movable block in a graph pool");
  cr_expect_eq(stats(parent).allocated_bytes, 0);
  cr_expect_eq(stats(g).reserved_bytes, 0);
  cr_assert_eq(mp_pool_create_child(parent, 4 * MiB, &child), MP_OK);
  cr_expect_eq(mp_pool_graph_create(child, &g2), MP_EINVAL, "not a child");
  cr_expect_eq(mp_pool_graph_begin(child, g, s1), MP_EINVAL,
               "g is not child's graph pool");
  cr_expect_eq(mp_pool_graph_begin(parent, parent, s1), MP_EINVAL);
  cr_expect_eq(mp_pool_graph_end(parent, s1), MP_EINVAL, "never begun");
  cr_assert_eq(mp_pool_graph_begin(parent, g, s1), MP_OK);
  cr_expect_eq(mp_pool_graph_begin(parent, g, s1), MP_EBUSY);
  cr_expect_eq(mp_pool_graph_release(g), MP_EBUSY, "s1 still allocates");
  cr_expect_eq(mp_pool_graph_release(parent), MP_EINVAL);
  cr_expect_eq(mp_pool_destroy(parent), MP_EBUSY);
  cr_assert_eq(mp_pool_graph_end(parent, s1), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_graph_end(parent, s1), MP_EINVAL, "ended already");
  cr_assert_eq(mp_pool_destroy(child), MP_OK);
  cr_assert_eq(mp_pool_destroy(g), MP_OK, "destroy releases a graph pool");
  cr_expect_eq(stats(parent).allocated_bytes, 0);
}

/* Two captures at once, each with its graph pool: each stream gets its own
 * pool's memory, and a block freed in one is never given to the other. */
Test(pool_graph, two_captures_keep_their_memory_apart, .init = setup,
     .fini = teardown) {
  mp_pool_t *g1, *g2;
  cr_assert_eq(mp_pool_graph_create(parent, &g1), MP_OK);
  cr_assert_eq(mp_pool_graph_create(parent, &g2), MP_OK);
  cr_assert_eq(mp_pool_graph_begin(parent, g1, s1), MP_OK);
  cr_assert_eq(mp_pool_graph_begin(parent, g2, s2), MP_OK);
  void *a, *b;
  cr_assert_eq(mp_pool_alloc(parent, MiB, s1, &a), MP_OK);
  cr_assert_eq(mp_pool_free(parent, a), MP_OK);
  cr_assert_eq(mp_pool_alloc(parent, MiB, s2, &b), MP_OK);
  cr_expect_neq(a, b);
  cr_expect_eq(stats(g1).live_blocks, 0);
  cr_expect_eq(stats(g2).live_blocks, 1);
  cr_assert_eq(mp_pool_free(parent, b), MP_OK);
  cr_assert_eq(mp_pool_graph_end(parent, s1), MP_OK);
  cr_assert_eq(mp_pool_graph_end(parent, s2), MP_OK);
  cr_assert_eq(mp_pool_graph_release(g1), MP_OK);
  cr_assert_eq(mp_pool_graph_release(g2), MP_OK);
  cr_expect_eq(mp_pool_check(parent), MP_OK, "%s", mp_last_error());
}

/* A begin refused because the stream already allocates to another graph
 * pool changes nothing: the second graph pool is not left believing the
 * stream captures for it, so both release and the parent goes (teardown).
 * Failed before: the refused pool stayed marked, its release was MP_EBUSY
 * and the parent could never be destroyed. */
Test(pool_graph, a_refused_begin_changes_nothing, .init = setup,
     .fini = teardown) {
  mp_pool_t *g1, *g2;
  cr_assert_eq(mp_pool_graph_create(parent, &g1), MP_OK);
  cr_assert_eq(mp_pool_graph_create(parent, &g2), MP_OK);
  cr_assert_eq(mp_pool_graph_begin(parent, g1, s1), MP_OK);
  cr_assert_eq(mp_pool_graph_begin(parent, g2, s1), MP_EBUSY);
  cr_assert_eq(mp_pool_graph_of(parent, s1), g1);
  cr_assert_eq(mp_pool_graph_end(parent, s1), MP_OK);
  cr_assert_eq(mp_pool_graph_release(g1), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g2), MP_OK, "%s", mp_last_error());
}

/* Threads free the last blocks of a released graph pool, or release it,
 * at the same time: exactly one of them gives the pool back (under ASan a
 * second one would touch freed memory). */
typedef struct {
  mp_pool_t *pool;
  void *p;
} free_arg_t;

static void *free_one(void *a) {
  free_arg_t *f = a;
  cr_assert_eq(mp_pool_free(f->pool, f->p), MP_OK);
  return NULL;
}

Test(pool_graph, racing_last_frees_finish_the_graph_pool_once, .init = setup,
     .fini = teardown) {
  for (int round = 0; round < 200; round++) {
    mp_pool_t *g;
    cr_assert_eq(mp_pool_graph_create(parent, &g), MP_OK);
    cr_assert_eq(mp_pool_graph_begin(parent, g, s1), MP_OK);
    free_arg_t f[2] = {{parent, NULL}, {parent, NULL}};
    for (int i = 0; i < 2; i++)
      cr_assert_eq(mp_pool_alloc(parent, MiB, s1, &f[i].p), MP_OK);
    cr_assert_eq(mp_pool_graph_end(parent, s1), MP_OK);
    pthread_t t[2];
    bool release_first = round % 2 == 0;
    if (release_first)
      cr_assert_eq(mp_pool_graph_release(g), MP_OK);
    for (int i = 0; i < 2; i++)
      cr_assert_eq(pthread_create(&t[i], NULL, free_one, &f[i]), 0);
    if (!release_first)
      cr_assert_eq(mp_pool_graph_release(g), MP_OK);
    for (int i = 0; i < 2; i++)
      pthread_join(t[i], NULL);
  }
  cr_assert_eq(mp_pool_check(parent), MP_OK, "%s", mp_last_error());
  cr_assert_eq(stats(parent).live_blocks, 0);
}

/* Graph memory is not exported over IPC, and the refusal says it is a
 * graph pool's (it named a child pool both ways, and through the graph
 * pool sent the caller to the parent, which refused too). */
Test(pool_graph, graph_memory_is_not_exported_and_the_refusal_says_why,
     .init = setup, .fini = teardown) {
  mp_pool_t *g;
  void *x;
  mp_ipc_handle_t h;
  cr_assert_eq(mp_pool_graph_create(parent, &g), MP_OK);
  cr_assert_eq(mp_pool_graph_begin(parent, g, s1), MP_OK);
  cr_assert_eq(mp_pool_alloc(parent, MiB, s1, &x), MP_OK);
  cr_expect_eq(mp_pool_ipc_export(parent, x, &h), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "graph pool") != NULL, "%s",
            mp_last_error());
  cr_expect_eq(mp_pool_ipc_export(g, x, &h), MP_ENOTSUP);
  cr_expect(strstr(mp_last_error(), "graph pool") != NULL, "%s",
            mp_last_error());
  cr_assert_eq(mp_pool_graph_end(parent, s1), MP_OK);
  cr_assert_eq(mp_pool_free(parent, x), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  cr_assert_eq(mp_pool_graph_release(g), MP_OK);
}

/* A stream destroyed (or forgotten) while it allocates to a graph pool,
 * before mp_pool_graph_end: its slots in both pools stayed marked
 * capturing for good, and the end found no slot to clear (the handle was
 * forgotten). The graph pool then refused every release (MP_EBUSY: "a
 * stream still allocates to it"), so its memory never went back and the
 * parent could not be destroyed; the parent refused to synchronize
 * (trim) for good. */
Test(pool_graph, a_stream_destroyed_while_routed_leaves_nothing_capturing,
     .init = setup, .fini = teardown) {
  mp_pool_t *g;
  mp_stream_t s3;
  cr_assert_eq(mp_stream_create(dev, &s3), MP_OK);
  cr_assert_eq(mp_pool_graph_create(parent, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(parent, g, s3), MP_OK, "%s",
               mp_last_error());
  void *a, *b;
  cr_assert_eq(mp_pool_alloc(parent, MiB, s3, &a), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(parent, a), MP_OK);
  cr_assert_eq(mp_pool_alloc(parent, MiB, s1, &b), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(parent, b), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s3), MP_OK);
  (void)mp_pool_graph_end(parent, s3); /* no route left, or this one */
  cr_expect_null(mp_pool_graph_of(parent, s3));
  cr_expect_eq(mp_pool_trim(parent, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_check(parent), MP_OK, "%s", mp_last_error());
}

/* mp_pool_alloc_contiguous on a stream that allocates to a graph pool
 * routes there too, as mp_pool_alloc does: pieces taken from the parent
 * would go back to it at their free and be handed to others while the
 * graph's replays still use them. */
Test(pool_graph, contiguous_allocations_on_a_begun_stream_come_from_the_graph,
     .init = setup, .fini = teardown) {
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(parent, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(parent, g, s1), MP_OK, "%s",
               mp_last_error());
  const size_t sizes[3] = {MiB, 4096, 2 * MiB};
  void *p[3];
  cr_assert_eq(mp_pool_alloc_contiguous(parent, 3, sizes, s1, p), MP_OK, "%s",
               mp_last_error());
  mp_stats_t gs = stats(g), ps = stats(parent);
  cr_expect_eq(gs.live_blocks, 3, "the pieces are the graph pool's");
  cr_expect_eq(ps.live_blocks, 1, "the parent holds only the graph's range");
  cr_expect_eq(ps.allocated_bytes, gs.reserved_bytes);
  cr_expect_eq((uintptr_t)p[1], (uintptr_t)p[0] + MiB, "contiguous");
  cr_expect_eq(mp_pool_check(g), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_check(parent), MP_OK, "%s", mp_last_error());
  /* Frees through the parent land in the graph pool. */
  for (int i = 0; i < 3; i++)
    cr_expect_eq(mp_pool_free(parent, p[i]), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(g).live_blocks, 0);
  cr_assert_eq(mp_pool_graph_end(parent, s1), MP_OK);
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
}

/* Nor does a movable block come from the parent on such a stream: the
 * graph's replays use it at its address, which defragmentation would
 * change. Refused, and nothing changes. */
Test(pool_graph, a_movable_block_on_a_begun_stream_is_refused, .init = setup,
     .fini = teardown) {
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(parent, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(parent, g, s1), MP_OK, "%s",
               mp_last_error());
  mp_stats_t before = stats(parent), gbefore = stats(g);
  mp_handle_t *h = NULL;
  cr_expect_eq(mp_pool_alloc_movable(parent, MiB, s1, &h), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "graph pool") != NULL, "%s",
            mp_last_error());
  cr_expect_null(h);
  mp_stats_t after = stats(parent), gafter = stats(g);
  cr_expect_eq(after.live_blocks, before.live_blocks);
  cr_expect_eq(after.allocated_bytes, before.allocated_bytes);
  cr_expect_eq(gafter.live_blocks, gbefore.live_blocks);
  /* Another stream still gets one. */
  cr_assert_eq(mp_pool_alloc_movable(parent, MiB, s2, &h), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_handle_free(h), MP_OK);
  cr_assert_eq(mp_pool_graph_end(parent, s1), MP_OK);
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
}
