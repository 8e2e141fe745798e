/* test_preload_free_on_unrouted_capture_refused.c - a stream-ordered free
 * (cuMemFreeAsync) of a pool block on a stream being captured, which the
 * capture's graph pool cannot take, is refused and frees nothing: the
 * block stays the program's, freed by it later. cuda.h, cuMemFreeAsync:
 * "During stream capture, this function results in the creation of a free
 * node and must therefore be passed the address of a graph allocation",
 * which a pool block is not; and the pool cannot order the block's reuse
 * on a stream whose work runs only when the graph is launched.
 *
 * Before, the block went to the pool on the capturing stream: handed out
 * again to another stream while a launch of the graph could still use
 * it. The shim's sources run in this process on the fake driver; the
 * capture's graph pool is made unable to take the block by filling the
 * capture's list of streams (8 routed), by filling every capture slot
 * (64 captures with a graph pool each), and by an invalidated capture (a
 * prohibited cuCtxSynchronize in global mode, fake: fk_unsafe). */
#include "capture_fork.h"

#include "mempool/status.h"

#define OUT_OF_MEMORY       2u  /* cuda.h, CUDA_ERROR_OUT_OF_MEMORY */
#define CAPTURE_INVALIDATED 901 /* CUDA_ERROR_STREAM_CAPTURE_INVALIDATED */
#define NSTREAMS            9   /* one more than a capture routes */
#define NCAPTURES           64  /* capture slots (graphs.c) */

static void pooling(void) {
  unsetenv("MEMPOOL_TRACE");
  mp_in_process_cuda();
}

/* p, a pool block, freed on s: refused with code, and the block still the
 * program's once the capture is over (checked by the caller). */
static void refused(mp__cuptr p, mp__custream s, unsigned code) {
  cr_expect_eq(cuMemFreeAsync(p, s), code,
               "a pool block freed on a capturing stream the graph pool "
               "cannot take was not refused");
  cr_expect(strstr(mp_last_error(), "program's") != NULL,
            "the last error says: %s", mp_last_error());
}

/* The capture's list of streams full: the ninth stream's free. */
Test(preload_free_on_unrouted_capture_refused, streams_full, .init = pooling) {
  mp__custream s[NSTREAMS];
  mp__cuptr p = 0, out[NSTREAMS - 1];
  cr_assert_eq(cuMemAlloc_v2(&p, 4096), 0);
  for (int i = 0; i < NSTREAMS; i++)
    cr_assert_eq(cuStreamCreate(&s[i], 1 /* CU_STREAM_NON_BLOCKING */), 0);
  cr_assert_eq(cuStreamBeginCapture_v2(s[0], 2 /* RELAXED */), 0);
  for (int i = 1; i < NSTREAMS; i++)
    wait_for(s[i], s[0]);                /* forked: each captures too */
  for (int i = 0; i < NSTREAMS - 1; i++) /* routed: the list full */
    cr_assert_eq(cuMemAllocAsync(&out[i], 4096, s[i]), 0);
  refused(p, s[NSTREAMS - 1], OUT_OF_MEMORY);
  for (int i = 0; i < NSTREAMS - 1; i++)
    cr_assert_eq(cuMemFreeAsync(out[i], s[i]), 0);
  for (int i = 1; i < NSTREAMS; i++)
    wait_for(s[0], s[i]); /* joined */
  mp__cugraph g = NULL;
  cr_assert_eq(cuStreamEndCapture(s[0], &g), 0);
  cr_expect_eq(cuGraphDestroy(g), 0);
  cr_expect_eq(cuMemFree_v2(p), 0, "the block is no longer the program's");
  for (int i = 0; i < NSTREAMS; i++)
    cr_expect_eq(cuStreamDestroy_v2(s[i]), 0);
}

/* Every capture slot in use: a capture begun after 64 others that each
 * got a graph pool gets none, and its stream's free is refused. */
Test(preload_free_on_unrouted_capture_refused, slots_full, .init = pooling) {
  static mp__custream s[NCAPTURES + 1];
  static mp__cuptr out[NCAPTURES];
  mp__cuptr p = 0;
  cr_assert_eq(cuMemAlloc_v2(&p, 4096), 0);
  for (int i = 0; i <= NCAPTURES; i++) {
    cr_assert_eq(cuStreamCreate(&s[i], 1 /* CU_STREAM_NON_BLOCKING */), 0);
    cr_assert_eq(cuStreamBeginCapture_v2(s[i], 2 /* RELAXED */), 0);
  }
  for (int i = 0; i < NCAPTURES; i++)
    cr_assert_eq(cuMemAllocAsync(&out[i], 4096, s[i]), 0);
  cr_assert_eq(mp__pl_graph_pools(), NCAPTURES);
  refused(p, s[NCAPTURES], OUT_OF_MEMORY);
  for (int i = 0; i <= NCAPTURES; i++) {
    if (i < NCAPTURES)
      cr_assert_eq(cuMemFreeAsync(out[i], s[i]), 0);
    mp__cugraph g = NULL;
    cr_assert_eq(cuStreamEndCapture(s[i], &g), 0);
    cr_expect_eq(cuGraphDestroy(g), 0);
    cr_expect_eq(cuStreamDestroy_v2(s[i]), 0);
  }
  cr_expect_eq(cuMemFree_v2(p), 0, "the block is no longer the program's");
}

/* A capture invalidated (a prohibited call in global mode): the free is
 * refused as the driver refuses work there. */
Test(preload_free_on_unrouted_capture_refused, invalidated, .init = pooling) {
  mp__curesult (*ctx_sync)(void) = NULL;
  *(void **)&ctx_sync = fake("cuCtxSynchronize");
  mp__custream s = NULL;
  mp__cuptr p = 0;
  cr_assert_eq(cuMemAlloc_v2(&p, 4096), 0);
  cr_assert_eq(cuStreamCreate(&s, 1 /* CU_STREAM_NON_BLOCKING */), 0);
  cr_assert_eq(cuStreamBeginCapture_v2(s, 0 /* GLOBAL */), 0);
  cr_assert_neq(ctx_sync(), 0, "the capture was not invalidated");
  refused(p, s, CAPTURE_INVALIDATED);
  cr_expect_eq(mp_last_driver_error(), CAPTURE_INVALIDATED);
  mp__cugraph g = NULL;
  cr_expect_eq(cuStreamEndCapture(s, &g), CAPTURE_INVALIDATED);
  cr_expect_eq(cuMemFree_v2(p), 0, "the block is no longer the program's");
  cr_expect_eq(cuStreamDestroy_v2(s), 0);
}
