/* test_preload_capture_begun_without_id.c - a capture whose begin got no
 * id from the driver (cuStreamGetCaptureInfo refused right after the real
 * begin: cuda.h, \notefnerr, a launch's error reported then) gets no graph
 * pool: its stream-ordered allocations are the driver's, and nothing of
 * the shim's is left once it ends.
 *
 * Before, a stream forked from the origin allocated from a graph pool
 * made for the capture's id; where the end's question failed too, the end
 * could not find that graph pool (no id either way, and the origin routed
 * nothing), which stayed, the forked stream routed to it for good. The
 * shim's sources run in this process on the fake driver (cuFakeRefuse
 * makes the questions fail, 700, the sticky error's code). */
#include "capture_fork.h"

#define ILLEGAL_ADDRESS 700 /* cuda.h, CUDA_ERROR_ILLEGAL_ADDRESS */

/* cuStreamGetCaptureInfo_v2's next call fails. */
static void next_capture_info_fails(void) {
  bool (*refuse)(const char *, int, long) = NULL;
  *(void **)&refuse = fake("cuFakeRefuse");
  cr_assert(refuse("cuStreamGetCaptureInfo_v2", ILLEGAL_ADDRESS, 1));
}

static void pooling(void) {
  unsetenv("MEMPOOL_TRACE");
  mp_in_process_cuda();
}

Test(preload_capture_begun_without_id, leaves_no_graph_pool, .init = pooling) {
  mp__custream s = NULL, t = NULL;
  cr_assert_eq(cuStreamCreate(&s, 1 /* CU_STREAM_NON_BLOCKING */), 0);
  cr_assert_eq(cuStreamCreate(&t, 1 /* CU_STREAM_NON_BLOCKING */), 0);
  next_capture_info_fails();
  cr_assert_eq(cuStreamBeginCapture_v2(s, 2 /* RELAXED */), 0);
  wait_for(t, s); /* forked: t captures too */
  mp__cuptr p = 0;
  cr_assert_eq(cuMemAllocAsync(&p, 4096, t), 0);
  cr_assert_eq(cuMemFreeAsync(p, t), 0);
  wait_for(s, t); /* joined */
  next_capture_info_fails();
  mp__cugraph g = NULL;
  cr_assert_eq(cuStreamEndCapture(s, &g), 0);
  cr_expect_eq(cuGraphDestroy(g), 0);
  cr_expect_eq(mp__pl_graph_pools(), 0,
               "a graph pool of the capture is left after its end");
  /* t, no longer captured, allocates from the device's pool again. */
  mp__cuptr q = 0;
  cr_expect_eq(cuMemAllocAsync(&q, 4096, t), 0);
  cr_expect_eq(cuMemFreeAsync(q, t), 0);
  cr_expect_eq(mp__pl_graph_pools(), 0);
  cr_expect_eq(cuStreamDestroy_v2(t), 0);
  cr_expect_eq(cuStreamDestroy_v2(s), 0);
}
