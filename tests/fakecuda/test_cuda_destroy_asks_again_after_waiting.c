/* test_cuda_destroy_asks_again_after_waiting.c - mp_pool_destroy refuses
 * (MP_EBUSY, nothing changed, pool.h) while a stream it knows is captured
 * without its knowledge and while a block of a plain segment is imported
 * by another process (or a handle of it is still open). It asks both
 * under its lock, and then drops the lock twice before anything goes
 * back: to wait for another thread's synchronization of the pool
 * (mp__pool_wait_sync), and to wait for its own streams' events. What
 * came meanwhile must be refused as if it came before the call.
 *
 * A capture begun during the first wait was not seen: destroy recorded an
 * event on the capturing stream and waited for it, which CUDA refuses
 * (CUDA_ERROR_CAPTURED_EVENT) and which invalidates the capture (cuda.h,
 * cuStreamBeginCapture_v2 and cuThreadExchangeStreamCaptureMode: an event
 * last recorded in a capturing stream cannot be waited for).
 *
 * An export made during the second wait was not seen either: destroy
 * dropped the export and freed the segment, where "calling ::cuMemFree on
 * an exported memory region before calling ::cuIpcCloseMemHandle in the
 * importing context will result in undefined behavior" (cuda.h,
 * cuIpcOpenMemHandle).
 *
 * The other thread's synchronization is a trim, held in flight by a host
 * function on the pool's other stream that waits for a gate; destroy's own
 * wait is held the same way. On the fake the capture begins, or the export
 * is made, once the driver's counts show destroy waiting; on a GPU (no
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

/* On the fake: waits (at most 30 s) until name was called at least n times;
 * false if it never was. On a GPU (no counts): a pause, then true. */
static bool calls_reach(const char *name, long long n) {
  if (fk_is_real()) {
    usleep(200000);
    return true;
  }
  for (int ms = 0; ms < 30000; ms++) {
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

/* A cuda pool of plain segments used from two streams of its own: a
 * block x allocated on a (freed or kept live as the case asks) and one
 * freed on b, whose host function later holds a wait. */
typedef struct {
  mp_device_t *dev;
  mp_pool_t *pool;
  CUstream a, b;
  void *x;
} scene_t;

static scene_t scene_make(bool keep_x) {
  scene_t sc = {.dev = open_dev("cuda")};
  CUcontext ctx;
  cr_assert_eq(capcu.retain(&ctx, 0), CUDA_SUCCESS);
  cr_assert_eq(capcu.push(ctx), CUDA_SUCCESS);
  sc.pool = make_pool(sc.dev, "virtual=0,segment_bytes=8M");
  cr_assert_eq(capcu.create(&sc.a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  cr_assert_eq(capcu.create(&sc.b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  void *y = NULL;
  cr_assert_eq(mp_pool_alloc(sc.pool, MiB, (mp_stream_t)sc.a, &sc.x), MP_OK,
               "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(sc.pool, MiB, (mp_stream_t)sc.b, &y), MP_OK, "%s",
               mp_last_error());
  if (!keep_x) {
    cr_assert_eq(mp_pool_free(sc.pool, sc.x), MP_OK, "%s", mp_last_error());
    sc.x = NULL;
  }
  cr_assert_eq(mp_pool_free(sc.pool, y), MP_OK, "%s", mp_last_error());
  return sc;
}

/* Holds b's work until *gate opens (a host function that makes no CUDA
 * call); returns the driver's count of event waits so far (0 on a GPU). */
static long long scene_hold_b(scene_t *sc, atomic_int *gate) {
  cr_assert_eq(
      mp_stream_launch_host(sc->dev, (mp_stream_t)sc->b, hold_until_open, gate),
      MP_OK, "%s", mp_last_error());
  return fk_is_real() ? 0 : fk_calls("cuEventSynchronize");
}

/* Destroys the pool (it must go now), the streams and the context. */
static void scene_end(scene_t *sc) {
  cr_assert_eq(mp_pool_destroy(sc->pool), MP_OK, "%s", mp_last_error());
  CUstream made[2] = {sc->a, sc->b};
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(mp_stream_forget(sc->dev, (mp_stream_t)made[i]), MP_OK);
    cr_assert_eq(capcu.destroy(made[i]), CUDA_SUCCESS);
  }
  cr_assert_eq(capcu.pop(NULL), CUDA_SUCCESS);
  cr_assert_eq(capcu.release(0), CUDA_SUCCESS);
  mp_device_close(sc->dev);
}

Test(cuda_destroy_asks_again_after_waiting,
     capture_begun_during_another_threads_sync_is_refused,
     .init = load_driver) {
  /* a: captured later; b: holds the trim's synchronization. */
  scene_t sc = scene_make(false);
  mp_pool_t *pool = sc.pool;
  CUstream a = sc.a;
  size_t before = reserved(pool);
  cr_assert_gt(before, 0);

  atomic_int gate = 0;
  long long syncs = scene_hold_b(&sc, &gate);
  bool real = fk_is_real();
  call_t trim = {.pool = pool, .destroy = false, .st = MP_EINVAL};
  pthread_t tt, td;
  cr_assert_eq(pthread_create(&tt, NULL, call_pool, &trim), 0);
  /* The trim's synchronization is in flight (its lock dropped) once it
   * waits for an event: b's stays incomplete until the gate opens. */
  bool trim_waits = calls_reach("cuEventSynchronize", syncs + 1);
  long long asks = real ? 0 : fk_calls("cuStreamIsCapturing");
  call_t destroy = {.pool = pool, .destroy = true, .st = MP_EINVAL};
  cr_assert_eq(pthread_create(&td, NULL, call_pool, &destroy), 0);
  /* Destroy asked a and b, and now waits for the trim. */
  bool destroy_asked = calls_reach("cuStreamIsCapturing", asks + 2);
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
  scene_end(&sc);
}

Test(cuda_destroy_asks_again_after_waiting,
     export_made_during_its_own_wait_is_refused, .init = load_driver) {
  /* a: the live block x's stream; b: holds destroy's own wait. */
  scene_t sc = scene_make(true);
  mp_pool_t *pool = sc.pool;
  void *x = sc.x;
  size_t before = reserved(pool);

  atomic_int gate = 0;
  long long syncs = scene_hold_b(&sc, &gate);
  call_t destroy = {.pool = pool, .destroy = true, .st = MP_EINVAL};
  pthread_t td;
  cr_assert_eq(pthread_create(&td, NULL, call_pool, &destroy), 0);
  /* Destroy asked for exports and captures, and waits for b's event. */
  bool destroy_waits = calls_reach("cuEventSynchronize", syncs + 1);
  mp_ipc_handle_t h;
  mp_status_t exported = mp_pool_ipc_export(pool, x, &h);
  char export_why[512];
  snprintf(export_why, sizeof export_why, "%s", mp_last_error());
  atomic_store(&gate, 1);
  pthread_join(td, NULL);

  cr_assert(destroy_waits, "destroy never waited for an event");
  cr_assert_eq(exported, MP_OK, "the export: %s", export_why);
  cr_assert_eq(destroy.st, MP_EBUSY, "destroy beside an export: %d (%s)",
               destroy.st, destroy.why);
  cr_expect_neq(strstr(destroy.why, "imported"), NULL, "%s", destroy.why);
  /* Nothing went: the pool, its block and the export are as they were. */
  cr_assert_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(reserved(pool), before);
  size_t held = 1;
  cr_assert_eq(mp_pool_ipc_poll(pool, &held), MP_OK, "%s", mp_last_error());
  cr_expect_eq(held, 0, "the live block is leased, not held");
  /* The handle closed (no importer), the pool goes. */
  cr_assert_eq(mp_ipc_handle_close(&h), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, x), MP_OK, "%s", mp_last_error());
  scene_end(&sc);
}
