/* test_cuda_destroy_capture_begun_during_wait.c - mp_pool_destroy asks
 * whether a stream it knows is captured without its knowledge (refused
 * with MP_EBUSY, pool.h), then waits for another thread's synchronization
 * of the pool, which drops the pool's lock (mp__pool_wait_sync). A capture
 * begun on one of its streams during that wait was not seen: destroy
 * recorded an event on the capturing stream and waited for it, which CUDA
 * refuses (CUDA_ERROR_CAPTURED_EVENT) and which invalidates the capture
 * (cuda.h, cuStreamBeginCapture_v2 and cuThreadExchangeStreamCaptureMode:
 * an event last recorded in a capturing stream cannot be waited for). It
 * must be refused as a capture begun before the call is: MP_EBUSY, the
 * pool as it was, the capture valid.
 *
 * The other thread's synchronization is a trim, held in flight by a host
 * function on the pool's other stream that waits for a gate. On the fake
 * the capture begins once destroy has asked both streams
 * (cuStreamIsCapturing counted) and so waits for the trim; on a GPU (no
 * counts) after a pause, and destroy is then refused either way. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "../support/pool_helpers.h"
#include "capture_beside.h"
#include "fakecuda_test.h"

#define MiB ((size_t)1 << 20)

static void load_driver(void) {
  capture_load();
  (void)capture_start; /* capture_beside.h's other thread: not needed */
  (void)capture_finish;
}

/* The host function: returns once the gate opens (no CUDA call). */
static void hold_until_open(void *p) {
  atomic_int *gate = p;
  while (!atomic_load(gate))
    usleep(1000);
}

typedef struct {
  mp_pool_t *pool;
  bool destroy; /* else a trim to 0 */
  mp_status_t st;
  char why[512];
} call_t;

static void *call_pool(void *p) {
  call_t *c = p;
  c->st = c->destroy ? mp_pool_destroy(c->pool) : mp_pool_trim(c->pool, 0);
  snprintf(c->why, sizeof c->why, "%s", mp_last_error());
  return NULL;
}

/* On the fake: waits (at most 5 s) until name was called at least n times;
 * false if it never was. */
static bool calls_reach(const char *name, long long n) {
  for (int ms = 0; ms < 5000; ms++) {
    if (fk_calls(name) >= n)
      return true;
    usleep(1000);
  }
  return false;
}

static size_t reserved(mp_pool_t *p) {
  mp_stats_t s;
  cr_assert_eq(mp_pool_get_stats(p, &s), MP_OK, "%s", mp_last_error());
  return s.reserved_bytes;
}

Test(cuda_destroy_capture_begun_during_wait, refused_and_capture_kept,
     .init = load_driver) {
  mp_device_t *dev = open_dev("cuda");
  CUcontext ctx;
  cr_assert_eq(capcu.retain(&ctx, 0), CUDA_SUCCESS);
  cr_assert_eq(capcu.push(ctx), CUDA_SUCCESS);
  mp_pool_t *pool = make_pool(dev, "virtual=0,segment_bytes=8M");
  /* a: captured later; b: holds the trim's synchronization. */
  CUstream a, b;
  cr_assert_eq(capcu.create(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  cr_assert_eq(capcu.create(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  void *x = NULL, *y = NULL;
  cr_assert_eq(mp_pool_alloc(pool, MiB, (mp_stream_t)a, &x), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, MiB, (mp_stream_t)b, &y), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(pool, x), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, y), MP_OK, "%s", mp_last_error());
  size_t before = reserved(pool);
  cr_assert_gt(before, 0);

  atomic_int gate = 0;
  cr_assert_eq(
      mp_stream_launch_host(dev, (mp_stream_t)b, hold_until_open, &gate), MP_OK,
      "%s", mp_last_error());
  bool real = fk_is_real();
  long long syncs = real ? 0 : fk_calls("cuEventSynchronize");
  call_t trim = {.pool = pool, .destroy = false, .st = MP_EINVAL};
  pthread_t tt, td;
  cr_assert_eq(pthread_create(&tt, NULL, call_pool, &trim), 0);
  /* The trim's synchronization is in flight (its lock dropped) once it
   * waits for an event: b's stays incomplete until the gate opens. */
  bool trim_waits = real || calls_reach("cuEventSynchronize", syncs + 1);
  long long asks = real ? 0 : fk_calls("cuStreamIsCapturing");
  call_t destroy = {.pool = pool, .destroy = true, .st = MP_EINVAL};
  cr_assert_eq(pthread_create(&td, NULL, call_pool, &destroy), 0);
  /* Destroy asked a and b, and now waits for the trim. */
  bool destroy_asked = true;
  if (real)
    usleep(200000);
  else
    destroy_asked = calls_reach("cuStreamIsCapturing", asks + 2);
  CUresult begin = capcu.begin(a, CU_STREAM_CAPTURE_MODE_RELAXED);
  atomic_store(&gate, 1);
  pthread_join(tt, NULL);
  pthread_join(td, NULL);
  CUgraph g = NULL;
  CUresult end = capcu.end(a, &g);
  if (g != NULL)
    cr_assert_eq(capcu.graph_destroy(g), CUDA_SUCCESS);

  cr_assert(trim_waits, "the trim never waited for an event");
  cr_assert(destroy_asked, "destroy never asked the streams");
  cr_assert_eq(begin, CUDA_SUCCESS);
  cr_expect_eq(trim.st, MP_OK, "the trim: %s", trim.why);
  cr_expect_eq(destroy.st, MP_EBUSY, "destroy beside a capture: %d (%s)",
               destroy.st, destroy.why);
  cr_expect_neq(strstr(destroy.why, "captured"), NULL, "%s", destroy.why);
  cr_expect_eq(end, CUDA_SUCCESS, "the capture was invalidated (%d)", end);
  /* The pool is as the trim left it, and goes once the capture is over. */
  cr_assert_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  void *z = NULL;
  cr_expect_eq(mp_pool_alloc(pool, MiB, (mp_stream_t)a, &z), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_free(pool, z), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  CUstream made[2] = {a, b};
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(mp_stream_forget(dev, (mp_stream_t)made[i]), MP_OK);
    cr_assert_eq(capcu.destroy(made[i]), CUDA_SUCCESS);
  }
  cr_assert_eq(capcu.pop(NULL), CUDA_SUCCESS);
  cr_assert_eq(capcu.release(0), CUDA_SUCCESS);
  mp_device_close(dev);
}
