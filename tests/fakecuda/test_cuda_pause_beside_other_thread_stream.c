/* test_cuda_pause_beside_other_thread_stream.c - a pause of a pool whose
 * stream table holds another (live) thread's per-thread default stream,
 * while a third thread captures a graph in global mode. No handle of the
 * pausing thread names the other thread's per-thread stream
 * (CU_STREAM_PER_THREAD is the caller's own), so its work is waited for
 * by an event on the legacy stream, which blocking streams (per-thread
 * ones included) are ordered with. It was a device synchronize
 * (cuCtxSynchronize), which CUDA refuses beside a global capture and
 * which invalidates it (cuda.h, cuThreadExchangeStreamCaptureMode): the
 * pause failed and the other thread's graph was lost. Where the capture
 * is on a blocking stream, the legacy stream cannot take an event
 * either (an implicit capture, cuda.h cuStreamIsCapturing): the pause is
 * refused, nothing changed, the capture kept. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "capture_beside.h"
#include "fakecuda_test.h"

#define MiB ((size_t)1 << 20)

typedef struct {
  mp_pool_t *pool;
  atomic_int stage; /* 1: used its per-thread stream, 2: may exit */
} user_t;

static void *use_per_thread_stream(void *p) {
  user_t *u = p;
  CUcontext c;
  cr_assert_eq(capcu.retain(&c, 0), CUDA_SUCCESS);
  cr_assert_eq(capcu.push(c), CUDA_SUCCESS);
  void *b = NULL;
  cr_assert_eq(
      mp_pool_alloc(u->pool, MiB, (mp_stream_t)CU_STREAM_PER_THREAD, &b), MP_OK,
      "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(u->pool, b), MP_OK);
  atomic_store(&u->stage, 1);
  while (atomic_load(&u->stage) != 2)
    usleep(1000);
  cr_assert_eq(capcu.pop(NULL), CUDA_SUCCESS);
  cr_assert_eq(capcu.release(0), CUDA_SUCCESS);
  return NULL;
}

typedef struct {
  mp_device_t *dev;
  mp_pool_t *pool;
  mp_stream_t s; /* this thread's: not the legacy stream */
  void *mine;
  user_t u;
  pthread_t t;
} setup_t;

/* A virtual pool with a block of this thread's on a stream it made (so
 * that only the other thread's stream needs the legacy one), and a freed
 * one of another thread's per-thread stream, that thread still alive. */
static void setup(setup_t *x) {
  capture_load();
  x->dev = open_dev("cuda");
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_assert_eq(mp_pool_config_parse(&cfg, "virtual=1"), MP_OK);
  cr_assert_eq(mp_pool_create(x->dev, &cfg, &x->pool), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_stream_create(x->dev, &x->s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(x->pool, MiB, x->s, &x->mine), MP_OK);
  x->u.pool = x->pool;
  atomic_init(&x->u.stage, 0);
  cr_assert_eq(pthread_create(&x->t, NULL, use_per_thread_stream, &x->u), 0);
  while (atomic_load(&x->u.stage) != 1)
    usleep(1000);
}

static void teardown(setup_t *x) {
  atomic_store(&x->u.stage, 2);
  pthread_join(x->t, NULL);
  cr_assert_eq(mp_pool_free(x->pool, x->mine), MP_OK);
  cr_assert_eq(mp_pool_check(x->pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(x->pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(x->dev, x->s), MP_OK);
  mp_device_close(x->dev);
}

Test(cuda_pause_beside_other_thread_stream, keeps_a_global_capture) {
  setup_t x;
  setup(&x);
  if (!fk_is_real())
    fk_reset_calls();
  capture_t c;
  capture_start(&c);
  mp_status_t st = mp_pool_pause(x.pool, 0);
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  if (!fk_is_real())
    cr_assert_eq(fk_calls("cuCtxSynchronize"), 0);
  mp_stats_t ps;
  cr_assert_eq(mp_pool_get_stats(x.pool, &ps), MP_OK);
  cr_assert_eq(ps.reserved_bytes, 0, "a paused pool holds %zu bytes",
               ps.reserved_bytes);
  capture_finish(&c); /* valid: no device synchronize beside it */
  cr_assert_eq(mp_pool_resume(x.pool), MP_OK, "%s", mp_last_error());
  teardown(&x);
}

static void *capture_blocking(void *p) {
  capture_t *c = p;
  CUstream s = capture_begin_with(0, CU_STREAM_CAPTURE_MODE_GLOBAL);
  atomic_store(&c->stage, 1);
  while (atomic_load(&c->stage) != 2)
    usleep(1000);
  c->end = capture_end_here(s);
  return NULL;
}

Test(cuda_pause_beside_other_thread_stream, refused_beside_blocking_capture) {
  setup_t x;
  setup(&x);
  mp_stats_t before;
  cr_assert_eq(mp_pool_get_stats(x.pool, &before), MP_OK);
  capture_t c = {.end = CUDA_ERROR_UNKNOWN};
  atomic_init(&c.stage, 0);
  cr_assert_eq(pthread_create(&c.thread, NULL, capture_blocking, &c), 0);
  while (atomic_load(&c.stage) != 1)
    usleep(1000);
  c.refused = capture_errors(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  mp_status_t st = mp_pool_pause(x.pool, 0);
  cr_assert_eq(st, MP_EBUSY, "pause answered %d: %s", st, mp_last_error());
  cr_assert(strstr(mp_last_error(), "legacy stream") != NULL, "%s",
            mp_last_error());
  mp_stats_t after;
  cr_assert_eq(mp_pool_get_stats(x.pool, &after), MP_OK);
  cr_assert_eq(after.reserved_bytes, before.reserved_bytes);
  cr_assert_eq(after.allocated_bytes, before.allocated_bytes);
  capture_finish(&c); /* valid: the legacy stream was asked, not used */
  /* Once the capture is over the pause goes ahead. */
  cr_assert_eq(mp_pool_pause(x.pool, 0), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_resume(x.pool), MP_OK, "%s", mp_last_error());
  teardown(&x);
}
