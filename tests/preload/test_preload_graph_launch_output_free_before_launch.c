/* test_preload_graph_launch_output_free_before_launch.c - a free of a
 * graph launch's output made while the launch is still in its real
 * cuGraphLaunch (another thread's, racing the launch) is refused as a free
 * of an address not yet allocated, CUDA_ERROR_INVALID_VALUE (cuda.h,
 * cuMemFree; a graph's allocation is made by its launch), and changes
 * nothing: once the launch has returned, the output is the program's, its
 * free goes through, and the trace has each allocation before its free.
 *
 * The launch puts its outputs in the shim's table before the real launch
 * (so that a launch whose output cannot be recorded is not made). Before,
 * a free in between found the entry and was accepted: the trace showed a
 * free of an allocation it never had (the launch's was not traced), and
 * the launch's output, allocated by the driver, was no longer the
 * program's (its free after the launch refused). The shim's sources run in
 * this process on the fake driver; the link wraps the shim's table of the
 * driver's calls (mp__pl_real_cuda) so that the launch's real call makes
 * the free first, every time. */
#include "graph_output.h"

const mp__real_cuda_t *__real_mp__pl_real_cuda(void);
const mp__real_cuda_t *__wrap_mp__pl_real_cuda(void);

static mp__real_cuda_t wrapped;
static mp__cuptr free_first; /* armed: the launch's real call frees it */
static mp__curesult early;   /* that free's answer */

static mp__curesult launch(mp__cugraphexec x, mp__custream s) {
  if (free_first != 0) {
    mp__cuptr p = free_first;
    free_first = 0;
    early = cuMemFree_v2(p);
  }
  return __real_mp__pl_real_cuda()->cuGraphLaunch(x, s);
}

const mp__real_cuda_t *__wrap_mp__pl_real_cuda(void) {
  wrapped = *__real_mp__pl_real_cuda();
  wrapped.cuGraphLaunch = launch;
  return &wrapped;
}

static void pooling(void) {
  unsetenv("MEMPOOL_TRACE");
  mp_in_process_cuda();
}

Test(preload_graph_launch_output_free_before_launch, refused_as_not_allocated,
     .init = pooling) {
  mp__custream s = NULL;
  mp__cuptr out = 0;
  mp__cugraph g = mp_graph_with_output(&s, &out);
  mp__cugraphexec x = NULL;
  cr_assert_eq(cuGraphInstantiateWithFlags(&x, g, 0), 0);
  cr_assert_eq(cuGraphDestroy(g), 0);
  free_first = out;
  cr_assert_eq(cuGraphLaunch(x, s), MP__CU_SUCCESS);
  cr_assert_eq(free_first, 0, "the launch's real call was not made");
  cr_expect_eq(early, MP__CU_INVALID_VALUE,
               "the free before the launch was made answered %u", early);
  cr_expect_eq(cuMemFree_v2(out), MP__CU_SUCCESS,
               "the launch's output is not the program's (its free refused)");
  /* Freed once: the executable launches again, and its output is freed. */
  cr_expect_eq(cuGraphLaunch(x, s), MP__CU_SUCCESS);
  cr_expect_eq(cuMemFree_v2(out), MP__CU_SUCCESS);
  cr_expect_eq(cuGraphExecDestroy(x), 0);
  cr_expect_eq(cuStreamDestroy_v2(s), 0);
  /* The capture's allocation (freed at its end) and two launches': as
   * many frees as allocations, nothing live. */
  mp_trace_balanced(3);
}
