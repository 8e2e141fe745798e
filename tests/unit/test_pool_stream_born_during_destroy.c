/* A capturing stream the program destroys has its slot set aside around
 * the driver's destroy (the preload shim: mp__stream_set_aside, then
 * mp__stream_set_aside_end). Once the driver has destroyed it, and before
 * the shim has told the pools so, the driver may give its handle to a new
 * stream (another thread's cuStreamCreate, which tells the pools:
 * mp__stream_born), and that stream may allocate and free. Its slot was
 * forgotten at the end of the destroy as if the dead stream's: the blocks
 * it had freed waited for a device synchronize, even for itself, and the
 * stream, which the shim had added to the pool for cuMemFree, was unknown
 * to the pool from then on. A use of the dead stream during its destroy,
 * before the new stream had the handle, still goes with the dead stream.
 * White-box: calls the shim's entry points itself (stream.c); the host
 * stream stands for the new stream given the same handle. */
#include <criterion/criterion.h>

#include "../support/pool_helpers.h"
#include "../support/stream_gate.h"
#include "pool/pool_internal.h"

MP_DEVICE_SUITE(pool_stream_born_during_destroy, "host:capacity=64M");

static bool known(mp_pool_t *pool, mp_stream_t s) {
  mp__pool_lock(pool);
  bool k = mp__stream_known(pool, s);
  mp__pool_unlock(pool);
  return k;
}

Test(pool_stream_born_during_destroy, keeps_the_new_streams_slot) {
  mp_pool_t *pool = make_pool(dev, NULL);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  void *a = NULL, *b = NULL, *c = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 4096, s, &a), MP_OK, "%s", mp_last_error());
  mp__stream_set_aside(dev, s);
  /* The driver destroyed the stream and gave its handle to a new one,
   * which the shim adds to the pool, and which allocates and frees. */
  mp__stream_born(dev, s);
  cr_assert_eq(mp_pool_add_stream(pool, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, 4096, s, &b), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, b), MP_OK, "%s", mp_last_error());
  /* The shim hears the destroy went through. */
  mp__stream_set_aside_end(dev, s, true, false);
  check(pool);
  cr_expect(known(pool, s), "the new stream is unknown to the pool after the "
                            "destroy of the stream that had its handle");
  cr_assert_eq(mp_pool_alloc(pool, 4096, s, &c), MP_OK, "%s", mp_last_error());
  cr_expect_eq(c, b,
               "the new stream did not get back at once the block it had "
               "freed itself (it waited for a device synchronize)");
  check(pool);
  cr_assert_eq(mp_pool_free(pool, c), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, a), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

Test(pool_stream_born_during_destroy, leaves_the_dead_streams_use_dead) {
  mp_pool_t *pool = make_pool(dev, NULL);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 4096, s, &a), MP_OK, "%s", mp_last_error());
  gate_t g;
  gate_init(&g);
  cr_assert_eq(mp_stream_launch_host(dev, s, gate_wait, &g), MP_OK, "%s",
               mp_last_error());
  mp__stream_set_aside(dev, s);
  /* Another thread's use of the dying stream, its work still queued. */
  cr_assert_eq(mp_pool_alloc(pool, 4096, s, &b), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, b), MP_OK, "%s", mp_last_error());
  /* Destroyed; a new stream gets the handle. */
  mp__stream_born(dev, s);
  cr_assert_eq(mp_pool_alloc(pool, 4096, s, &c), MP_OK, "%s", mp_last_error());
  cr_expect_neq(c, b,
                "a new stream with the dead one's handle got the block freed "
                "on it at once, its work still queued");
  cr_assert_eq(mp_pool_free(pool, c), MP_OK, "%s", mp_last_error());
  mp__stream_set_aside_end(dev, s, true, false);
  check(pool);
  cr_expect(known(pool, s), "the new stream is unknown to the pool");
  cr_assert_eq(mp_pool_alloc(pool, 4096, s, &d), MP_OK, "%s", mp_last_error());
  cr_expect_neq(d, b, "the dead stream's block went to the new stream");
  cr_expect_eq(d, c, "the new stream did not get back its own block");
  check(pool);
  cr_assert_eq(mp_pool_free(pool, d), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, a), MP_OK, "%s", mp_last_error());
  gate_open(&g);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  gate_destroy(&g);
}

/* The dead stream allocated to a graph pool: its route goes at the birth,
 * so the new stream may begin a capture of its own, which the end of the
 * destroy leaves (it removed the route of the handle, the new one's). */
Test(pool_stream_born_during_destroy, lets_the_new_stream_route_its_capture) {
  mp_pool_t *parent = make_pool(dev, NULL);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  mp_pool_t *g1 = NULL, *g2 = NULL;
  cr_assert_eq(mp_pool_graph_create(parent, &g1), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_create(parent, &g2), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(parent, g1, s), MP_OK, "%s",
               mp_last_error());
  mp__stream_set_aside(dev, s);
  mp__stream_born(dev, s);
  cr_expect_eq(mp_pool_graph_begin(parent, g2, s), MP_OK, "%s",
               mp_last_error());
  mp__stream_set_aside_end(dev, s, true, true);
  check(parent);
  cr_expect_eq(mp_pool_graph_of(parent, s), g2,
               "the new stream's route went with the dead stream");
  void *p = NULL;
  cr_assert_eq(mp_pool_alloc(parent, 4096, s, &p), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(stats(g2).live_blocks, 1,
               "the new stream's allocation did not go to its graph pool");
  cr_assert_eq(mp_pool_free(parent, p), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_graph_end(parent, s), MP_OK, "%s", mp_last_error());
  check(parent);
  cr_assert_eq(mp_pool_graph_release(g1), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g2), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(parent), MP_OK, "%s", mp_last_error());
}

/* The new stream, which the shim added to the pool (cuStreamCreate), stays
 * known after the destroy: mp_pool_free_after_all (cuMemFree) waits for
 * its work. Forgotten, with nothing of its own open, it was not waited
 * for: another stream got the block back at once. */
Test(pool_stream_born_during_destroy, free_after_all_waits_for_the_new_stream) {
  mp_pool_t *pool = make_pool(dev, NULL);
  mp_stream_t s, t;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_create(dev, &t), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_add_stream(pool, s), MP_OK, "%s", mp_last_error());
  mp__stream_set_aside(dev, s);
  mp__stream_born(dev, s);
  cr_assert_eq(mp_pool_add_stream(pool, s), MP_OK, "%s", mp_last_error());
  mp__stream_set_aside_end(dev, s, true, false);
  check(pool);
  /* The device synchronize the dead stream's slot is owed (a trim with
   * memory to give back pays it). */
  void *x = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 4096, t, &x), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, x), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  gate_t g;
  gate_init(&g);
  cr_assert_eq(mp_stream_launch_host(dev, s, gate_wait, &g), MP_OK, "%s",
               mp_last_error());
  void *p = NULL, *q = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 4096, t, &p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free_after_all(pool, p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, 4096, t, &q), MP_OK, "%s", mp_last_error());
  cr_expect_neq(q, p,
                "a block freed after all streams went back to another stream "
                "while the new stream's work was still queued");
  check(pool);
  gate_open(&g);
  cr_assert_eq(mp_pool_free(pool, q), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, t), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  gate_destroy(&g);
}
