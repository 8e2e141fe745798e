/* test_preload_graph_exec_destroyed_during_launch.c - an executable
 * destroyed (cuGraphExecDestroy) by another thread while one of its
 * launches is in its real cuGraphLaunch leaves that launch's outputs as
 * the launch left them: gone through, they are the program's to free
 * (cuda.h, cuGraphExecDestroy: "If the executable graph is in-flight, it
 * will not be terminated, but rather freed asynchronously on
 * completion"), and a launch of another executable of the same graph
 * goes on.
 *
 * Before, the launch's end found its outputs through its executable's
 * entries, which the destroy had taken out: the outputs stayed claimed
 * for good, their free refused (CUDA_ERROR_INVALID_VALUE) and every later
 * launch of an executable of the graph waiting for ever; with the graph
 * destroyed before, the destroy released the graph's slot under the
 * launch. The shim's sources run in this process on the fake driver; the
 * link wraps the shim's table of the driver's calls (mp__pl_real_cuda) so
 * that the real launch, once the driver made it, has another thread
 * destroy the executable. Launches of another executable run on
 * a thread joined with a deadline, so that a hang fails the test. */
#include <errno.h>
#include <pthread.h>
#include <time.h>

#include "graph_output.h"

const mp__real_cuda_t *__real_mp__pl_real_cuda(void);
const mp__real_cuda_t *__wrap_mp__pl_real_cuda(void);

static mp__real_cuda_t wrapped;
static void *ctx;
/* Armed: the next real launch, once made, has another thread destroy
 * its executable. */
static bool destroy;
static mp__curesult other;       /* that thread's answer */
static mp__cugraphexec launched; /* a launch on launch_thread: what */
static mp__custream on;          /* and where */

/* The destroy of exec (arg) on this thread, ctx current. */
static void *change_thread(void *arg) {
  mp__curesult r = mp_in_process_set_current(ctx);
  if (r == MP__CU_SUCCESS)
    r = cuGraphExecDestroy(arg);
  other = r;
  return NULL;
}

static mp__curesult launch(mp__cugraphexec x, mp__custream s) {
  mp__curesult r = __real_mp__pl_real_cuda()->cuGraphLaunch(x, s);
  if (destroy && r == MP__CU_SUCCESS) {
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, change_thread, x), 0);
    cr_assert_eq(pthread_join(t, NULL), 0);
    destroy = false;
  }
  return r;
}

const mp__real_cuda_t *__wrap_mp__pl_real_cuda(void) {
  wrapped = *__real_mp__pl_real_cuda();
  wrapped.cuGraphLaunch = launch;
  return &wrapped;
}

/* A launch of `launched` on `on`, on this thread, ctx current. */
static void *launch_thread(void *arg) {
  (void)arg;
  mp__curesult r = mp_in_process_set_current(ctx);
  if (r == MP__CU_SUCCESS)
    r = cuGraphLaunch(launched, on);
  return (void *)(uintptr_t)r;
}

/* A launch of x on s on a new thread, joined within 5 s: its answer;
 * fails the test when it hung. */
static mp__curesult launch_within(mp__cugraphexec x, mp__custream s) {
  launched = x;
  on = s;
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, launch_thread, NULL), 0);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 5;
  void *ret = NULL;
  int e = pthread_timedjoin_np(t, &ret, &until);
  cr_assert_neq(e, ETIMEDOUT, "the launch hung");
  cr_assert_eq(e, 0);
  return (mp__curesult)(uintptr_t)ret;
}

static void traced(void) {
  unsetenv("MEMPOOL_TRACE"); /* the report's counts only */
  mp_in_process_cuda();
  ctx = mp_in_process_current();
}

/* The executable destroyed in its launch, its graph kept: the output is
 * the program's, and another executable of the graph launches. */
Test(preload_graph_exec_destroyed_during_launch, graph_kept, .init = traced) {
  mp__custream s = NULL;
  mp__cuptr out = 0;
  mp__cugraph g = NULL;
  mp__cugraphexec x = mp_exec_with_output(&s, &out, &g), y = NULL;
  destroy = true;
  cr_assert_eq(cuGraphLaunch(x, s), MP__CU_SUCCESS);
  cr_assert_eq(other, MP__CU_SUCCESS, "the destroy answered %u", other);
  cr_expect_eq(cuMemFree_v2(out), MP__CU_SUCCESS,
               "the output of the launch in flight was not freed");
  cr_assert_eq(cuGraphInstantiateWithFlags(&y, g, 0), 0);
  cr_expect_eq(launch_within(y, s), MP__CU_SUCCESS);
  cr_expect_eq(cuMemFree_v2(out), MP__CU_SUCCESS);
  cr_expect_eq(cuGraphExecDestroy(y), 0);
  cr_expect_eq(cuGraphDestroy(g), 0);
  cr_expect_eq(mp__pl_graph_pools(), 0);
  cr_expect_eq(cuStreamDestroy_v2(s), 0);
  mp_trace_balanced(3); /* the capture's, and the two launches' */
}

/* The executable, the last to hold its graph's memory (the graph
 * destroyed), destroyed in its launch: the output is the program's. */
Test(preload_graph_exec_destroyed_during_launch, last_holder, .init = traced) {
  mp__custream s = NULL;
  mp__cuptr out = 0;
  mp__cugraphexec x = mp_exec_with_output(&s, &out, NULL);
  destroy = true;
  cr_assert_eq(cuGraphLaunch(x, s), MP__CU_SUCCESS);
  cr_assert_eq(other, MP__CU_SUCCESS, "the destroy answered %u", other);
  cr_expect_eq(cuMemFree_v2(out), MP__CU_SUCCESS,
               "the output of the launch in flight was not freed");
  cr_expect_eq(mp__pl_graph_pools(), 0);
  cr_expect_eq(cuStreamDestroy_v2(s), 0);
  mp_trace_balanced(2); /* the capture's and the launch's */
}
