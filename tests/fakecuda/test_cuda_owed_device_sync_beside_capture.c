/* A pool that owes a device synchronize (a graph pool's range given back
 * after another thread's per-thread stream used it, which the releasing
 * thread cannot record on) does not make it while another thread captures
 * a stream the pool never met. A cuCtxSynchronize waits for every stream of
 * the context: during any capture in it, it is refused and invalidates the
 * capture, whatever the modes (CUDA Programming Guide, "Prohibited and
 * Unhandled Operations"; cuda.h, cuStreamBeginCapture_v2). The trim is
 * refused with MP_EBUSY instead, the debt kept for a later call. The
 * capture is seen where the device can ask: a blocking stream (the legacy
 * stream answers CUDA_ERROR_STREAM_CAPTURE_IMPLICIT), or a stream made with
 * mp_stream_create. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

#include <cuda.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "capture_beside.h"
#include "fakecuda_test.h"

#define MiB ((size_t)1 << 20)
/* A call of the library that must succeed. */
#define OK(call) cr_assert_eq((call), MP_OK, "%s", mp_last_error())

static mp_device_t *dev;
static mp_pool_t *pool, *g;
static mp_stream_t cs; /* the graph pool's captured stream */

/* Another thread, alive until the trims: its per-thread stream, forgotten
 * when it exits, stays one the releasing thread cannot record on. */
static struct {
  pthread_t t;
  void *p;
  mp_status_t st;
  atomic_int stage; /* 1: recorded, 2: may exit */
} reader;

/* Records the graph's output on the calling thread's per-thread stream. */
static void *record_here(void *arg) {
  (void)arg;
  reader.st =
      mp_pool_record_stream(pool, reader.p, (mp_stream_t)CU_STREAM_PER_THREAD);
  atomic_store(&reader.stage, 1);
  while (atomic_load(&reader.stage) != 2)
    usleep(1000);
  return NULL;
}

/* A pool owing a device synchronize for a free MiB: a graph pool's output,
 * read on another thread's per-thread stream, freed and released here. */
static void owe_device_sync(void) {
  dev = open_dev("cuda");
  OK(mp_pool_create(dev, NULL, &pool));
  OK(mp_pool_graph_create(pool, &g));
  OK(mp_stream_create(dev, &cs));
  OK(mp_pool_graph_begin(pool, g, cs));
  void *p = NULL;
  OK(mp_pool_alloc(pool, MiB, cs, &p));
  OK(mp_pool_graph_end(pool, cs));
  reader.p = p;
  atomic_store(&reader.stage, 0);
  cr_assert_eq(pthread_create(&reader.t, NULL, record_here, NULL), 0);
  while (atomic_load(&reader.stage) != 1)
    usleep(1000);
  cr_assert_eq(reader.st, MP_OK, "%s", mp_last_error());
  OK(mp_pool_free(pool, p));
  OK(mp_pool_graph_release(g));
  OK(mp_pool_check(pool));
}

typedef struct {
  atomic_int stage; /* 1: capture begun, 2: the trim beside it is done */
  CUstream s;       /* a stream to capture, or NULL: a new blocking one */
  CUresult end;
} beside_t;

/* Captures b->s, or a new blocking stream (capture_beside.h), in global
 * mode in device 0's primary context until stage 2. */
static void *capture_thread(void *arg) {
  beside_t *b = arg;
  CUstream s = b->s;
  CUcontext ctx;
  if (s == NULL) {
    s = capture_begin_with(CU_STREAM_DEFAULT, CU_STREAM_CAPTURE_MODE_GLOBAL);
  } else {
    cr_assert_eq(capcu.retain(&ctx, 0), CUDA_SUCCESS);
    cr_assert_eq(capcu.push(ctx), CUDA_SUCCESS);
    cr_assert_eq(capcu.begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  }
  atomic_store(&b->stage, 1);
  while (atomic_load(&b->stage) != 2)
    usleep(1000);
  if (b->s == NULL) {
    b->end = capture_end_here(s);
    return NULL;
  }
  CUgraph gr = NULL;
  b->end = capcu.end(s, &gr);
  if (gr != NULL)
    cr_assert_eq(capcu.graph_destroy(gr), CUDA_SUCCESS);
  cr_assert_eq(capcu.pop(NULL), CUDA_SUCCESS);
  cr_assert_eq(capcu.release(0), CUDA_SUCCESS);
  return NULL;
}

/* Trims pool while another thread captures s (NULL: a new blocking
 * stream) in global mode: the trim is refused, the capture stays valid,
 * and the trim after the capture gives the MiB back. */
static void trim_beside(CUstream s) {
  (void)capture_start; /* capture_beside.h's own thread: not needed */
  (void)capture_finish;
  capture_load();
  beside_t b = {.s = s, .end = CUDA_ERROR_UNKNOWN};
  long long refused = capture_errors(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, capture_thread, &b), 0);
  while (atomic_load(&b.stage) != 1)
    usleep(1000);
  mp_status_t st = mp_pool_trim(pool, 0);
  char why[512];
  snprintf(why, sizeof why, "%s", mp_last_error());
  atomic_store(&b.stage, 2);
  pthread_join(t, NULL);
  cr_expect_eq(b.end, CUDA_SUCCESS,
               "the capture beside was invalidated (%d); the trim said %d: %s",
               (int)b.end, (int)st, why);
  cr_expect_eq(capture_errors(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), refused,
               "the driver refused a call during the capture");
  cr_expect_eq(st, MP_EBUSY, "the trim beside the capture: %d, %s", (int)st,
               why);
  /* The debt was kept: once the capture is over, the trim makes it. */
  atomic_store(&reader.stage, 2);
  pthread_join(reader.t, NULL);
  OK(mp_pool_trim(pool, 0));
  mp_stats_t ps;
  cr_assert_eq(mp_pool_get_stats(pool, &ps), MP_OK);
  cr_expect_eq(ps.reserved_bytes, 0, "%zu bytes still reserved",
               ps.reserved_bytes);
  OK(mp_pool_check(pool));
}

static void done(void) {
  OK(mp_pool_destroy(pool));
  OK(mp_stream_destroy(dev, cs));
  mp_device_close(dev);
}

Test(cuda_owed_device_sync_beside_capture,
     blocking_stream_capture_stays_valid) {
  owe_device_sync();
  trim_beside(NULL);
  done();
}

Test(cuda_owed_device_sync_beside_capture,
     device_stream_the_pool_never_met_stays_valid) {
  owe_device_sync();
  mp_stream_t other = NULL;
  OK(mp_stream_create(dev, &other));
  trim_beside((CUstream)other);
  OK(mp_stream_destroy(dev, other));
  done();
}
