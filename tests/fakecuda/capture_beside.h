/* capture_beside.h - another thread's stream capture in global mode, for
 * the tests that show a call of the library keeps it valid. In global mode
 * a "potentially unsafe" call from any other thread is prohibited and
 * invalidates the capture (cuda.h, cuStreamBeginCapture_v2 and
 * cuThreadExchangeStreamCaptureMode); cuStreamEndCapture then answers
 * CUDA_ERROR_STREAM_CAPTURE_INVALIDATED. The driver is the libcuda.so.1
 * loaded (the fake, or the real one in a GPU twin), reached through
 * fakecuda_test.h. */
#ifndef MEMPOOL_TEST_CAPTURE_BESIDE_H
#define MEMPOOL_TEST_CAPTURE_BESIDE_H

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include <cuda.h>

#include "fakecuda_test.h"

typedef struct {
  atomic_int stage; /* 1: capture begun, 2: the call beside it is done */
  CUresult end;
  pthread_t thread;
  long long refused; /* the fake's refusals when it began */
} capture_t;

static struct {
  CUresult (*retain)(CUcontext *, CUdevice), (*release)(CUdevice);
  CUresult (*push)(CUcontext), (*pop)(CUcontext *);
  CUresult (*create)(CUstream *, unsigned), (*destroy)(CUstream);
  CUresult (*begin)(CUstream, CUstreamCaptureMode);
  CUresult (*end)(CUstream, CUgraph *);
  CUresult (*graph_destroy)(CUgraph);
  long long (*errors)(CUresult);
} capcu;

/* How often the fake refused with r (0 on a real driver, where the other
 * checks stand alone). */
static long long capture_errors(CUresult r) {
  return capcu.errors != NULL ? capcu.errors(r) : 0;
}

/* Makes device 0's primary context current on this thread, and begins a
 * capture in mode on a new stream of it (made with flags). */
static CUstream capture_begin_with(unsigned flags, CUstreamCaptureMode mode) {
  CUcontext ctx;
  cr_assert_eq(capcu.retain(&ctx, 0), CUDA_SUCCESS);
  cr_assert_eq(capcu.push(ctx), CUDA_SUCCESS);
  CUstream s;
  cr_assert_eq(capcu.create(&s, flags), CUDA_SUCCESS);
  cr_assert_eq(capcu.begin(s, mode), CUDA_SUCCESS);
  return s;
}

/* The same, a global-mode capture on a non-blocking stream. */
static CUstream capture_begin_here(void) {
  return capture_begin_with(CU_STREAM_NON_BLOCKING,
                            CU_STREAM_CAPTURE_MODE_GLOBAL);
}

/* Ends capture_begin_here's capture (its graph destroyed), the stream and
 * the context: what cuStreamEndCapture said. */
static CUresult capture_end_here(CUstream s) {
  CUgraph g = NULL;
  CUresult end = capcu.end(s, &g);
  if (g != NULL)
    cr_assert_eq(capcu.graph_destroy(g), CUDA_SUCCESS);
  cr_assert_eq(capcu.destroy(s), CUDA_SUCCESS);
  cr_assert_eq(capcu.pop(NULL), CUDA_SUCCESS);
  cr_assert_eq(capcu.release(0), CUDA_SUCCESS);
  return end;
}

static void *capture_beside(void *p) {
  capture_t *c = p;
  CUstream s = capture_begin_here();
  atomic_store(&c->stage, 1);
  while (atomic_load(&c->stage) != 2)
    usleep(1000);
  c->end = capture_end_here(s);
  return NULL;
}

/* The driver's entry points the capture uses (capcu). */
static void capture_load(void) {
  FK_LOAD(capcu.retain, "cuDevicePrimaryCtxRetain");
  FK_LOAD(capcu.release, "cuDevicePrimaryCtxRelease_v2");
  FK_LOAD(capcu.push, "cuCtxPushCurrent_v2");
  FK_LOAD(capcu.pop, "cuCtxPopCurrent_v2");
  FK_LOAD(capcu.create, "cuStreamCreate");
  FK_LOAD(capcu.destroy, "cuStreamDestroy_v2");
  FK_LOAD(capcu.begin, "cuStreamBeginCapture_v2");
  FK_LOAD(capcu.end, "cuStreamEndCapture");
  FK_LOAD(capcu.graph_destroy, "cuGraphDestroy");
  void *errs = fk_test_sym_opt("cuFakeGetErrorCount");
  memcpy(&capcu.errors, &errs, sizeof errs); /* NULL on a real driver */
}

/* Starts the capture on another thread (device 0's primary context) and
 * waits until it is underway. */
static void capture_start(capture_t *c) {
  capture_load();
  c->end = CUDA_ERROR_UNKNOWN;
  atomic_store(&c->stage, 0);
  cr_assert_eq(pthread_create(&c->thread, NULL, capture_beside, c), 0);
  while (atomic_load(&c->stage) != 1)
    usleep(1000);
  c->refused = capture_errors(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
}

/* Ends it: the capture must have stayed valid, nothing refused. */
static void capture_finish(capture_t *c) {
  atomic_store(&c->stage, 2);
  pthread_join(c->thread, NULL);
  cr_assert_eq(c->end, CUDA_SUCCESS, "the capture beside was invalidated (%d)",
               (int)c->end);
  cr_assert_eq(capture_errors(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),
               c->refused);
}

#endif /* MEMPOOL_TEST_CAPTURE_BESIDE_H */
