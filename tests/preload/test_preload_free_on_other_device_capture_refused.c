/* test_preload_free_on_other_device_capture_refused.c - a stream-ordered
 * free (cuMemFreeAsync) of a pool block on a capturing stream of another
 * device (or of a context the program made) is refused, the block still
 * the program's: the block's pool cannot order its reuse on that stream
 * (its events are of its own context: cuda.h, cuEventRecord, "hEvent and
 * hStream must be from the same context otherwise
 * CUDA_ERROR_INVALID_HANDLE is returned"), nor wait for it as it does for
 * a stream of another device that does not capture (cuda.h,
 * cuStreamSynchronize on a capturing stream: not allowed, the capture
 * invalidated).
 *
 * Before, device 0's pool was asked to route device 1's stream: it made
 * a graph pool for the capture and began it on that stream, which the
 * fake refused (a stream of another context), and the free was refused
 * as out of memory, "no room" (CUDA_ERROR_OUT_OF_MEMORY); where the begin
 * succeeded, the block went to that graph pool, routed by another
 * context's stream. The shim's sources run in this process on the fake
 * driver with two devices. */
#include "two_devices.h"

#include "mempool/status.h"

#define NOT_SUPPORTED 801u /* cuda.h, CUDA_ERROR_NOT_SUPPORTED */

/* Device 0's block freed on device 1's capturing stream. */
Test(preload_free_on_other_device_capture_refused, refused,
     .init = mp_two_devices) {
  mp__cuptr p = 0, q = 0;
  cr_assert_eq(cuMemAlloc_v2(&p, 4096), 0);
  mp__custream s1 = mp_stream_of_device(1);
  mp_use_device(1);
  cr_assert_eq(cuStreamBeginCapture_v2(s1, 2 /* RELAXED */), 0);
  mp_use_device(0);
  /* Device 1's own graph pool serves the capture's allocation. */
  cr_assert_eq(cuMemAllocAsync(&q, 4096, s1), 0);
  size_t pools = mp__pl_graph_pools();
  mp__curesult r = cuMemFreeAsync(p, s1);
  cr_expect_eq(r, NOT_SUPPORTED,
               "device 0's block freed on device 1's "
               "capture answered %u",
               r);
  cr_expect(strstr(mp_last_error(), "another device") != NULL,
            "the last error says: %s", mp_last_error());
  cr_expect_eq(mp__pl_graph_pools(), pools,
               "device 0's pool made a graph pool for device 1's capture");
  cr_assert_eq(cuMemFreeAsync(q, s1), 0);
  mp_use_device(1);
  mp__cugraph g = NULL;
  cr_expect_eq(cuStreamEndCapture(s1, &g), 0);
  cr_expect_eq(cuGraphDestroy(g), 0);
  mp_use_device(0);
  cr_expect_eq(cuMemFree_v2(p), 0, "the block is no longer the program's");
  mp_stream_destroy_on(1, s1);
}
