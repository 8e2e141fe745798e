/* fakecuda_test.h - what the cuda-backend tests need from the fake driver.
 *
 * The tests never link the fake: mempool loads it with dlopen, and the tests
 * reach its test hooks the same way, through the copy already loaded. */
#ifndef MEMPOOL_FAKECUDA_TEST_H
#define MEMPOOL_FAKECUDA_TEST_H

#include <dlfcn.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <cuda.h>

/* A symbol of the fake libcuda.so.1 (loaded on demand). */
static inline void *fk_test_sym(const char *name) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  cr_assert_not_null(h, "the fake libcuda.so.1 is not on the library path");
  void *sym = dlsym(h, name);
  cr_assert_not_null(sym, "the fake driver has no %s", name);
  return sym;
}

/* A symbol of the loaded libcuda.so.1, or NULL where it lacks it. */
static inline void *fk_test_sym_opt(const char *name) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  return h != NULL ? dlsym(h, name) : NULL;
}

/* The test runs against a real driver (its GPU twin, tests/gpu/gpu_twin.sh):
 * what only the fake can tell (call and error counts) is not asked. */
static inline bool fk_is_real(void) {
  return fk_test_sym_opt("cuFakeGetCallCount") == NULL;
}

/* fp = the fake's function `name`, typed as fp is. */
#define FK_LOAD(fp, name)                                                      \
  do {                                                                         \
    void *fk_sym_ = fk_test_sym(name);                                         \
    memcpy(&(fp), &fk_sym_, sizeof fk_sym_);                                   \
  } while (0)

/* How often the driver entry point `name` (its exported name) was called. */
static inline long long fk_calls(const char *name) {
  long long (*get)(const char *);
  void *sym = fk_test_sym("cuFakeGetCallCount");
  memcpy(&get, &sym, sizeof sym);
  long long n = get(name);
  cr_assert_geq(n, 0, "the fake driver does not count '%s'", name);
  return n;
}

/* The driver entry point `name` was called n times, where the fake counts
 * calls; on a real driver (the GPU twin), which counts nothing, the count
 * is not asked and the rest of the test still runs. */
static inline void fk_assert_calls(const char *name, long long n) {
  if (fk_is_real())
    return;
  long long got = fk_calls(name);
  cr_assert_eq(got, n, "%s: called %lld times, not %lld", name, got, n);
}

static inline void fk_reset_calls(void) {
  void (*reset)(void);
  void *sym = fk_test_sym("cuFakeResetCallCounts");
  memcpy(&reset, &sym, sizeof sym);
  reset();
}

/* Every later call that works in a context answers code (a sticky error,
 * as after a kernel's fault), until a call with 0 (fakecuda.c). */
static inline void fk_sticky_error(CUresult code) {
  void (*set)(CUresult);
  void *sym = fk_test_sym("cuFakeSetStickyError");
  memcpy(&set, &sym, sizeof sym);
  set(code);
}

/* The driver entry point `name` (its exported name) answers code to its
 * next `times` calls (-1: all of them; 0: no more), doing nothing
 * (fakecuda.c, cuFakeRefuse). */
static inline void fk_refuse(const char *name, CUresult code, long times) {
  bool (*set)(const char *, CUresult, long);
  FK_LOAD(set, "cuFakeRefuse");
  cr_assert(set(name, code, times), "the fake driver has no %s", name);
}

/* The next call of the driver entry point `name` runs fn(arg) first, on
 * the calling thread (fakecuda.c, cuFakeBeforeCall). */
static inline void fk_before_call(const char *name, void (*fn)(void *),
                                  void *arg) {
  bool (*set)(const char *, void (*)(void *), void *);
  FK_LOAD(set, "cuFakeBeforeCall");
  cr_assert(set(name, fn, arg), "the fake driver has no %s", name);
}

/* Sets this thread's capture mode to m; the mode it had
 * (cuThreadExchangeStreamCaptureMode). */
static inline CUstreamCaptureMode
fk_exchange_capture_mode(CUstreamCaptureMode m) {
  CUresult (*xchg)(CUstreamCaptureMode *);
  FK_LOAD(xchg, "cuThreadExchangeStreamCaptureMode");
  cr_assert_eq(xchg(&m), CUDA_SUCCESS);
  return m;
}

/* For fk_before_call on a call the cuda backend makes in relaxed capture
 * mode: the next cuThreadExchangeStreamCaptureMode, the restore of the
 * thread's mode after that call, is refused (CUDA_ERROR_INVALID_VALUE). */
static inline void fk_refuse_next_exchange(void *arg) {
  (void)arg;
  fk_refuse("cuThreadExchangeStreamCaptureMode", CUDA_ERROR_INVALID_VALUE, 1);
}

#endif /* MEMPOOL_FAKECUDA_TEST_H */
