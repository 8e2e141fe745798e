/* A graph pool released by the thread whose CU_STREAM_PER_THREAD only
 * the graph pool met (a graph's output read there, mp_pool_record_stream):
 * its parent learns that stream (the calling thread's own, on which it can
 * record) instead of owing a device synchronize for the range it gets
 * back. A cuCtxSynchronize is a "potentially unsafe" call, which a capture
 * in global mode on another thread prohibits and is invalidated by
 * (cuda.h, cuStreamBeginCapture_v2), on a stream the parent never met, so
 * the pool could not see that capture to refuse the call. */
#include <stdint.h>
#include <stdio.h>

#include <cuda.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "../support/stream_gate.h"
#include "capture_beside.h"
#include "fakecuda_test.h"

#define MiB ((size_t)1 << 20)

static mp_device_t *dev;
static mp_pool_t *pool, *g;
static mp_stream_t cs; /* the captured stream */

/* A pool on the cuda device with a graph pool g, and p: a MiB a capture
 * on cs allocated from g, its route ended (the graph's output). */
static void *graph_output(void) {
  dev = open_dev("cuda");
  cr_assert_eq(mp_pool_create(dev, NULL, &pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_create(dev, &cs), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, g, cs), MP_OK, "%s", mp_last_error());
  void *p = NULL;
  cr_assert_eq(mp_pool_alloc(pool, MiB, cs, &p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_end(pool, cs), MP_OK, "%s", mp_last_error());
  return p;
}

/* Destroys what graph_output made. */
static void done(void) {
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, cs), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

Test(cuda_graph_release_own_per_thread_stream,
     giving_the_range_back_keeps_a_capture_beside_valid) {
  mp_stream_t pt = (mp_stream_t)CU_STREAM_PER_THREAD;
  void *p = graph_output();
  /* The graph's output, read on this thread's per-thread stream: only the
   * graph pool meets that stream. */
  cr_assert_eq(mp_pool_record_stream(pool, p, pt), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(pool, p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  /* The range is free in the parent; giving it back to the device waits
   * for the streams that may still use it, by their events, while another
   * thread captures in global mode. */
  capture_t cap;
  capture_start(&cap);
  mp_status_t st = mp_pool_trim(pool, 0);
  char why[512];
  snprintf(why, sizeof why, "%s", mp_last_error());
  capture_finish(&cap);
  cr_assert_eq(st, MP_OK, "%s", why);
  mp_stats_t s;
  cr_assert_eq(mp_pool_get_stats(pool, &s), MP_OK);
  cr_expect_eq(s.reserved_bytes, 0, "%zu bytes still reserved",
               s.reserved_bytes);
  done();
}

/* Learned, the stream still holds the range back: while work queued on
 * the per-thread stream before the free runs (a host function held at a
 * gate), the parent hands the range to no other stream. */
Test(cuda_graph_release_own_per_thread_stream,
     the_range_still_waits_for_the_per_thread_streams_work) {
  mp_stream_t pt = (mp_stream_t)CU_STREAM_PER_THREAD;
  void *p = graph_output();
  mp_stream_t other = NULL;
  cr_assert_eq(mp_stream_create(dev, &other), MP_OK, "%s", mp_last_error());
  gate_t gate;
  gate_init(&gate);
  cr_assert_eq(mp_stream_launch_host(dev, pt, gate_wait, &gate), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_record_stream(pool, p, pt), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(pool, p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  void *q = NULL;
  cr_assert_eq(mp_pool_alloc(pool, MiB, other, &q), MP_OK, "%s",
               mp_last_error());
  cr_expect(
      !((uintptr_t)q < (uintptr_t)p + MiB && (uintptr_t)p < (uintptr_t)q + MiB),
      "%p, in the range at %p, while the per-thread stream's work runs", q, p);
  gate_open(&gate);
  cr_assert_eq(mp_stream_synchronize(dev, pt), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, q), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, other), MP_OK, "%s", mp_last_error());
  gate_destroy(&gate);
  done();
}
