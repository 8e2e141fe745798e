/* Stream-ordered reuse on the host device, with a stream held busy by a host
 * function that waits on a gate: a block freed on a busy stream is reused at
 * once on that stream, never handed to another stream before the work is
 * done, and becomes shared again once it is. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include <mempool/mempool.h>

#include "../support/stream_gate.h"
#include "../support/stream_reuse.h"

#define MiB ((size_t)1 << 20)

static gate_t gate;

static mp_device_t *dev;
static mp_pool_t *pool;
static mp_stream_t s1, s2;

static void setup_with(const char *spec) {
  gate_init(&gate);
  cr_assert_eq(mp_device_open(spec, &dev), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_create(dev, NULL, &pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_create(dev, &s1), MP_OK);
  cr_assert_eq(mp_stream_create(dev, &s2), MP_OK);
}
static void setup(void) {
  setup_with("host");
}
static void setup_plain(void) {
  setup_with("host:vmm=0");
}
/* A device whose streams reach each queued operation 20 ms after it was
 * queued: a marker recorded on an idle stream stays pending that long. */
static void setup_slow_queue(void) {
  setup_with("host:stream_latency_us=20000");
}
static void teardown(void) {
  gate_open(&gate);
  mp_stream_synchronize(dev, s1);
  mp_stream_synchronize(dev, s2);
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_destroy(pool), MP_OK);
  mp_stream_destroy(dev, s1);
  mp_stream_destroy(dev, s2);
  mp_device_close(dev);
}

/* Sizes are whole 2 MiB segments/granules, so best fit has one candidate. */
static void busy_block_is_not_given_to_another_stream(void) {
  void *a, *b, *c;
  cr_assert_eq(mp_pool_alloc(pool, 2 * MiB, s1, &a), MP_OK);
  /* s1: wait for the gate, then fill a with 0xAA. */
  cr_assert_eq(mp_stream_launch_host(dev, s1, gate_wait, &gate), MP_OK);
  cr_assert_eq(mp_memset_async(dev, a, 0xAA, 2 * MiB, s1), MP_OK);
  cr_assert_eq(mp_pool_free(pool, a), MP_OK);
  /* Another stream must not get a while s1 has not run the memset. */
  cr_assert_eq(mp_pool_alloc(pool, 2 * MiB, s2, &b), MP_OK);
  cr_expect_neq(b, a, "a block pending on a busy stream went to another");
  cr_assert_eq(mp_memset_async(dev, b, 0xBB, 2 * MiB, s2), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s2), MP_OK);
  /* The freeing stream itself may reuse it at once (stream order). */
  cr_assert_eq(mp_pool_alloc(pool, 2 * MiB, s1, &c), MP_OK);
  cr_expect_eq(c, a, "the freeing stream reuses its block at once");
  gate_open(&gate);
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  unsigned char *pa = a;
  cr_expect_eq(pa[0], 0xAA);
  cr_expect_eq(pa[2 * MiB - 1], 0xAA);
  mp_pool_free(pool, b);
  mp_pool_free(pool, c);
}

Test(pool_streams, busy_block_is_not_given_to_another_stream, .init = setup,
     .fini = teardown) {
  busy_block_is_not_given_to_another_stream();
}

Test(pool_streams, busy_block_is_not_given_to_another_stream_plain,
     .init = setup_plain, .fini = teardown) {
  busy_block_is_not_given_to_another_stream();
}

Test(pool_streams, finished_blocks_are_shared_between_streams, .init = setup,
     .fini = teardown) {
  void *v[64];
  for (int i = 0; i < 64; i++)
    cr_assert_eq(mp_pool_alloc(pool, 64 * 1024, s1, &v[i]), MP_OK);
  for (int i = 0; i < 64; i++)
    mp_pool_free(pool, v[i]);
  mp_stats_t before;
  mp_pool_get_stats(pool, &before);
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  /* The first look records a marker on s1 and may pass the blocks by; once
   * the marker is seen complete they are everyone's. */
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < 64; i++)
      cr_assert_eq(mp_pool_alloc(pool, 64 * 1024, s2, &v[i]), MP_OK);
    for (int i = 0; i < 64; i++)
      mp_pool_free(pool, v[i]);
    mp_stream_synchronize(dev, s1);
    mp_stream_synchronize(dev, s2);
  }
  mp_stats_t after;
  mp_pool_get_stats(pool, &after);
  cr_expect_leq(after.reserved_bytes, before.reserved_bytes + 4 * MiB,
                "reserved %zu -> %zu: idle blocks of one stream must stay "
                "reachable from another",
                before.reserved_bytes, after.reserved_bytes);
  cr_expect_eq(mp_pool_check(pool), MP_OK,
               "idle blocks of one stream must stay reachable from another");
}

/* Blocks freed on a stream the application has synchronized go to another
 * stream at once, even where a marker recorded now would stay pending for
 * a while (the pool asks whether the stream is idle instead): no growth.
 * s2 is new to the pool here, which closes s1's open epoch. */
Test(pool_streams, blocks_of_a_synchronized_stream_go_to_another_at_once,
     .init = setup_slow_queue, .fini = teardown) {
  synced_blocks_go_to_another_stream(pool, dev, s1, s2);
}

Test(pool_streams, record_stream_holds_the_block_until_that_stream_is_done,
     .init = setup, .fini = teardown) {
  void *a, *b, *c;
  cr_assert_eq(mp_pool_alloc(pool, 2 * MiB, s1, &a), MP_OK);
  cr_assert_eq(mp_pool_record_stream(pool, a, s2), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, s2, gate_wait, &gate), MP_OK);
  cr_assert_eq(mp_memset_async(dev, a, 0x5A, 2 * MiB, s2), MP_OK);
  cr_assert_eq(mp_pool_free(pool, a), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, 2 * MiB, s1, &b), MP_OK);
  cr_expect_neq(b, a, "s2 still uses the block: not even s1 may have it");
  gate_open(&gate);
  cr_assert_eq(mp_stream_synchronize(dev, s2), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, 2 * MiB, s1, &c), MP_OK);
  cr_expect_eq(c, a, "reusable once s2 is done");
  cr_expect_eq(((unsigned char *)a)[2 * MiB - 1], 0x5A);
  mp_pool_free(pool, b);
  mp_pool_free(pool, c);
}

Test(pool_streams, many_streams_do_not_fragment_the_pool, .init = setup,
     .fini = teardown) {
  enum { NS = 16 };
  mp_stream_t s[NS];
  for (int i = 0; i < NS; i++)
    cr_assert_eq(mp_stream_create(dev, &s[i]), MP_OK);
  void *v[NS];
  for (int round = 0; round < 20; round++) {
    for (int i = 0; i < NS; i++)
      cr_assert_eq(mp_pool_alloc(pool, 4 * MiB, s[(i + round) % NS], &v[i]),
                   MP_OK);
    for (int i = 0; i < NS; i++)
      cr_assert_eq(mp_pool_free(pool, v[i]), MP_OK);
    for (int i = 0; i < NS; i++)
      mp_stream_synchronize(dev, s[i]);
  }
  mp_stats_t st;
  mp_pool_get_stats(pool, &st);
  /* Live peak is 64 MiB; per-stream caches that never share would hold
   * many times that. */
  cr_expect_leq(st.reserved_bytes, 2 * 64 * MiB, "reserved %zu",
                st.reserved_bytes);
  for (int i = 0; i < NS; i++)
    mp_stream_destroy(dev, s[i]);
}

/* True when [p, p + n) and [q, q + m) do not overlap. */
static bool apart(const void *p, size_t n, const void *q, size_t m) {
  const char *a = p, *b = q;
  return a + n <= b || b + m <= a;
}

/* A pool that has seen one stream only records no marker at a free; the
 * second stream to appear must still wait for the first one's work. */
Test(pool_streams,
     block_of_a_one_stream_pool_waits_for_it_when_a_second_appears,
     .init = setup, .fini = teardown) {
  void *a, *b;
  cr_assert_eq(mp_pool_alloc(pool, 2 * MiB, s1, &a), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, s1, gate_wait, &gate), MP_OK);
  cr_assert_eq(mp_memset_async(dev, a, 0xA1, 2 * MiB, s1), MP_OK);
  cr_assert_eq(mp_pool_free(pool, a), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, 2 * MiB, s2, &b), MP_OK);
  cr_expect_neq(b, a, "s1's pending block went to a new stream");
  gate_open(&gate);
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  cr_expect_eq(((unsigned char *)a)[2 * MiB - 1], 0xA1);
  mp_pool_free(pool, b);
}

/* Coalescing a block pending on a busy stream with an idle neighbour must
 * not let another stream have the merged block. */
Test(pool_streams, merged_block_keeps_the_wait_of_its_busy_part, .init = setup,
     .fini = teardown) {
  void *a, *b, *c, *x;
  cr_assert_eq(mp_pool_alloc(pool, MiB, s1, &a), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, MiB, s2, &b), MP_OK);
  cr_assert_eq((char *)b, (char *)a + MiB, "adjacent in the fresh segment");
  cr_assert_eq(mp_pool_free(pool, b), MP_OK); /* idle: s2 runs nothing */
  cr_assert_eq(mp_stream_synchronize(dev, s2), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, s1, gate_wait, &gate), MP_OK);
  cr_assert_eq(mp_memset_async(dev, a, 0xA2, MiB, s1), MP_OK);
  cr_assert_eq(mp_pool_free(pool, a), MP_OK); /* merges with b's space */
  cr_assert_eq(mp_pool_alloc(pool, 2 * MiB, s2, &c), MP_OK);
  cr_expect(apart(c, 2 * MiB, a, MiB),
            "s2 got memory overlapping a block s1 still writes");
  cr_assert_eq(mp_pool_alloc(pool, MiB, s2, &x), MP_OK);
  cr_expect(apart(x, MiB, a, MiB), "s2 got a block s1 still writes");
  gate_open(&gate);
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  cr_expect_eq(((unsigned char *)a)[MiB - 1], 0xA2);
  mp_pool_free(pool, c);
  mp_pool_free(pool, x);
}

/* A block freed on a busy stream and split by that stream's next
 * allocation: the rest keeps the wait, so another stream does not get it
 * (the take's split hands the rest the freed block's own record). */
Test(pool_streams, rest_of_a_split_keeps_the_wait_of_its_block, .init = setup,
     .fini = teardown) {
  void *a, *c, *x;
  cr_assert_eq(mp_pool_alloc(pool, 2 * MiB, s1, &a), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, s1, gate_wait, &gate), MP_OK);
  cr_assert_eq(mp_memset_async(dev, a, 0xA3, 2 * MiB, s1), MP_OK);
  cr_assert_eq(mp_pool_free(pool, a), MP_OK);
  /* s1 reuses a at once: the low quarter, the rest split off. */
  cr_assert_eq(mp_pool_alloc(pool, MiB / 2, s1, &c), MP_OK);
  cr_assert_eq(c, a, "the freeing stream reuses its block at once");
  mp_stats_t st;
  cr_assert_eq(mp_pool_get_stats(pool, &st), MP_OK);
  cr_assert_eq(st.free_blocks, 1, "the rest is a free block of its own");
  cr_assert_eq(mp_pool_alloc(pool, MiB, s2, &x), MP_OK);
  cr_expect(apart(x, MiB, a, 2 * MiB), "s2 got the rest of a block s1 writes");
  gate_open(&gate);
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  cr_expect_eq(((unsigned char *)a)[2 * MiB - 1], 0xA3);
  mp_pool_free(pool, c);
  mp_pool_free(pool, x);
}

/* Pieces of a contiguous allocation are blocks of their own: each waits for
 * the stream that used it, whether freed alone or merged back. */
Test(pool_streams, contiguous_pieces_freed_on_a_busy_stream_wait_for_it,
     .init = setup, .fini = teardown) {
  size_t sizes[3] = {MiB, MiB, 2 * MiB};
  void *out[3], *b;
  cr_assert_eq(mp_pool_alloc_contiguous(pool, 3, sizes, s1, out), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, s1, gate_wait, &gate), MP_OK);
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(mp_memset_async(dev, out[i], 0xA3 + i, sizes[i], s1), MP_OK);
    cr_assert_eq(mp_pool_free(pool, out[i]), MP_OK);
  }
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(mp_pool_alloc(pool, sizes[i], s2, &b), MP_OK);
    cr_expect(apart(b, sizes[i], out[0], 4 * MiB),
              "s2 got memory of pieces s1 still writes");
    mp_pool_free(pool, b);
  }
  gate_open(&gate);
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  for (int i = 0; i < 3; i++)
    cr_expect_eq(((unsigned char *)out[i])[sizes[i] - 1], 0xA3 + i);
}

/* Growth must never wait for another stream's work: that work may be
 * waiting for the very caller that is allocating (here: a gate only the
 * test thread opens). The allocation runs in a thread; if it has not
 * returned within seconds it is blocked, and the test opens the gate to
 * end it and fails. */
struct grow_arg {
  mp_pool_t *pool;
  mp_stream_t s;
  void *p;
  mp_status_t st;
  bool done;
  pthread_mutex_t mu;
};

static void *grow_on_stream(void *arg) {
  struct grow_arg *g = arg;
  void *p = NULL;
  mp_status_t st = mp_pool_alloc(g->pool, 64 * MiB, g->s, &p);
  pthread_mutex_lock(&g->mu);
  g->p = p;
  g->st = st;
  g->done = true;
  pthread_mutex_unlock(&g->mu);
  return NULL;
}

static bool grow_done(struct grow_arg *g) {
  pthread_mutex_lock(&g->mu);
  bool done = g->done;
  pthread_mutex_unlock(&g->mu);
  return done;
}

static void growth_does_not_wait_for_a_busy_stream(const char *options) {
  mp_device_t *d;
  mp_pool_t *p;
  mp_stream_t a, b;
  gate_t g;
  gate_init(&g);
  cr_assert_eq(mp_device_open("host:capacity=1G", &d), MP_OK);
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_assert_eq(mp_pool_config_parse(&cfg, options), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_create(d, &cfg, &p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_create(d, &a), MP_OK);
  cr_assert_eq(mp_stream_create(d, &b), MP_OK);
  void *keep = NULL, *big = NULL;
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, b, &keep), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 32 * MiB, a, &big), MP_OK);
  cr_assert_eq(mp_stream_launch_host(d, a, gate_wait, &g), MP_OK);
  /* Freed while stream a is held: a quarter and more of the pool is free,
   * but not yet reusable from stream b. */
  cr_assert_eq(mp_pool_free(p, big), MP_OK);

  struct grow_arg arg = {.pool = p, .s = b};
  pthread_mutex_init(&arg.mu, NULL);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, grow_on_stream, &arg), 0);
  bool returned = false;
  /* 30 s at most (3 s was short for a loaded machine: the grower is a
   * thread of its own); an allocation that waits for a's gate never
   * returns before the gate opens below. */
  for (int i = 0; i < 3000 && !returned; i++) {
    usleep(10 * 1000);
    returned = grow_done(&arg);
  }
  gate_open(&g);
  pthread_join(t, NULL);
  cr_expect(returned, "%s: an allocation on stream b waited for stream a",
            options);
  cr_expect_eq(arg.st, MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_free(p, arg.p), MP_OK);
  cr_expect_eq(mp_pool_free(p, keep), MP_OK);
  mp_device_synchronize(d);
  cr_expect_eq(mp_pool_check(p), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_destroy(p), MP_OK);
  mp_stream_destroy(d, a);
  mp_stream_destroy(d, b);
  mp_device_close(d);
  pthread_mutex_destroy(&arg.mu);
  gate_destroy(&g);
}

Test(pool_streams, growth_does_not_wait_for_a_busy_stream) {
  growth_does_not_wait_for_a_busy_stream("max_split=4M");
  growth_does_not_wait_for_a_busy_stream("virtual=1");
  growth_does_not_wait_for_a_busy_stream("virtual=0,max_split=4M");
}

Test(pool_streams,
     free_async_waits_for_the_free_stream_and_refusals_change_nothing,
     .init = setup, .fini = teardown) {
  void *p = NULL, *q = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 2 * MiB, s1, &p), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, s2, gate_wait, &gate), MP_OK);
  cr_assert_eq(mp_pool_free_async(pool, p, s2), MP_OK, "%s", mp_last_error());
  /* p may still be in use on the held stream s2: even its own stream s1
   * must not get it back. */
  cr_assert_eq(mp_pool_alloc(pool, 2 * MiB, s1, &q), MP_OK);
  cr_expect_neq(q, p, "a block freed on a busy stream was reused");

  mp_stats_t before, after;
  cr_assert_eq(mp_pool_get_stats(pool, &before), MP_OK);
  cr_expect_eq(mp_pool_free_async(pool, p, s2), MP_EINVAL, "double free");
  cr_expect_eq(mp_pool_free_async(pool, (char *)q + 512, s2), MP_EINVAL);
  cr_expect_eq(mp_pool_free_async(NULL, q, s2), MP_EINVAL);
  cr_expect_eq(mp_pool_free_async(pool, NULL, s2), MP_OK);
  cr_assert_eq(mp_pool_get_stats(pool, &after), MP_OK);
  cr_expect_eq(memcmp(&before, &after, sizeof before), 0,
               "a refused free_async changed the pool");
  cr_expect_eq(mp_pool_free(pool, q), MP_OK);
}
