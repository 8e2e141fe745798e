/* in_process.h - the shim's sources run in the test's process (no
 * LD_PRELOAD), pooling on the fake driver (tests/fakecuda, found through
 * LD_LIBRARY_PATH): the tests that link them call mp_in_process_cuda from
 * their .init. */
#ifndef MP_TESTS_PRELOAD_IN_PROCESS_H
#define MP_TESTS_PRELOAD_IN_PROCESS_H

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "preload/hooks.h"

/* The fake driver loaded, device 0's primary context current (through
 * entry points the shim does not hook); its handle. */
static inline void *mp_in_process_context(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  cr_assert_not_null(lib, "%s", dlerror());
  mp__curesult (*init)(unsigned) = NULL;
  mp__curesult (*retain)(void **, int) = NULL;
  mp__curesult (*set)(void *) = NULL;
  *(void **)&init = dlsym(lib, "cuInit");
  *(void **)&retain = dlsym(lib, "cuDevicePrimaryCtxRetain");
  *(void **)&set = dlsym(lib, "cuCtxSetCurrent");
  void *ctx = NULL;
  cr_assert(init != NULL && retain != NULL && set != NULL && init(0) == 0 &&
            retain(&ctx, 0) == 0 && set(ctx) == 0);
  return lib;
}

/* This thread's current context (through the fake driver's entry point:
 * the shim does not hook it). */
static inline void *mp_in_process_current(void) {
  mp__curesult (*get)(void **) = NULL;
  *(void **)&get = dlsym(RTLD_DEFAULT, "cuCtxGetCurrent");
  void *ctx = NULL;
  cr_assert(get != NULL && get(&ctx) == 0 && ctx != NULL);
  return ctx;
}

/* Makes ctx current on this thread (another thread's, from
 * mp_in_process_current): the driver's answer. */
static inline mp__curesult mp_in_process_set_current(void *ctx) {
  mp__curesult (*set)(void *) = NULL;
  *(void **)&set = dlsym(RTLD_DEFAULT, "cuCtxSetCurrent");
  return set != NULL ? set(ctx) : MP__CU_NOT_INITIALIZED;
}

/* The descriptor of this process open on path (the trace's, the
 * report's: the shim's streams write through a descriptor stdio does not
 * name), or -1. */
static inline int mp_in_process_fd_on(const char *path) {
  char want[PATH_MAX];
  if (realpath(path, want) == NULL)
    return -1;
  for (int fd = 0; fd < 1024; fd++) {
    char link[64], got[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, got, sizeof got - 1);
    if (n <= 0)
      continue;
    got[n] = '\0';
    if (strcmp(got, want) == 0)
      return fd;
  }
  return -1;
}

/* For a child process that runs the shim's sources and exits (the shim's
 * destructor then writes the report), without the test's assertions:
 * pooling on the fake driver's cuda device as mp_in_process_cuda, one
 * allocation made and freed. 0, or the exit status that says what
 * failed. */
static inline int mp_in_process_child_served(void) {
  setenv("MEMPOOL_DEVICE", "cuda", 1);
  unsetenv("MEMPOOL_PRELOAD");
  unsetenv("MEMPOOL_CONF");
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (lib == NULL)
    return 2;
  mp__curesult (*init)(unsigned) = NULL;
  mp__curesult (*retain)(void **, int) = NULL;
  mp__curesult (*set)(void *) = NULL;
  *(void **)&init = dlsym(lib, "cuInit");
  *(void **)&retain = dlsym(lib, "cuDevicePrimaryCtxRetain");
  *(void **)&set = dlsym(lib, "cuCtxSetCurrent");
  void *ctx = NULL;
  mp__cuptr d = 0;
  if (init == NULL || retain == NULL || set == NULL || init(0) != 0 ||
      retain(&ctx, 0) != 0 || set(ctx) != 0 ||
      cuMemAlloc_v2(&d, 4096) != MP__CU_SUCCESS ||
      cuMemFree_v2(d) != MP__CU_SUCCESS)
    return 3;
  return 0;
}

/* This executable again, as a child whose environment has MEMPOOL_REPORT
 * report and `child` value (which its constructor looks for, to run
 * mp_in_process_child_served and exit: the shim's destructor writes the
 * report); its pid. */
static inline pid_t mp_in_process_report_child(const char *report,
                                               const char *child,
                                               const char *value) {
  extern char **environ;
  setenv("MEMPOOL_REPORT", report, 1);
  setenv(child, value, 1);
  char *argv[] = {"report_child", NULL};
  pid_t pid;
  int rc = posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, environ);
  unsetenv(child);
  unsetenv("MEMPOOL_REPORT");
  cr_assert_eq(rc, 0);
  return pid;
}

/* MEMPOOL_TRACE set to a CSV file of this process's own, named after tag,
 * its path in path (cap bytes): for a test that reads the trace. */
static inline void mp_in_process_trace_to(char *path, size_t cap,
                                          const char *tag) {
  snprintf(path, cap, "/tmp/mp_trace_%s_%d.csv", tag, (int)getpid());
  setenv("MEMPOOL_TRACE", path, 1);
}

/* Pooling on the fake driver's cuda device, device 0's primary context
 * current. */
static inline void mp_in_process_cuda(void) {
  setenv("MEMPOOL_DEVICE", "cuda", 1);
  unsetenv("MEMPOOL_PRELOAD");
  unsetenv("MEMPOOL_CONF");
  (void)mp_in_process_context();
  const mp__pl_t *pl = mp__pl_get();
  cr_assert(pl->mode == MP__PL_POOL && !pl->host,
            "the shim is not pooling on the fake driver");
}

#endif
