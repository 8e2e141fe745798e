/* test_preload_sync_free_in_relaxed_capture.c - a synchronous free
 * (cuMemFree) of a pool block while a relaxed-mode capture is in progress,
 * which the capture's mode allows (cuda.h,
 * cuThreadExchangeStreamCaptureMode), goes to the pool after the work of
 * every stream it knows (mp_pool_free_after_all), the capturing ones
 * included: the pool records no event on, waits for and queries the work
 * of no capturing stream (cuda.h, cuStreamSynchronize and cuStreamQuery
 * are not allowed during stream capture; cuEventRecord on a capturing
 * stream would become a node of the graph), so the capture stays valid.
 * Checked for a capture the pool routes (an allocation on the capturing
 * stream), for a stream that joined the capture through an event the
 * pool has met before the capture, and for a blocking stream's capture
 * (the legacy stream then unusable: cuda.h, cuStreamIsCapturing). No
 * behaviour change: the pool already left those streams alone. The
 * shim's sources run in this process on the fake driver. */
#include "capture_fork.h"

#include "mempool/status.h"

static void pooling(void) {
  unsetenv("MEMPOOL_TRACE");
  mp_in_process_cuda();
}

/* The fake's count of the calls a capture refused or that conflicted
 * with one (cuFakeGetErrorCount). */
static long long capture_refusals(void) {
  long long (*count)(unsigned) = NULL;
  *(void **)&count = fake("cuFakeGetErrorCount");
  return count(900 /* CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED */);
}

/* p freed (cuMemFree) while origin (flags: its creation flags) captures
 * in relaxed mode, with joined forked into the capture; both streams
 * known to the pool before the capture. The capture ends valid and
 * nothing it met was refused. */
static void free_in_capture(unsigned flags) {
  mp__custream origin = NULL, joined = NULL;
  mp__cuptr p = 0, a = 0, b = 0, t = 0;
  cr_assert_eq(cuMemAlloc_v2(&p, 4096), 0);
  cr_assert_eq(cuStreamCreate(&origin, flags), 0);
  cr_assert_eq(cuStreamCreate(&joined, 1 /* CU_STREAM_NON_BLOCKING */), 0);
  /* Met before the capture, with work still open on each. */
  cr_assert_eq(cuMemAllocAsync(&a, 4096, origin), 0);
  cr_assert_eq(cuMemAllocAsync(&b, 4096, joined), 0);
  cr_assert_eq(cuMemFreeAsync(a, origin), 0);
  cr_assert_eq(cuMemFreeAsync(b, joined), 0);
  long long refused = capture_refusals();
  cr_assert_eq(cuStreamBeginCapture_v2(origin, 2 /* RELAXED */), 0);
  wait_for(joined, origin); /* forked: joined captures too */
  cr_assert_eq(cuMemAllocAsync(&t, 4096, origin), 0); /* routed */
  cr_expect_eq(cuMemFree_v2(p), 0, "the free in a relaxed capture: %s",
               mp_last_error());
  cr_assert_eq(cuMemFreeAsync(t, origin), 0);
  wait_for(origin, joined); /* joined */
  mp__cugraph g = NULL;
  mp__curesult e = cuStreamEndCapture(origin, &g);
  cr_expect_eq(e, 0, "the capture ended %u", e);
  cr_expect_eq(capture_refusals(), refused,
               "a call during the capture was refused or invalidated it");
  if (e == 0)
    cr_expect_eq(cuGraphDestroy(g), 0);
  cr_expect_eq(cuStreamDestroy_v2(joined), 0);
  cr_expect_eq(cuStreamDestroy_v2(origin), 0);
}

Test(preload_sync_free_in_relaxed_capture, non_blocking_stream,
     .init = pooling) {
  free_in_capture(1 /* CU_STREAM_NON_BLOCKING */);
}

Test(preload_sync_free_in_relaxed_capture, blocking_stream, .init = pooling) {
  free_in_capture(0 /* CU_STREAM_DEFAULT */);
}
