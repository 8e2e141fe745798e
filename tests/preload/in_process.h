/* in_process.h - the shim's sources run in the test's process (no
 * LD_PRELOAD), pooling on the fake driver (tests/fakecuda, found through
 * LD_LIBRARY_PATH): the tests that link them call mp_in_process_cuda from
 * their .init. */
#ifndef MP_TESTS_PRELOAD_IN_PROCESS_H
#define MP_TESTS_PRELOAD_IN_PROCESS_H

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdlib.h>

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
