/* test_preload_graph_launch_waits_for_launch_in_flight.c - a launch of an
 * executable that does not free its outputs at launch (no
 * CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH), made by another thread
 * while a launch of it is in its real cuGraphLaunch, is answered as the
 * driver answers a launch made after that one (cuda.h, cuGraphLaunch: each
 * launch "ordered behind ... any previous launches of hGraphExec"; one
 * with allocations unfreed fails with CUDA_ERROR_INVALID_VALUE): when the
 * driver refuses the first, nothing was allocated and the second goes
 * through; when the first goes through, the second is refused.
 *
 * Before, the second was refused at once whatever became of the first:
 * with the first refused too, neither launch went through, which no order
 * of the two gives. The shim's sources run in this process on the fake
 * driver; the link wraps the shim's table of the driver's calls
 * (mp__pl_real_cuda) so that the first launch's real call starts the
 * second on another thread and gives it time to be answered (it is, at
 * once, without the fix) before the driver answers the first. */
#include <pthread.h>
#include <time.h>

#include "graph_output.h"

const mp__real_cuda_t *__real_mp__pl_real_cuda(void);
const mp__real_cuda_t *__wrap_mp__pl_real_cuda(void);

static mp__real_cuda_t wrapped;
static mp__cugraphexec exec;
static mp__custream stream;
static bool armed;        /* the next real launch starts the second */
static bool refuse_first; /* the driver refuses the first */
static pthread_t second_thread;
static mp__curesult second; /* the second launch's answer */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t answered = PTHREAD_COND_INITIALIZER;
static bool second_done;

/* The second launch, on another thread, with the first's context (arg)
 * current. */
static void *second_launch(void *arg) {
  mp__curesult (*set)(void *) = NULL;
  *(void **)&set = dlsym(RTLD_DEFAULT, "cuCtxSetCurrent");
  mp__curesult r = set != NULL ? set(arg) : MP__CU_NOT_INITIALIZED;
  if (r == MP__CU_SUCCESS)
    r = cuGraphLaunch(exec, stream);
  pthread_mutex_lock(&lock);
  second = r;
  second_done = true;
  pthread_cond_signal(&answered);
  pthread_mutex_unlock(&lock);
  return NULL;
}

static mp__curesult launch(mp__cugraphexec x, mp__custream s) {
  if (!armed)
    return __real_mp__pl_real_cuda()->cuGraphLaunch(x, s);
  armed = false;
  mp__curesult (*get)(void **) = NULL;
  *(void **)&get = dlsym(RTLD_DEFAULT, "cuCtxGetCurrent");
  void *ctx = NULL;
  cr_assert(get != NULL && get(&ctx) == MP__CU_SUCCESS && ctx != NULL);
  cr_assert_eq(pthread_create(&second_thread, NULL, second_launch, ctx), 0);
  /* Time for the second launch to be answered while this one is in its
   * real call: 300 ms, or until it is. */
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_nsec += 300 * 1000 * 1000;
  until.tv_sec += until.tv_nsec / 1000000000;
  until.tv_nsec %= 1000000000;
  pthread_mutex_lock(&lock);
  while (!second_done && pthread_cond_timedwait(&answered, &lock, &until) == 0)
    ;
  pthread_mutex_unlock(&lock);
  return refuse_first ? MP__CU_INVALID_VALUE
                      : __real_mp__pl_real_cuda()->cuGraphLaunch(x, s);
}

const mp__real_cuda_t *__wrap_mp__pl_real_cuda(void) {
  wrapped = *__real_mp__pl_real_cuda();
  wrapped.cuGraphLaunch = launch;
  return &wrapped;
}

/* Two launches of an executable with one output, *out, the second made
 * while the first is in its real call; the first's answer. */
static mp__curesult two_launches(mp__cuptr *out) {
  mp__cugraph g = mp_graph_with_output(&stream, out);
  cr_assert_eq(cuGraphInstantiateWithFlags(&exec, g, 0), 0);
  cr_assert_eq(cuGraphDestroy(g), 0);
  armed = true;
  mp__curesult first = cuGraphLaunch(exec, stream);
  cr_assert_eq(pthread_join(second_thread, NULL), 0);
  return first;
}

static void done(void) {
  cr_expect_eq(cuGraphExecDestroy(exec), 0);
  cr_expect_eq(cuStreamDestroy_v2(stream), 0);
}

Test(preload_graph_launch_waits_for_launch_in_flight,
     first_refused_second_goes_through, .init = mp_in_process_cuda) {
  refuse_first = true;
  mp__cuptr out = 0;
  cr_assert_eq(two_launches(&out), MP__CU_INVALID_VALUE);
  cr_expect_eq(second, MP__CU_SUCCESS,
               "the second launch answered %u, the first refused", second);
  cr_expect_eq(cuMemFree_v2(out), second == MP__CU_SUCCESS
                                      ? MP__CU_SUCCESS
                                      : MP__CU_INVALID_VALUE);
  done();
}

Test(preload_graph_launch_waits_for_launch_in_flight, first_made_second_refused,
     .init = mp_in_process_cuda) {
  refuse_first = false;
  mp__cuptr out = 0;
  cr_assert_eq(two_launches(&out), MP__CU_SUCCESS);
  cr_expect_eq(second, MP__CU_INVALID_VALUE,
               "the second launch answered %u, the first's output unfreed",
               second);
  cr_expect_eq(cuMemFree_v2(out), MP__CU_SUCCESS);
  done();
}
