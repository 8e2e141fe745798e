/* test_preload_graph_launch_in_host_fn_refused.c - a graph launch made
 * from a host function, of an executable whose outputs a launch claimed
 * (the same executable, or another of its graph, neither freeing its
 * outputs at launch), is refused as the driver refuses any call from a
 * host function (cuda.h, cuLaunchHostFunc: "The host function must not
 * make any CUDA API calls. Attempting to use a CUDA API may result in
 * CUDA_ERROR_NOT_PERMITTED"), at once and claiming nothing: the other
 * launch goes through, its output is the program's to free, and a later
 * launch goes on. Both places a driver runs host functions:
 *  - inside the launch, on the launching thread (the fake driver): the
 *    shim waited for the launch it was in (a hang), then answered
 *    CUDA_ERROR_INVALID_VALUE;
 *  - on a thread of the driver's own (a real driver), while the launch is
 *    in its real call on the program's thread: the shim waited for that
 *    launch to be over, then answered CUDA_ERROR_INVALID_VALUE.
 * And one that finds the outputs unfreed (the program's): refused as a
 * call in a host function, not as a launch with its outputs unfreed.
 *
 * The shim's sources run in this process on the fake driver; the link
 * wraps the shim's table of the driver's calls (mp__pl_real_cuda) so that
 * the real launch runs a "host function" that makes the launch, on its
 * thread or on another, where the driver's cuCtxGetCurrent answers
 * CUDA_ERROR_NOT_PERMITTED (as the fake driver's does in its host
 * functions). */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "graph_output.h"

const mp__real_cuda_t *__real_mp__pl_real_cuda(void);
const mp__real_cuda_t *__wrap_mp__pl_real_cuda(void);

static mp__real_cuda_t wrapped;
static mp__cugraphexec nested_x; /* armed: what the host fn launches */
static mp__custream nested_s;
static bool on_own_thread; /* the host fn runs on the driver's thread */
static pthread_t host_thread;
static mp__curesult nested;          /* its answer, once answered */
static atomic_bool answered;         /* its answer came */
static atomic_bool in_call;          /* the launch is in its real call */
static atomic_bool answered_in_call; /* its answer came in that call */
static _Thread_local bool in_host_fn;

/* The host function: the launch, and when its answer came. */
static void *host_fn(void *arg) {
  (void)arg;
  in_host_fn = true;
  nested = cuGraphLaunch(nested_x, nested_s);
  in_host_fn = false;
  atomic_store(&answered_in_call, atomic_load(&in_call));
  atomic_store(&answered, true);
  return NULL;
}

/* The host function run on this thread or another; there, at most two
 * seconds for its answer: a launch that waits for this call to be over
 * gives none. The other thread is joined once the launch is over
 * (launch_with_nested). */
static mp__curesult launch(mp__cugraphexec x, mp__custream s) {
  if (nested_x != NULL && !in_host_fn) {
    atomic_store(&in_call, true);
    if (!on_own_thread)
      (void)host_fn(NULL);
    else
      cr_assert_eq(pthread_create(&host_thread, NULL, host_fn, NULL), 0);
    for (int ms = 0; ms < 30000 && !atomic_load(&answered); ms++) /* 30 s */
      nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    atomic_store(&in_call, false);
  }
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
 * x's graph, whose output is out, on s): the host function's launch
 * refused at once, nothing left claimed. */
static void launch_with_nested(mp__cugraphexec x, mp__cugraphexec inner,
                               mp__custream s, mp__cuptr out) {
  nested_x = inner;
  nested_s = s;
  atomic_store(&answered, false);
  nested = MP__CU_SUCCESS;
  cr_assert_eq(cuGraphLaunch(x, s), MP__CU_SUCCESS);
  if (on_own_thread)
    cr_assert_eq(pthread_join(host_thread, NULL), 0);
  nested_x = NULL;
  cr_assert(atomic_load(&answered), "the host function's launch was not made");
  cr_expect(atomic_load(&answered_in_call),
            "the host function's launch waited for the other launch");
  cr_expect_eq(nested, MP__CU_NOT_PERMITTED,
               "the launch from the host function answered %u", nested);
  cr_expect_eq(cuMemFree_v2(out), MP__CU_SUCCESS,
               "the other launch's output not freed");
  cr_expect_eq(cuGraphLaunch(inner, s), MP__CU_SUCCESS, "a later launch");
  cr_expect_eq(cuMemFree_v2(out), MP__CU_SUCCESS);
}

static void same_executable(bool own_thread) {
  on_own_thread = own_thread;
  mp__custream s = NULL;
  mp__cuptr out = 0;
  mp__cugraphexec x = mp_exec_with_output(&s, &out, NULL);
  launch_with_nested(x, x, s, out);
  cr_expect_eq(cuGraphExecDestroy(x), 0);
  cr_expect_eq(mp__pl_graph_pools(), 0);
  cr_expect_eq(cuStreamDestroy_v2(s), 0);
  mp_trace_balanced(3); /* the capture's, and the two launches' */
}

static void other_executable(bool own_thread) {
  on_own_thread = own_thread;
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

Test(preload_graph_launch_in_host_fn_refused, same_executable,
     .init = pooling) {
  same_executable(false);
}

Test(preload_graph_launch_in_host_fn_refused, other_executable_of_the_graph,
     .init = pooling) {
  other_executable(false);
}

Test(preload_graph_launch_in_host_fn_refused,
     same_executable_from_the_drivers_thread, .init = pooling) {
  same_executable(true);
}

Test(preload_graph_launch_in_host_fn_refused,
     other_executable_from_the_drivers_thread, .init = pooling) {
  other_executable(true);
}

Test(preload_graph_launch_in_host_fn_refused, outputs_unfreed,
     .init = pooling) {
  mp__custream s = NULL;
  mp__cuptr out = 0;
  mp__cugraphexec x = mp_exec_with_output(&s, &out, NULL);
  cr_assert_eq(cuGraphLaunch(x, s), MP__CU_SUCCESS);
  nested_x = x;
  nested_s = s;
  cr_assert_eq(pthread_create(&host_thread, NULL, host_fn, NULL), 0);
  cr_assert_eq(pthread_join(host_thread, NULL), 0);
  nested_x = NULL;
  cr_expect_eq(nested, MP__CU_NOT_PERMITTED,
               "the launch from the host function answered %u", nested);
  cr_expect_eq(cuGraphLaunch(x, s), MP__CU_INVALID_VALUE,
               "a launch outside it, with the output unfreed");
  cr_expect_eq(cuMemFree_v2(out), MP__CU_SUCCESS);
  cr_expect_eq(cuGraphExecDestroy(x), 0);
  cr_expect_eq(cuStreamDestroy_v2(s), 0);
  mp_trace_balanced(2); /* the capture's, and the launch's */
}
