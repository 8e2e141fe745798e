/* A stream that allocates to a graph pool (mp_pool_graph_begin) and whose
 * destroy the driver refuses keeps its route, even when a call named the
 * stream while its slot was set aside around that destroy (the preload
 * shim: mp__stream_set_aside, then mp__stream_set_aside_end; another
 * thread's call, which made the stream a slot of its own). The set-aside
 * slot, which holds the capture's marks and with them the route, was the
 * one forgotten: the stream, still captured, allocated from the parent's
 * cache, and mp_pool_graph_end found no route to end. White-box: calls the
 * shim's set-aside entry points itself (stream.c). */
#include <criterion/criterion.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"

MP_DEVICE_SUITE(pool_stream_refused_destroy, "host:capacity=64M");

Test(pool_stream_refused_destroy, keeps_the_route_of_a_stream_used_meanwhile) {
  mp_pool_t *parent = make_pool(dev, NULL);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  mp_pool_t *g = NULL;
  cr_assert_eq(mp_pool_graph_create(parent, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(parent, g, s), MP_OK, "%s", mp_last_error());
  mp__stream_set_aside(dev, s);
  /* Another thread names the stream to the parent during the destroy. */
  cr_assert_eq(mp_pool_add_stream(parent, s), MP_OK, "%s", mp_last_error());
  /* The driver refused the destroy: the stream lives on, still captured. */
  mp__stream_set_aside_end(dev, s, false, false);
  check(parent);
  cr_expect_eq(mp_pool_graph_of(parent, s), g,
               "the stream's route to its graph pool went with the refused "
               "destroy");
  void *p = NULL;
  cr_assert_eq(mp_pool_alloc(parent, 4096, s, &p), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(stats(g).live_blocks, 1,
               "an allocation of the captured stream did not go to its graph "
               "pool");
  cr_assert_eq(mp_pool_free(parent, p), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_graph_end(parent, s), MP_OK, "%s", mp_last_error());
  check(parent);
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(parent), MP_OK, "%s", mp_last_error());
}
