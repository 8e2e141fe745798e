/* test_pool_stream_waits.c - stream_waits=1 (MP_POOL_STREAM_WAITS): a free
 * block that another stream's queued work may still use goes to the
 * allocating stream at once, and that stream's later work waits on the
 * device for exactly the work queued before the free; without the option
 * the block is passed over until the work completes. Gated host functions
 * hold the streams, so that ordering is observed, not assumed. */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <time.h>

#include <mempool/mempool.h>

#include "../support/pool_helpers.h"
#include "../support/stream_gate.h"

#define MiB ((size_t)1 << 20)

static mp_device_t *dev;
static mp_stream_t a, b;
static gate_t g1, g2;

static void setup(void) {
  cr_assert_eq(mp_device_open("host:capacity=2G", &dev), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_stream_create(dev, &a), MP_OK);
  cr_assert_eq(mp_stream_create(dev, &b), MP_OK);
  gate_init(&g1);
  gate_init(&g2);
}
static void teardown(void) {
  gate_open(&g1);
  gate_open(&g2);
  mp_device_synchronize(dev);
  mp_device_close(dev);
}
TestSuite(stream_waits, .init = setup, .fini = teardown);

/* A host function on b: records whether each gate was open when it ran. */
typedef struct probe {
  atomic_bool ran, g1_open, g2_open;
} probe_t;

static bool is_open(gate_t *g) {
  pthread_mutex_lock(&g->mu);
  bool o = g->open;
  pthread_mutex_unlock(&g->mu);
  return o;
}

static void probe_run(void *arg) {
  probe_t *p = arg;
  atomic_store(&p->g1_open, is_open(&g1));
  atomic_store(&p->g2_open, is_open(&g2));
  atomic_store(&p->ran, true);
}

static void pause_ms(long ms) {
  struct timespec ts = {0, ms * 1000 * 1000};
  nanosleep(&ts, NULL);
}

/* b's next kernel, queued now, may touch the block b just got: it must
 * not run before a's work queued before the free (behind g1), and must run
 * once g1 opens. Opens g1. Returns what the kernel saw. */
static probe_t b_runs_after_g1(void) {
  probe_t pr = {0};
  cr_assert_eq(mp_stream_launch_host(dev, b, probe_run, &pr), MP_OK);
  pause_ms(50);
  cr_expect(!atomic_load(&pr.ran), "b ran before a's work on the block");
  gate_open(&g1);
  cr_assert_eq(mp_stream_synchronize(dev, b), MP_OK);
  cr_expect(atomic_load(&pr.ran));
  cr_expect(atomic_load(&pr.g1_open));
  return pr;
}

/* b's next kernel runs at once (g1 still closed): no wait was made. */
static void b_runs_at_once(void) {
  probe_t pr = {0};
  cr_assert_eq(mp_stream_launch_host(dev, b, probe_run, &pr), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, b), MP_OK);
  cr_expect(atomic_load(&pr.ran), "b was made to wait");
  cr_expect(!atomic_load(&pr.g1_open));
}

/* The pool has met both streams (so a free records its marker at once),
 * and x (64 MiB, on a) sits below a live guard block. */
static mp_pool_t *pool_with_block_on_a(const char *opts, void **x) {
  mp_pool_t *p = make_pool(dev, opts);
  void *t, *guard;
  cr_assert_eq(mp_pool_alloc(p, MiB, b, &t), MP_OK);
  cr_assert_eq(mp_pool_free(p, t), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 64 * MiB, a, x), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, a, &guard), MP_OK);
  return p;
}

Test(stream_waits, a_block_busy_on_another_stream_is_reused_at_once) {
  void *x, *y;
  mp_pool_t *p = pool_with_block_on_a("stream_waits=1", &x);
  size_t reserved = stats(p).reserved_bytes;
  /* a's kernel still reads x when the application frees it. */
  cr_assert_eq(mp_stream_launch_host(dev, a, gate_wait, &g1), MP_OK);
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 64 * MiB, b, &y), MP_OK, "%s", mp_last_error());
  cr_expect_eq(y, x, "the busy block was passed over");
  cr_expect_eq(stats(p).reserved_bytes, reserved, "the pool grew");
  /* b's next kernel may touch y: it must run after a's work on x. */
  (void)b_runs_after_g1();
  cr_assert_eq(mp_pool_free(p, y), MP_OK);
  mp_pool_destroy(p);
}

Test(stream_waits, the_wait_is_for_work_queued_before_the_free_only) {
  void *x, *y;
  mp_pool_t *p = pool_with_block_on_a("stream_waits=1", &x);
  cr_assert_eq(mp_stream_launch_host(dev, a, gate_wait, &g1), MP_OK);
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  /* Work a queues after the free does not touch x. */
  cr_assert_eq(mp_stream_launch_host(dev, a, gate_wait, &g2), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 64 * MiB, b, &y), MP_OK);
  cr_expect_eq(y, x);
  probe_t pr = b_runs_after_g1();
  cr_expect(!atomic_load(&pr.g2_open), "b waited for a's later work");
  gate_open(&g2);
  mp_pool_free(p, y);
  mp_pool_destroy(p);
}

Test(stream_waits, the_same_stream_never_waits_on_itself) {
  void *x, *y;
  mp_pool_t *p = pool_with_block_on_a("stream_waits=1", &x);
  cr_assert_eq(mp_stream_launch_host(dev, a, gate_wait, &g1), MP_OK);
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  /* Stream order already covers a reuse on a: no wait, same block. */
  cr_assert_eq(mp_pool_alloc(p, 64 * MiB, a, &y), MP_OK);
  cr_expect_eq(y, x);
  b_runs_at_once();
  gate_open(&g1);
  mp_pool_free(p, y);
  mp_pool_destroy(p);
}

Test(stream_waits, without_the_option_the_busy_block_is_passed_over) {
  void *x, *y;
  mp_pool_t *p = pool_with_block_on_a(NULL, &x);
  size_t reserved = stats(p).reserved_bytes;
  cr_assert_eq(mp_stream_launch_host(dev, a, gate_wait, &g1), MP_OK);
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 64 * MiB, b, &y), MP_OK);
  cr_expect_neq(y, x);
  cr_expect_gt(stats(p).reserved_bytes, reserved);
  b_runs_at_once();
  gate_open(&g1);
  mp_pool_free(p, y);
  mp_pool_destroy(p);
}

Test(stream_waits, the_option_parses_and_reads_back) {
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_expect_eq(cfg.flags & MP_POOL_STREAM_WAITS, 0u, "on by default");
  cr_assert_eq(mp_pool_config_parse(&cfg, "stream_waits=1"), MP_OK);
  cr_expect_neq(cfg.flags & MP_POOL_STREAM_WAITS, 0u);
  cr_expect_neq(mp_pool_config_parse(&cfg, "stream_waits=maybe"), MP_OK);
  cr_expect_neq(cfg.flags & MP_POOL_STREAM_WAITS, 0u,
                "a bad string changed it");
}

Test(stream_waits, a_stream_far_behind_still_hands_its_blocks_over) {
  void *x, *y;
  mp_pool_t *p = pool_with_block_on_a("stream_waits=1", &x);
  cr_assert_eq(mp_stream_launch_host(dev, a, gate_wait, &g1), MP_OK);
  /* More frees on a than the pool keeps markers pending for one stream:
   * each closes an epoch that a's blocked work keeps from completing. */
  enum { N = 12 };
  void *blk[N];
  for (int i = 0; i < N; i++)
    cr_assert_eq(mp_pool_alloc(p, (size_t)(i + 1) * MiB, a, &blk[i]), MP_OK);
  for (int i = 0; i < N; i++)
    cr_assert_eq(mp_pool_free(p, blk[i]), MP_OK);
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  size_t reserved = stats(p).reserved_bytes;
  cr_assert_eq(mp_pool_alloc(p, 64 * MiB, b, &y), MP_OK);
  cr_expect_eq(y, x, "the last block freed on a was passed over");
  cr_expect_eq(stats(p).reserved_bytes, reserved, "the pool grew");
  (void)b_runs_after_g1();
  mp_pool_free(p, y);
  mp_pool_destroy(p);
}

Test(stream_waits, growth_extends_a_busy_free_block_the_stream_can_wait_for) {
  mp_pool_t *p = make_pool(dev, "stream_waits=1");
  void *t, *x, *y;
  cr_assert_eq(mp_pool_alloc(p, MiB, b, &t), MP_OK);
  cr_assert_eq(mp_pool_free(p, t), MP_OK);
  /* x is the top of what the pool holds; a's kernel still uses it. */
  cr_assert_eq(mp_pool_alloc(p, 64 * MiB, a, &x), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, a, gate_wait, &g1), MP_OK);
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  size_t reserved = stats(p).reserved_bytes;
  /* Bigger than x: growth maps only what x lacks, above it, and b gets
   * the joined block once it waits for a. */
  cr_assert_eq(mp_pool_alloc(p, 96 * MiB, b, &y), MP_OK);
  cr_expect_eq(y, x, "the busy block was left apart");
  cr_expect_leq(stats(p).reserved_bytes, reserved + 32 * MiB,
                "growth mapped the whole request");
  (void)b_runs_after_g1();
  mp_pool_free(p, y);
  mp_pool_destroy(p);
}

/* Free neighbours freed on more streams than a block record names (4):
 * the pool joins their work on a stream of its own, so they still merge
 * into one block b can have at once; b then waits for every one of them. */
enum { NS = 5 };
static gate_t gs[NS];

static void count_open(void *arg) {
  int n = 0;
  for (int i = 0; i < NS; i++)
    n += is_open(&gs[i]);
  atomic_store((atomic_int *)arg, n + 1); /* +1: it ran */
}

Test(stream_waits, neighbours_freed_on_many_streams_still_merge) {
  mp_pool_t *p = make_pool(dev, "stream_waits=1");
  mp_stream_t s[NS];
  void *x[NS], *t, *guard, *y;
  for (int i = 0; i < NS; i++) {
    cr_assert_eq(mp_stream_create(dev, &s[i]), MP_OK);
    gate_init(&gs[i]);
    /* The pool meets every stream before the frees that matter. */
    cr_assert_eq(mp_pool_alloc(p, MiB, s[i], &t), MP_OK);
    cr_assert_eq(mp_pool_free(p, t), MP_OK);
  }
  cr_assert_eq(mp_pool_alloc(p, MiB, b, &t), MP_OK);
  cr_assert_eq(mp_pool_free(p, t), MP_OK);
  for (int i = 0; i < NS; i++)
    cr_assert_eq(mp_pool_alloc(p, 8 * MiB, s[i], &x[i]), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, b, &guard), MP_OK);
  for (int i = 0; i < NS; i++) {
    cr_assert_eq((char *)x[i], (char *)x[0] + (size_t)i * 8 * MiB,
                 "the blocks are not neighbours");
    cr_assert_eq(mp_stream_launch_host(dev, s[i], gate_wait, &gs[i]), MP_OK);
    cr_assert_eq(mp_pool_free(p, x[i]), MP_OK);
  }
  size_t reserved = stats(p).reserved_bytes;
  cr_assert_eq(mp_pool_alloc(p, NS * 8 * MiB, b, &y), MP_OK);
  cr_expect_eq(y, x[0], "the neighbours were left apart");
  cr_expect_eq(stats(p).reserved_bytes, reserved, "the pool grew");
  atomic_int seen = 0;
  cr_assert_eq(mp_stream_launch_host(dev, b, count_open, &seen), MP_OK);
  for (int i = 0; i < NS; i++) {
    pause_ms(20);
    cr_expect_eq(atomic_load(&seen), 0, "b ran with %d gates open", i);
    gate_open(&gs[i]);
  }
  cr_assert_eq(mp_stream_synchronize(dev, b), MP_OK);
  cr_expect_eq(atomic_load(&seen), NS + 1);
  cr_assert_eq(mp_pool_free(p, y), MP_OK);
  cr_assert_eq(mp_pool_free(p, guard), MP_OK);
  mp_pool_destroy(p);
  for (int i = 0; i < NS; i++)
    mp_stream_destroy(dev, s[i]);
}
