/* test_preload_graph_launch_cancelled_thread.c - a thread cancelled
 * (pthread_cancel, deferred: the default) during a graph launch leaves the
 * shim's graph bookkeeping usable: its cancellation takes effect once the
 * launch is over, not inside it.
 *
 * A launch of an executable that does not free its outputs at launch,
 * made while another launch of it is in its real call, waits for that one
 * (pthread_cond_wait, a cancellation point: pthreads(7)); cancelled there,
 * the thread ended holding the graphs' lock (the wait takes the mutex
 * again before acting on the cancellation), and every later graph call of
 * the process, the first launch's own bookkeeping included, hung. A thread
 * cancelled inside the real launch (the driver's call reaching a
 * cancellation point) left the launch's outputs claimed and in flight for
 * good: every later launch of the executable waited for ever, and a free
 * of an output was refused.
 *
 * The shim's sources run in this process on the fake driver; the link
 * wraps the shim's table of the driver's calls (mp__pl_real_cuda) so that
 * the real launch makes the cancellation. Each launch runs on a thread
 * joined with a deadline, so that a hang fails the test. */
#include <errno.h>
#include <pthread.h>
#include <time.h>

#include "graph_output.h"

const mp__real_cuda_t *__real_mp__pl_real_cuda(void);
const mp__real_cuda_t *__wrap_mp__pl_real_cuda(void);

static mp__real_cuda_t wrapped;
static mp__cugraphexec exec;
static mp__custream stream;
static void *ctx;
/* What the next real launch does: nothing more, cancel a second launch
 * waiting for it, or cancel its own thread and reach a cancellation
 * point. */
static int mode;
enum { PLAIN, CANCEL_WAITER, CANCEL_SELF };
static pthread_t waiter;

/* A deadline ms milliseconds from now. */
static struct timespec in_secs(unsigned ms) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  t.tv_sec += ms / 1000;
  t.tv_nsec += (long)(ms % 1000) * 1000000L;
  t.tv_sec += t.tv_nsec / 1000000000L;
  t.tv_nsec %= 1000000000L;
  return t;
}

/* A launch of exec on stream on this thread, ctx current; its answer. */
static void *launch_thread(void *arg) {
  (void)arg;
  mp__curesult (*set)(void *) = NULL;
  *(void **)&set = dlsym(RTLD_DEFAULT, "cuCtxSetCurrent");
  mp__curesult r = set != NULL ? set(ctx) : MP__CU_NOT_INITIALIZED;
  if (r == MP__CU_SUCCESS)
    r = cuGraphLaunch(exec, stream);
  return (void *)(uintptr_t)r;
}

static mp__curesult launch(mp__cugraphexec x, mp__custream s) {
  if (mode == CANCEL_WAITER) {
    mode = PLAIN;
    cr_assert_eq(pthread_create(&waiter, NULL, launch_thread, NULL), 0);
    /* Time for the second launch to reach its wait, then its cancellation
     * and a second for it to act (at once without the fix: the thread is
     * gone after it, holding the lock). */
    struct timespec nap = {0, 300 * 1000 * 1000};
    nanosleep(&nap, NULL);
    cr_assert_eq(pthread_cancel(waiter), 0);
    struct timespec until = in_secs(1000);
    void *ret;
    if (pthread_timedjoin_np(waiter, &ret, &until) == 0)
      waiter = 0; /* ended, in its wait */
  } else if (mode == CANCEL_SELF) {
    mode = PLAIN;
    /* The driver's call reaching a cancellation point. */
    (void)pthread_cancel(pthread_self());
    pthread_testcancel();
  }
  return __real_mp__pl_real_cuda()->cuGraphLaunch(x, s);
}

const mp__real_cuda_t *__wrap_mp__pl_real_cuda(void) {
  wrapped = *__real_mp__pl_real_cuda();
  wrapped.cuGraphLaunch = launch;
  return &wrapped;
}

/* A launch on a new thread, joined within 5 s: true with *r its answer
 * (or *cancelled), false when it hung. */
static bool launched(mp__curesult *r, bool *cancelled) {
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, launch_thread, NULL), 0);
  struct timespec until = in_secs(5000);
  void *ret = NULL;
  int e = pthread_timedjoin_np(t, &ret, &until);
  if (e == ETIMEDOUT)
    return false;
  cr_assert_eq(e, 0);
  *cancelled = ret == PTHREAD_CANCELED;
  *r = *cancelled ? MP__CU_SUCCESS : (mp__curesult)(uintptr_t)ret;
  return true;
}

/* An executable with one output, *out, instantiated without flags, and
 * its launch with the real launch doing what m says, which went through
 * (the driver made it: the output the program's). */
static void first_launch(int m, mp__cuptr *out) {
  mp__curesult (*get)(void **) = NULL;
  *(void **)&get = dlsym(RTLD_DEFAULT, "cuCtxGetCurrent");
  cr_assert(get != NULL && get(&ctx) == MP__CU_SUCCESS && ctx != NULL);
  mp__cugraph g = mp_graph_with_output(&stream, out);
  cr_assert_eq(cuGraphInstantiateWithFlags(&exec, g, 0), 0);
  cr_assert_eq(cuGraphDestroy(g), 0);
  mode = m;
  mp__curesult r;
  bool cancelled;
  cr_assert(launched(&r, &cancelled), "the launch hung (mode %d)", m);
  cr_expect_eq(r, MP__CU_SUCCESS);
  if (waiter != 0)
    cr_expect_eq(pthread_join(waiter, NULL), 0);
}

/* After the first launch: its output out freed, a later launch made and
 * its output freed. */
static void later_launch(mp__cuptr out) {
  mp__curesult r;
  bool cancelled;
  cr_expect_eq(cuMemFree_v2(out), MP__CU_SUCCESS,
               "the first launch's output not freed");
  cr_assert(launched(&r, &cancelled),
            "a later launch hung, waiting for the first");
  cr_expect_eq(r, MP__CU_SUCCESS);
  cr_expect_eq(cuMemFree_v2(out), MP__CU_SUCCESS);
  cr_expect_eq(cuGraphExecDestroy(exec), 0);
  cr_expect_eq(cuStreamDestroy_v2(stream), 0);
}

/* A second launch, waiting for the first, is cancelled. */
Test(preload_graph_launch_cancelled_thread, cancelled_in_its_wait,
     .init = mp_in_process_cuda) {
  mp__cuptr out = 0;
  first_launch(CANCEL_WAITER, &out);
  later_launch(out);
}

/* The first launch's thread is cancelled in its real call. */
Test(preload_graph_launch_cancelled_thread, cancelled_in_its_real_launch,
     .init = mp_in_process_cuda) {
  mp__cuptr out = 0;
  first_launch(CANCEL_SELF, &out);
  later_launch(out);
}
