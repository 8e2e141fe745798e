/* A call that names a stream to mp_pool_graph_begin while the stream's
 * slot is set aside around its destroy (the preload shim:
 * mp__stream_set_aside, then mp__stream_set_aside_end; another thread's
 * call on the dying stream) gives the stream a slot of its own, marked
 * capturing and routed to the graph pool. The destroy went through and
 * no new stream was given the handle meanwhile (mp__stream_born): that
 * slot and its route are the dead stream's, and go with it. They stayed,
 * matched to the dead handle (a capturing slot was taken for a new
 * stream's): a stream the driver later gave the handle allocated to that
 * graph pool, and its own mp_pool_graph_begin was refused (MP_EBUSY).
 * White-box: calls the shim's set-aside entry points itself (stream.c);
 * the host stream stands for the new stream given the same handle. */
#include <criterion/criterion.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"

MP_DEVICE_SUITE(pool_stream_route_begun_during_destroy, "host:capacity=64M");

static void run(bool over) {
  mp_pool_t *parent = make_pool(dev, NULL);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  void *a = NULL, *p = NULL;
  cr_assert_eq(mp_pool_alloc(parent, 4096, s, &a), MP_OK, "%s",
               mp_last_error());
  mp_pool_t *g1 = NULL, *g2 = NULL;
  cr_assert_eq(mp_pool_graph_create(parent, &g1), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_create(parent, &g2), MP_OK, "%s", mp_last_error());
  mp__stream_set_aside(dev, s);
  /* Another thread routes the dying stream. */
  cr_assert_eq(mp_pool_graph_begin(parent, g1, s), MP_OK, "%s",
               mp_last_error());
  mp__stream_set_aside_end(dev, s, true, over);
  check(parent);
  cr_expect_null(mp_pool_graph_of(parent, s),
                 "the dead stream's route stays matched to its handle");
  /* A new stream given the handle. */
  cr_assert_eq(mp_pool_alloc(parent, 4096, s, &p), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(stats(g1).live_blocks, 0,
               "a new stream with the dead one's handle allocated to the "
               "dead stream's graph pool");
  cr_assert_eq(mp_pool_free(parent, p), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_graph_begin(parent, g2, s), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_graph_of(parent, s), g2,
               "the new stream is not routed to its own graph pool");
  check(parent);
  (void)mp_pool_graph_end(parent, s);
  cr_assert_eq(mp_pool_free(parent, a), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g1), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g2), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(parent), MP_OK, "%s", mp_last_error());
}

Test(pool_stream_route_begun_during_destroy, goes_with_the_stream) {
  run(false);
}

Test(pool_stream_route_begun_during_destroy,
     goes_with_the_stream_and_its_capture) {
  run(true);
}
