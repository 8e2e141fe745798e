/* test_preload_graph_launch_in_host_fn_refused.c - a graph launch made
 * from a host function that the driver runs inside a launch on the same
 * thread, of an executable whose outputs that launch claimed (the same
 * executable, or another of its graph, neither freeing its outputs at
 * launch), is refused as the driver refuses any call from a host function
 * (cuda.h, cuLaunchHostFunc: "The host function must not make any CUDA
 * API calls. Attempting to use a CUDA API may result in
 * CUDA_ERROR_NOT_PERMITTED"), without waiting for the launch it is in
 * (which would wait for it: a hang) and without claiming anything: the
 * outer launch goes through, its output is the program's to free, and a
 * later launch goes on.
 *
 * Before, the shim answered CUDA_ERROR_INVALID_VALUE there, as for a
 * launch with its outputs unfreed, where the driver answers every call
 * with CUDA_ERROR_NOT_PERMITTED. The shim's sources run in this process on
 * the fake driver; the link wraps the shim's table of the driver's calls
 * (mp__pl_real_cuda) so that the real launch runs a "host function" that
 * makes the nested launch, during which the driver's cuCtxGetCurrent
 * answers CUDA_ERROR_NOT_PERMITTED (as the fake driver's does in its host
 * functions). */
#include "graph_output.h"

const mp__real_cuda_t *__real_mp__pl_real_cuda(void);
const mp__real_cuda_t *__wrap_mp__pl_real_cuda(void);

static mp__real_cuda_t wrapped;
static mp__cugraphexec nested_x; /* armed: the launch the host fn makes */
static mp__curesult nested;      /* its answer */
static bool in_host_fn;

static mp__curesult launch(mp__cugraphexec x, mp__custream s) {
  /* The host function, run here on this thread. */
  mp__cugraphexec n = nested_x;
  nested_x = NULL;
  in_host_fn = n != NULL;
  if (n != NULL)
    nested = cuGraphLaunch(n, s);
  in_host_fn = false;
  return __real_mp__pl_real_cuda()->cuGraphLaunch(x, s);
}

/* The driver's cuCtxGetCurrent, refused in the host function. */
static mp__curesult ctx_get(mp__cuctx *c) {
  if (in_host_fn)
    return MP__CU_NOT_PERMITTED;
  return __real_mp__pl_real_cuda()->cuCtxGetCurrent(c);
}

const mp__real_cuda_t *__wrap_mp__pl_real_cuda(void) {
  wrapped = *__real_mp__pl_real_cuda();
  wrapped.cuGraphLaunch = launch;
  wrapped.cuCtxGetCurrent = ctx_get;
  return &wrapped;
}

static void pooling(void) {
  unsetenv("MEMPOOL_TRACE"); /* the report's counts only */
  mp_in_process_cuda();
}

/* A launch of x whose host function launches `inner` (an executable of
 * x's graph g, whose output is out, on s): the nested launch refused,
 * nothing left claimed. */
static void launch_with_nested(mp__cugraphexec x, mp__cugraphexec inner,
                               mp__custream s, mp__cuptr out) {
  nested_x = inner;
  nested = MP__CU_SUCCESS;
  cr_assert_eq(cuGraphLaunch(x, s), MP__CU_SUCCESS);
  cr_assert_null(nested_x, "the launch's real call was not made");
  cr_expect_eq(nested, MP__CU_NOT_PERMITTED,
               "the launch from the host function answered %u", nested);
  cr_expect_eq(cuMemFree_v2(out), MP__CU_SUCCESS,
               "the outer launch's output not freed");
  cr_expect_eq(cuGraphLaunch(inner, s), MP__CU_SUCCESS, "a later launch");
  cr_expect_eq(cuMemFree_v2(out), MP__CU_SUCCESS);
}

Test(preload_graph_launch_in_host_fn_refused, same_executable,
     .init = pooling) {
  mp__custream s = NULL;
  mp__cuptr out = 0;
  mp__cugraphexec x = mp_exec_with_output(&s, &out, NULL);
  launch_with_nested(x, x, s, out);
  cr_expect_eq(cuGraphExecDestroy(x), 0);
  cr_expect_eq(mp__pl_graph_pools(), 0);
  cr_expect_eq(cuStreamDestroy_v2(s), 0);
  mp_trace_balanced(3); /* the capture's, and the two launches' */
}

Test(preload_graph_launch_in_host_fn_refused, other_executable_of_the_graph,
     .init = pooling) {
  mp__custream s = NULL;
  mp__cuptr out = 0;
  mp__cugraph g = NULL;
  mp__cugraphexec x = mp_exec_with_output(&s, &out, &g), y = NULL;
  cr_assert_eq(cuGraphInstantiateWithFlags(&y, g, 0), 0);
  launch_with_nested(x, y, s, out);
  cr_expect_eq(cuGraphExecDestroy(x), 0);
  cr_expect_eq(cuGraphExecDestroy(y), 0);
  cr_expect_eq(cuGraphDestroy(g), 0);
  cr_expect_eq(mp__pl_graph_pools(), 0);
  cr_expect_eq(cuStreamDestroy_v2(s), 0);
  mp_trace_balanced(3);
}
