/* test_preload_graph_launch_refused_keeps_other_launch.c - a launch of an
 * executable that the driver refuses ends only what that launch put in the
 * shim's table, never the outputs another launch of the same executable,
 * still in its real cuGraphLaunch, put there.
 *
 * An executable instantiated with CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_
 * LAUNCH may be launched while its outputs are allocated (cuda.h,
 * cuGraphLaunch), so a second launch of it is let through while the first
 * is inside the driver. Before, the second launch's refusal took out of
 * the table every output marked as put by a launch in progress, the first
 * launch's included: that launch went through, yet its output was unknown
 * to the table, and the program's free of it was refused
 * (CUDA_ERROR_INVALID_VALUE). The shim's sources run in this process on
 * the fake driver; the link wraps the shim's table of the driver's calls
 * (mp__pl_real_cuda) so that the first launch's real call makes the second
 * launch, which the driver refuses, every time. */
#include "graph_output.h"

const mp__real_cuda_t *__real_mp__pl_real_cuda(void);
const mp__real_cuda_t *__wrap_mp__pl_real_cuda(void);

static mp__real_cuda_t wrapped;
static bool nest;           /* armed: the next launch makes a second one */
static bool inner;          /* in the second launch's real call */
static mp__curesult second; /* the second launch's answer */

static mp__curesult launch(mp__cugraphexec x, mp__custream s) {
  if (inner) /* the driver refuses the second launch */
    return MP__CU_INVALID_VALUE;
  if (nest) {
    nest = false;
    inner = true;
    second = cuGraphLaunch(x, s);
    inner = false;
  }
  return __real_mp__pl_real_cuda()->cuGraphLaunch(x, s);
}

const mp__real_cuda_t *__wrap_mp__pl_real_cuda(void) {
  wrapped = *__real_mp__pl_real_cuda();
  wrapped.cuGraphLaunch = launch;
  return &wrapped;
}

Test(preload_graph_launch_refused_keeps_other_launch, output_stays_allocated,
     .init = mp_in_process_cuda) {
  mp__custream s = NULL;
  mp__cuptr out = 0;
  mp__cugraph g = mp_graph_with_output(&s, &out);
  mp__cugraphexec x = NULL;
  cr_assert_eq(
      cuGraphInstantiateWithFlags(
          &x, g, 1 /* CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH */),
      0);
  cr_assert_eq(cuGraphDestroy(g), 0);
  nest = true;
  cr_assert_eq(cuGraphLaunch(x, s), MP__CU_SUCCESS);
  cr_assert_eq(second, MP__CU_INVALID_VALUE, "the second launch was not made");
  cr_expect_eq(cuMemFree_v2(out), MP__CU_SUCCESS,
               "the output of the launch that went through is not the "
               "program's (its free refused)");
  cr_expect_eq(cuGraphLaunch(x, s), MP__CU_SUCCESS);
  cr_expect_eq(cuMemFree_v2(out), MP__CU_SUCCESS);
  cr_expect_eq(cuGraphExecDestroy(x), 0);
  cr_expect_eq(cuStreamDestroy_v2(s), 0);
}
