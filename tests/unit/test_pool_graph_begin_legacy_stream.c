/* mp_pool_graph_begin on the legacy default stream (NULL, or
 * CU_STREAM_LEGACY's handle 0x1) is MP_EINVAL and changes nothing: CUDA
 * cannot capture that stream (cuda.h, cuStreamBeginCapture: "Capture may
 * not be initiated if stream is CU_STREAM_LEGACY"), and begin only routes
 * and marks the stream, so a route there would send every default-stream
 * allocation to the graph pool and mark the stream capturing for a capture
 * that cannot exist. On the host device too (it has no capture), as on
 * CUDA. Nothing is routed or marked: the default stream still allocates
 * from the parent, the graph pool still releases (no stream left
 * capturing), and a created stream is still routed. With arenas or
 * without. Before, begin on NULL returned MP_OK and routed it. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)

static void run(const char *opts) {
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host:capacity=1G", &dev), MP_OK, "%s",
               mp_last_error());
  mp_pool_t *parent = make_pool(dev, opts);
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(parent, &g), MP_OK, "%s", mp_last_error());
  mp_stream_t legacy[2] = {NULL, (mp_stream_t)(uintptr_t)0x1};
  for (int i = 0; i < 2; i++) {
    cr_expect_eq(mp_pool_graph_begin(parent, g, legacy[i]), MP_EINVAL,
                 "%s: stream %p", opts, (void *)legacy[i]);
    cr_expect(strstr(mp_last_error(), "legacy default stream") != NULL, "%s",
              mp_last_error());
    cr_expect_null(mp_pool_graph_of(parent, legacy[i]), "%s: routed", opts);
  }
  cr_expect_eq(parent->ncapturing, 0, "%s: the parent marked a stream", opts);
  cr_expect_eq(g->ncapturing, 0, "%s: the graph pool marked a stream", opts);
  /* The default stream allocates from the parent, not the graph pool. */
  void *p;
  cr_assert_eq(mp_pool_alloc(parent, MiB, NULL, &p), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(stats(g).reserved_bytes, 0, "%s: served by the graph pool",
               opts);
  cr_expect_eq(mp_pool_free(parent, p), MP_OK, "%s", mp_last_error());
  /* A created stream is still routed. */
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_graph_begin(parent, g, s), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_graph_of(parent, s), g);
  cr_expect_eq(mp_pool_graph_end(parent, s), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_check(parent), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_destroy(parent), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

Test(pool_graph_begin_legacy_stream, without_arenas) {
  run(NULL);
}

Test(pool_graph_begin_legacy_stream, with_arenas) {
  run("arenas=2");
}
