/* test_cuda_direct_beside_capture.c - the direct allocator never
 * synchronizes the device while another stream of it is being captured.
 * Ending a session (mp_direct_free_session, the retry of an allocation
 * that finds the device full) and mp_direct_destroy synchronize the device
 * (cuCtxSynchronize) before they free, and that waits for every stream of
 * the context: during a capture of any of them it is refused and
 * invalidates the capture, whatever the capture modes and whichever thread
 * captures (the Programming Guide, "Prohibited and Unhandled Operations":
 * synchronizing "a device or context handle when any associated stream is
 * in capture mode" is invalid; the fake refuses it beside any capture, as
 * an H200 did). They used to do it anyway, so the application's capture
 * on another stream was lost to a free_session or a destroy. Now they are
 * refused (MP_EBUSY; MP_ENOMEM for the allocation), said so, the blocks
 * kept, and released by a later call once the capture has ended. The
 * captures are ones the device can see: of a stream made by
 * mp_stream_create (in another thread, in each mode, or in this one) and
 * of a blocking stream (the legacy stream tells of it). */
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"
/* Its loader and this thread's capture only (capcu): the thread of its
 * own captures a stream the program made itself, which the device cannot
 * see (other_t below captures one of the device's). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "capture_beside.h"
#pragma GCC diagnostic pop
#include "fakecuda_test.h"

static void load_driver(void) {
  setenv("FAKECUDA_DEVICE", "capacity=64M", 1); /* read at cuInit */
  capture_load();
}

/* Another thread's capture of stream s (one of the device's) in mode. */
typedef struct {
  CUstream s;
  CUstreamCaptureMode mode;
  atomic_int stage; /* 1: capture begun, 2: the calls beside it are done */
  CUresult begin, end;
  pthread_t thread;
} other_t;

static void *other_capture(void *p) {
  other_t *o = p;
  CUcontext ctx;
  o->begin = capcu.retain(&ctx, 0);
  if (o->begin == CUDA_SUCCESS && (o->begin = capcu.push(ctx)) == CUDA_SUCCESS)
    o->begin = capcu.begin(o->s, o->mode);
  atomic_store(&o->stage, 1);
  while (atomic_load(&o->stage) != 2)
    usleep(1000);
  if (o->begin == CUDA_SUCCESS) {
    CUgraph g = NULL;
    o->end = capcu.end(o->s, &g);
    if (g != NULL)
      (void)capcu.graph_destroy(g);
  }
  (void)capcu.pop(NULL);
  (void)capcu.release(0);
  return NULL;
}

static void other_start(other_t *o, CUstream s, CUstreamCaptureMode mode) {
  o->s = s;
  o->mode = mode;
  o->end = CUDA_ERROR_UNKNOWN;
  atomic_store(&o->stage, 0);
  cr_assert_eq(pthread_create(&o->thread, NULL, other_capture, o), 0);
  while (atomic_load(&o->stage) != 1)
    usleep(1000);
  cr_assert_eq(o->begin, CUDA_SUCCESS, "the capture did not begin (%d)",
               (int)o->begin);
}

/* Ends it; the capture must have stayed valid. */
static void other_finish(other_t *o) {
  atomic_store(&o->stage, 2);
  pthread_join(o->thread, NULL);
  cr_expect_eq(o->end, CUDA_SUCCESS,
               "the capture (mode %d) was invalidated (%d)", (int)o->mode,
               (int)o->end);
}

static mp_stats_t stats_of(mp_direct_t *d) {
  mp_stats_t s;
  cr_assert_eq(mp_direct_get_stats(d, &s), MP_OK, "%s", mp_last_error());
  return s;
}

/* A direct allocator on device 0 (*dev, opened), with a block of bytes
 * (0: over half of what is free, so that a second fits only once the
 * first went back to the device) freed, its session not ended. */
static mp_direct_t *one_deferred(mp_device_t **dev_out, size_t *bytes_out) {
  mp_device_t *dev = *dev_out = open_dev("cuda");
  size_t bytes = *bytes_out;
  if (bytes == 0)
    bytes = *bytes_out = free_bytes(dev) / 10 * 6 & ~(((size_t)1 << 20) - 1);
  mp_direct_t *d = NULL;
  cr_assert_eq(mp_direct_create(dev, &d), MP_OK, "%s", mp_last_error());
  void *p = NULL;
  cr_assert_eq(mp_direct_alloc(d, bytes, NULL, &p), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_direct_free(d, p), MP_OK, "%s", mp_last_error());
  return d;
}

/* free_session while another thread captures a stream of the device in
 * mode: refused and said, the block kept, the capture valid; once it has
 * ended, the session ends. */
static void session_beside(CUstreamCaptureMode mode) {
  mp_device_t *dev;
  size_t bytes = 1 << 20;
  mp_direct_t *d = one_deferred(&dev, &bytes);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  other_t o;
  other_start(&o, (CUstream)s, mode);
  if (!fk_is_real())
    fk_reset_calls();
  mp_status_t st = mp_direct_free_session(d);
  char why[512];
  snprintf(why, sizeof why, "%s", mp_last_error());
  other_finish(&o);
  fk_assert_calls("cuCtxSynchronize", 0); /* none of its calls count */
  fk_assert_calls("cuMemFree_v2", 0);
  cr_expect_eq(st, MP_EBUSY, "mode %d: %s", (int)mode, why);
  cr_expect_neq(strstr(why, "being captured"), NULL, "mode %d: %s", (int)mode,
                why);
  cr_expect_eq(stats_of(d).free_blocks, 1, "the freed block stays deferred");

  cr_assert_eq(mp_direct_free_session(d), MP_OK, "%s", mp_last_error());
  mp_stats_t after = stats_of(d);
  cr_expect_eq(after.free_blocks, 0);
  cr_expect_eq(after.device_free_count, 1);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_direct_destroy(d), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

Test(cuda_direct_beside_capture,
     a_session_beside_a_capture_in_any_mode_waits_for_its_end,
     .init = load_driver) {
  session_beside(CU_STREAM_CAPTURE_MODE_GLOBAL);
  session_beside(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  session_beside(CU_STREAM_CAPTURE_MODE_RELAXED);
}

/* This thread's own capture of a blocking stream it made itself: the
 * device never met the stream, but the legacy stream tells of it. */
Test(cuda_direct_beside_capture,
     a_session_beside_this_threads_capture_of_a_blocking_stream_waits,
     .init = load_driver) {
  mp_device_t *dev;
  size_t bytes = 1 << 20;
  mp_direct_t *d = one_deferred(&dev, &bytes);
  CUstream c = capture_begin_with(0, CU_STREAM_CAPTURE_MODE_GLOBAL);
  mp_status_t st = mp_direct_free_session(d);
  char why[512];
  snprintf(why, sizeof why, "%s", mp_last_error());
  CUresult end = capture_end_here(c);
  cr_expect_eq(end, CUDA_SUCCESS, "the capture was invalidated (%d)", (int)end);
  cr_expect_eq(st, MP_EBUSY, "%s", why);
  cr_expect_neq(strstr(why, "a blocking stream"), NULL, "%s", why);
  cr_expect_eq(stats_of(d).free_blocks, 1, "the freed block stays deferred");
  cr_assert_eq(mp_direct_free_session(d), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats_of(d).free_blocks, 0);
  cr_assert_eq(mp_direct_destroy(d), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

/* destroy while another thread captures: refused, nothing freed, the
 * allocator usable (its live block too); a later destroy frees both. */
Test(cuda_direct_beside_capture, a_destroy_beside_a_capture_waits_for_its_end,
     .init = load_driver) {
  mp_device_t *dev;
  size_t bytes = 1 << 20;
  mp_direct_t *d = one_deferred(&dev, &bytes);
  void *live = NULL;
  cr_assert_eq(mp_direct_alloc(d, 1 << 20, NULL, &live), MP_OK, "%s",
               mp_last_error());
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  other_t o;
  other_start(&o, (CUstream)s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  mp_status_t st = mp_direct_destroy(d);
  char why[512];
  snprintf(why, sizeof why, "%s", mp_last_error());
  other_finish(&o);
  cr_expect_eq(st, MP_EBUSY, "%s", why);
  cr_expect_neq(strstr(why, "being captured"), NULL, "%s", why);
  mp_stats_t kept = stats_of(d);
  cr_expect_eq(kept.free_blocks, 1);
  cr_expect_eq(kept.live_blocks, 1);
  cr_expect_eq(kept.device_free_count, 0);
  cr_assert_eq(mp_direct_record_stream(d, live, NULL), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_direct_destroy(d), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

/* An allocation on the legacy stream that finds the device full while
 * another stream of the device is being captured (by another thread, or
 * by this one): MP_ENOMEM, said, the capture valid; it fits once the
 * capture has ended. */
static void full_beside(bool here) {
  mp_device_t *dev;
  size_t big = 0;
  mp_direct_t *d = one_deferred(&dev, &big);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  other_t o;
  CUcontext ctx;
  if (here) {
    cr_assert_eq(capcu.retain(&ctx, 0), CUDA_SUCCESS);
    cr_assert_eq(capcu.push(ctx), CUDA_SUCCESS);
    cr_assert_eq(capcu.begin((CUstream)s, CU_STREAM_CAPTURE_MODE_GLOBAL),
                 CUDA_SUCCESS);
  } else {
    other_start(&o, (CUstream)s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  }
  void *b = NULL;
  mp_status_t st = mp_direct_alloc(d, big, NULL, &b);
  char why[512];
  snprintf(why, sizeof why, "%s", mp_last_error());
  if (here) {
    CUgraph g = NULL;
    CUresult end = capcu.end((CUstream)s, &g);
    if (g != NULL)
      cr_assert_eq(capcu.graph_destroy(g), CUDA_SUCCESS);
    cr_assert_eq(capcu.pop(NULL), CUDA_SUCCESS);
    cr_assert_eq(capcu.release(0), CUDA_SUCCESS);
    cr_expect_eq(end, CUDA_SUCCESS, "the capture was invalidated (%d)",
                 (int)end);
  } else {
    other_finish(&o);
  }
  cr_expect_eq(st, MP_ENOMEM, "%s capture: %s", here ? "this" : "another", why);
  cr_expect_neq(strstr(why, "being captured"), NULL, "%s", why);
  cr_expect_eq(stats_of(d).free_blocks, 1, "the freed block stays deferred");
  if (st == MP_OK)
    cr_assert_eq(mp_direct_free(d, b), MP_OK);

  cr_assert_eq(mp_direct_alloc(d, big, NULL, &b), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_direct_free(d, b), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_direct_destroy(d), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

Test(cuda_direct_beside_capture, a_full_device_beside_a_capture_keeps_it_valid,
     .init = load_driver) {
  full_beside(false); /* another thread's */
  full_beside(true);  /* this thread's */
}
