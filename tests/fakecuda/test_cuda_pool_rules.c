/* A pool on the cuda backend keeps CUDA's rules on the strict fake driver:
 * what it does for one thread must not break another thread's stream
 * capture, per-thread default streams are kept apart, and a destroyed
 * stream is forgotten: no event is ever recorded on its dead handle. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "../support/stream_gate.h"
#include "fakecuda_test.h"

static struct {
  CUresult (*retain)(CUcontext *, CUdevice), (*release)(CUdevice);
  CUresult (*push)(CUcontext), (*pop)(CUcontext *);
  CUresult (*create)(CUstream *, unsigned), (*destroy)(CUstream);
  CUresult (*launch)(CUstream, CUhostFn, void *);
  CUresult (*begin)(CUstream, CUstreamCaptureMode);
  CUresult (*end)(CUstream, CUgraph *);
  CUresult (*graph_destroy)(CUgraph);
  long long (*errors)(CUresult);
} cu;

static void load_driver(void) {
  FK_LOAD(cu.retain, "cuDevicePrimaryCtxRetain");
  FK_LOAD(cu.release, "cuDevicePrimaryCtxRelease_v2");
  FK_LOAD(cu.push, "cuCtxPushCurrent_v2");
  FK_LOAD(cu.pop, "cuCtxPopCurrent_v2");
  FK_LOAD(cu.create, "cuStreamCreate");
  FK_LOAD(cu.destroy, "cuStreamDestroy_v2");
  FK_LOAD(cu.launch, "cuLaunchHostFunc");
  FK_LOAD(cu.begin, "cuStreamBeginCapture_v2");
  FK_LOAD(cu.end, "cuStreamEndCapture");
  FK_LOAD(cu.graph_destroy, "cuGraphDestroy");
  FK_LOAD(cu.errors, "cuFakeGetErrorCount");
}

/* Makes device 0's primary context current on this thread. */
static void enter_ctx(void) {
  CUcontext c;
  cr_assert_eq(cu.retain(&c, 0), CUDA_SUCCESS);
  cr_assert_eq(cu.push(c), CUDA_SUCCESS);
}

static void leave_ctx(void) {
  cr_assert_eq(cu.pop(NULL), CUDA_SUCCESS);
  cr_assert_eq(cu.release(0), CUDA_SUCCESS);
}

/* ---- another thread's global-mode capture -------------------------------- */

typedef struct {
  atomic_int stage; /* 1: capture begun, 2: the pool is done */
  CUresult end;
} capture_t;

static void *capture_beside(void *p) {
  capture_t *c = p;
  enter_ctx();
  CUstream s;
  cr_assert_eq(cu.create(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  cr_assert_eq(cu.begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  atomic_store(&c->stage, 1);
  while (atomic_load(&c->stage) != 2)
    usleep(1000);
  CUgraph g = NULL;
  c->end = cu.end(s, &g);
  if (g != NULL)
    cr_assert_eq(cu.graph_destroy(g), CUDA_SUCCESS);
  cr_assert_eq(cu.destroy(s), CUDA_SUCCESS);
  leave_ctx();
  return NULL;
}

/* Pool growth through cuMemAlloc (a device without virtual memory) while
 * another thread captures in global mode: cuMemAlloc is a potentially
 * unsafe call there (cuda.h, cuThreadExchangeStreamCaptureMode), so the
 * backend makes it in relaxed mode. Fails on main: the allocation was
 * refused and the capture invalidated. */
Test(cuda_pool_rules, growth_keeps_another_threads_global_capture,
     .init = load_driver) {
  setenv("FAKECUDA_NO_VMM", "1", 1);
  mp_device_t *dev = open_dev("cuda");
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(dev, NULL, &pool), MP_OK, "%s", mp_last_error());
  capture_t c = {.end = CUDA_ERROR_UNKNOWN};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, capture_beside, &c), 0);
  while (atomic_load(&c.stage) != 1)
    usleep(1000);
  long long refused = cu.errors(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  void *p = NULL;
  mp_status_t st = mp_pool_alloc(pool, 32u << 20, NULL, &p);
  atomic_store(&c.stage, 2);
  pthread_join(t, NULL);
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  cr_assert_eq(c.end, CUDA_SUCCESS, "the pool invalidated the capture");
  cr_assert_eq(cu.errors(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), refused);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(dev);
}

/* ---- per-thread streams ------------------------------------------------- */

static void slow_read(void *p) {
  usleep(150000);
  unsigned char *b = p;
  b[1] = b[0]; /* what the kernel read, kept beside it */
}

typedef struct {
  mp_pool_t *pool;
  mp_device_t *dev;
  void *got;
} pt_t;

static void *alloc_and_write_on_own_per_thread_stream(void *p) {
  pt_t *a = p;
  enter_ctx();
  mp_stream_t pt = (mp_stream_t)CU_STREAM_PER_THREAD;
  cr_assert_eq(mp_pool_alloc(a->pool, 4096, pt, &a->got), MP_OK);
  cr_assert_eq(mp_memset_async(a->dev, a->got, 2, 1, pt), MP_OK);
  cr_assert_eq(mp_stream_synchronize(a->dev, pt), MP_OK);
  leave_ctx();
  return NULL;
}

/* CU_STREAM_PER_THREAD is a different stream in each thread: a block freed
 * on thread A's while A's kernel still reads it is not thread B's to
 * overwrite at once. */
Test(cuda_pool_rules, per_thread_streams_of_two_threads_are_kept_apart,
     .init = load_driver) {
  mp_device_t *dev = open_dev("cuda");
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(dev, NULL, &pool), MP_OK);
  enter_ctx();
  mp_stream_t pt = (mp_stream_t)CU_STREAM_PER_THREAD;
  unsigned char *p = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 4096, pt, (void **)&p), MP_OK);
  cr_assert_eq(mp_memset_async(dev, p, 1, 2, pt), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, pt, slow_read, p), MP_OK);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  pt_t b = {.pool = pool, .dev = dev};
  pthread_t t;
  cr_assert_eq(
      pthread_create(&t, NULL, alloc_and_write_on_own_per_thread_stream, &b),
      0);
  pthread_join(t, NULL);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_assert(b.got != p || p[1] == 1,
            "thread B overwrote the block under thread A's kernel");
  leave_ctx();
  cr_assert_eq(mp_pool_free(pool, b.got), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(dev);
}

/* ---- destroyed streams ----------------------------------------------------
 */

/* cuStreamDestroy returns while the stream's work still runs, and the
 * handle is dead afterwards. The pool, told by mp_stream_forget, closes the
 * stream's epoch while the handle is valid, never records on it again, and
 * still keeps the block freed on it from the next stream until that work
 * is done. */
Test(cuda_pool_rules,
     a_destroyed_stream_gets_no_event_and_its_work_is_waited_for,
     .init = load_driver) {
  mp_device_t *dev = open_dev("cuda");
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(dev, NULL, &pool), MP_OK);
  enter_ctx();
  gate_t gate;
  gate_init(&gate);
  CUstream s, s2;
  cr_assert_eq(cu.create(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  void *a = NULL, *b = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 1u << 20, (mp_stream_t)s, &a), MP_OK);
  cr_assert_eq(cu.launch(s, gate_wait, &gate), CUDA_SUCCESS);
  cr_assert_eq(mp_pool_free(pool, a), MP_OK);
  long long bad = cu.errors(CUDA_ERROR_INVALID_HANDLE);
  cr_assert_eq(mp_stream_forget(dev, (mp_stream_t)s), MP_OK);
  cr_assert_eq(cu.destroy(s), CUDA_SUCCESS);
  cr_assert_eq(cu.create(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  cr_assert_eq(mp_pool_alloc(pool, 1u << 20, (mp_stream_t)s2, &b), MP_OK);
  cr_assert_neq(b, a,
                "the block was reused while the destroyed stream's "
                "work still held it");
  cr_assert_eq(mp_pool_free(pool, b), MP_OK);
  cr_assert_eq(cu.errors(CUDA_ERROR_INVALID_HANDLE), bad,
               "the pool used the destroyed handle");
  gate_open(&gate);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_assert_eq(cu.destroy(s2), CUDA_SUCCESS);
  cr_assert_eq(mp_pool_check(pool), MP_OK);
  leave_ctx();
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  gate_destroy(&gate);
  mp_device_close(dev);
}
