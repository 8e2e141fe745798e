/* test_preload_output_free_on_other_device_capture.c - a graph's output
 * (device 0's graph allocation, cuda.h, cuGraphAddMemAllocNode) freed with
 * cuMemFreeAsync on a capturing stream of device 1 is a free inside that
 * capture's graph: cuda.h allows it ("Allocations which are not freed in
 * the same graph can be freed by ... launching a graph with a free node
 * for that allocation"; cuMemFreeAsync during capture "must therefore be
 * passed the address of a graph allocation"; neither names a device).
 * The shim (graphs.c, mp__pl_output_free) makes the block the output's
 * graph's memory for its life ("inner") and asks nothing of device 1's
 * stream but its capture: no pool records on it or routes it, so the
 * contexts need not be compared. A guard, no behaviour change: the free
 * succeeds, the capture stays valid, the fake driver saw no handle of
 * another context used (cuFakeGetErrorCount(CUDA_ERROR_INVALID_HANDLE):
 * a pool's event recorded on device 1's stream would be one), and the
 * output's graph launches again. The shim's sources run in this process
 * on the fake driver with two devices. */
#include "graph_output.h"
#include "two_devices.h"

static long long bad_handles(void) {
  long long (*count)(unsigned) = NULL;
  *(void **)&count = fake("cuFakeGetErrorCount");
  return count(400u /* CUDA_ERROR_INVALID_HANDLE */);
}

Test(preload_output_free_on_other_device_capture, inner_and_valid,
     .init = mp_two_devices) {
  mp__custream s0 = NULL;
  mp__cuptr out = 0;
  mp__cugraph g = NULL;
  mp__cugraphexec x = mp_exec_with_output(&s0, &out, &g);
  cr_assert_eq(cuGraphLaunch(x, s0), 0);
  mp__custream s1 = mp_stream_of_device(1);
  mp_use_device(1);
  cr_assert_eq(cuStreamBeginCapture_v2(s1, 2 /* RELAXED */), 0);
  mp_use_device(0);
  size_t pools = mp__pl_graph_pools();
  long long bad = bad_handles();
  mp__curesult r = cuMemFreeAsync(out, s1);
  cr_expect_eq(r, 0, "the output freed in device 1's capture answered %u (%s)",
               r, mp_last_error());
  cr_expect_eq(bad_handles() - bad, 0,
               "device 1's stream met %lld handles of another context",
               bad_handles() - bad);
  cr_expect_eq(mp__pl_graph_pools(), pools,
               "a graph pool was made for device 1's capture");
  mp_use_device(1);
  mp__cugraph h = NULL;
  mp__curesult e = cuStreamEndCapture(s1, &h);
  cr_expect_eq(e, 0, "device 1's capture ended %u", e);
  if (e == 0)
    cr_expect_eq(cuGraphDestroy(h), 0);
  mp_use_device(0);
  /* The output is its graph's memory now, no longer checked at launches. */
  cr_expect_eq(cuGraphLaunch(x, s0), 0);
  mp__curesult (*sync)(mp__custream) = NULL;
  *(void **)&sync = fake("cuStreamSynchronize");
  cr_expect_eq(sync(s0), 0);
  cr_expect_eq(cuGraphExecDestroy(x), 0);
  cr_expect_eq(cuGraphDestroy(g), 0);
  cr_expect_eq(cuStreamDestroy_v2(s0), 0);
  mp_stream_destroy_on(1, s1);
}
