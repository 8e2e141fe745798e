/* capture_fork.h - for the tests of the shim's sources in the test's
 * process (in_process.h): the fake driver's own entry points, and a
 * capture's fork and join of streams (an event recorded and waited for). */
#ifndef MP_TESTS_PRELOAD_CAPTURE_FORK_H
#define MP_TESTS_PRELOAD_CAPTURE_FORK_H

#include "in_process.h"

/* The fake driver's entry point name, which the shim does not hook. */
static inline void *fake(const char *name) {
  void *f = dlsym(RTLD_DEFAULT, name);
  cr_assert_not_null(f, "the fake driver has no %s", name);
  return f;
}

/* to waits for the work of from (an event recorded and waited for): a
 * capture forks to, or joins, a stream so. */
static inline void wait_for(mp__custream to, mp__custream from) {
  mp__curesult (*create)(void **, unsigned) = NULL;
  mp__curesult (*record)(void *, mp__custream) = NULL;
  mp__curesult (*wait)(mp__custream, void *, unsigned) = NULL;
  mp__curesult (*destroy)(void *) = NULL;
  *(void **)&create = fake("cuEventCreate");
  *(void **)&record = fake("cuEventRecord");
  *(void **)&wait = fake("cuStreamWaitEvent");
  *(void **)&destroy = fake("cuEventDestroy_v2");
  void *ev = NULL;
  cr_assert_eq(create(&ev, 2 /* CU_EVENT_DISABLE_TIMING */), 0);
  cr_assert_eq(record(ev, from), 0);
  cr_assert_eq(wait(to, ev, 0), 0);
  cr_assert_eq(destroy(ev), 0);
}

#endif
