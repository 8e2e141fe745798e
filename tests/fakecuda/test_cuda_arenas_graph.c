/* Graph pools of a pool with arenas on the strict fake driver: a capture
 * marks its stream in every arena, and once it ends it leaves that stream
 * in no arena that never used it. Before, the arenas kept the slot: a
 * capture of one thread's per-thread default stream left it in every other
 * thread's arena, whose synchronization (trim, the out-of-memory ladder)
 * then fell back to cuCtxSynchronize (only the owning thread may record on
 * its per-thread stream), and whose mp_pool_free_after_all blocks waited
 * for that thread, so the arena grew instead of reusing them. Run on a
 * real GPU too (gpu_cuda_arenas_graph: the reuse, not the call counts). */
#include <pthread.h>

#include <cuda.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "fakecuda_test.h"

#define MiB ((size_t)1 << 20)

static void enter_ctx(void) {
  CUcontext c;
  cr_assert_eq(cuInit(0), CUDA_SUCCESS);
  cr_assert_eq(cuDevicePrimaryCtxRetain(&c, 0), CUDA_SUCCESS);
  cr_assert_eq(cuCtxPushCurrent(c), CUDA_SUCCESS);
}

static void leave_ctx(void) {
  cr_assert_eq(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
  cr_assert_eq(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
}

/* What one round of the other thread saw in its own arena. */
typedef struct {
  long long device_syncs; /* cuCtxSynchronize calls of its trim (fake) */
  bool reused;            /* a free_after_all block served it again */
  size_t grew;            /* bytes the arena reserved for that */
  mp_status_t trim;
} seen_t;

typedef struct {
  mp_pool_t *pool;
  pthread_barrier_t *bar;
  seen_t before, after; /* the main thread's capture */
} other_t;

/* On the other thread's stream s: a block freed after all streams, every
 * stream's work done, then the same size again; then a trim. */
static void round_on(mp_pool_t *pool, CUstream s, seen_t *out) {
  void *x = NULL, *y = NULL;
  mp_stats_t a, b;
  cr_assert_eq(mp_pool_alloc(pool, 3 * MiB, (mp_stream_t)s, &x), MP_OK);
  cr_assert_eq(mp_pool_free_after_all(pool, x), MP_OK);
  cr_assert_eq(cuCtxSynchronize(), CUDA_SUCCESS);
  cr_assert_eq(mp_pool_get_stats(pool, &a), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, 3 * MiB, (mp_stream_t)s, &y), MP_OK);
  cr_assert_eq(mp_pool_get_stats(pool, &b), MP_OK);
  out->reused = x == y;
  out->grew = b.reserved_bytes - a.reserved_bytes;
  cr_assert_eq(mp_pool_free(pool, y), MP_OK);
  cr_assert_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
  long long syncs = fk_is_real() ? 0 : fk_calls("cuCtxSynchronize");
  out->trim = mp_pool_trim(pool, 0);
  /* Counted on the fake only; 0 (not asked) on a real driver, where it was
   * left as the caller's uninitialised seen_t had it, and the GPU twin
   * read that garbage as synchronizations. */
  out->device_syncs = fk_is_real() ? 0 : fk_calls("cuCtxSynchronize") - syncs;
}

static void *other_thread(void *arg) {
  other_t *o = arg;
  enter_ctx();
  CUstream s;
  cr_assert_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  round_on(o->pool, s, &o->before);
  /* A block it keeps live meanwhile: a busy arena lends nothing to other
   * threads (an idle one could lend the capture's range, and then the
   * stream would have used it). */
  void *kept;
  cr_assert_eq(mp_pool_alloc(o->pool, 64 * MiB, (mp_stream_t)s, &kept), MP_OK);
  pthread_barrier_wait(o->bar); /* the main thread captures */
  pthread_barrier_wait(o->bar);
  round_on(o->pool, s, &o->after);
  cr_assert_eq(mp_pool_free(o->pool, kept), MP_OK);
  cr_assert_eq(mp_stream_forget(mp_pool_device(o->pool), (mp_stream_t)s),
               MP_OK);
  cr_assert_eq(cuStreamDestroy(s), CUDA_SUCCESS);
  leave_ctx();
  return NULL;
}

/* A pool with arenas=4 on dev, this thread in the primary context. */
static mp_pool_t *arenas_pool(mp_device_t *dev) {
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_assert_eq(mp_pool_config_parse(&cfg, "arenas=4"), MP_OK);
  mp_pool_t *pool;
  cr_assert_eq(mp_pool_create(dev, &cfg, &pool), MP_OK, "%s", mp_last_error());
  enter_ctx();
  return pool;
}

static void expect_undisturbed(const seen_t *seen, const char *when) {
  cr_expect_eq(seen->trim, MP_OK, "%s: trim %d", when, seen->trim);
  cr_expect_eq(seen->device_syncs, 0,
               "%s: the trim of the other arena synchronized the device "
               "%lld times",
               when, seen->device_syncs);
  cr_expect(seen->reused,
            "%s: the block freed after all streams was not reused once "
            "every stream's work was done (the arena grew %zu bytes)",
            when, seen->grew);
}

Test(cuda_arenas_graph, a_per_thread_capture_leaves_other_arenas_as_they_were) {
  mp_device_t *dev = open_dev("cuda");
  mp_pool_t *pool = arenas_pool(dev), *g;
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, 2);
  other_t o = {.pool = pool, .bar = &bar};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, other_thread, &o), 0);
  pthread_barrier_wait(&bar);
  /* This thread's per-thread stream, begun and ended while the other
   * thread's arena exists, then one more thread's arena made after. */
  mp_stream_t pt = (mp_stream_t)CU_STREAM_PER_THREAD;
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, g, pt), MP_OK, "%s", mp_last_error());
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, MiB, pt, &p), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_graph_of(pool, pt), g);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_end(pool, pt), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  /* The range went back to this thread's arena, used on this thread's
   * per-thread stream: a trim from another thread would synchronize the
   * device for it, rightly. This thread trims it itself (its own stream:
   * an event). */
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  pthread_barrier_wait(&bar);
  pthread_join(t, NULL);
  pthread_barrier_destroy(&bar);
  expect_undisturbed(&o.before, "before the capture");
  expect_undisturbed(&o.after, "after the capture");
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  leave_ctx();
  mp_device_close(dev);
}

/* A graph's range given back while another thread's arena has met that
 * thread's per-thread stream, on which this thread can record nothing:
 * the lending arena cannot name it, so the range waits for one device
 * synchronize (the next sync of the lender) before it serves again. It
 * went back as used on the lender's own streams only, and served another
 * stream while a replay might still run on the other thread's. */
/* A second thread's pool and the barrier it meets the main thread at. */
typedef struct {
  mp_pool_t *pool;
  pthread_barrier_t *bar;
} peer_t;

static void *pt_user(void *arg) {
  peer_t *u = arg;
  enter_ctx();
  mp_stream_t pt = (mp_stream_t)CU_STREAM_PER_THREAD;
  /* One granule, kept: its arena has nothing free, so no trim of it
   * synchronizes anything. */
  void *p;
  cr_assert_eq(mp_pool_alloc(u->pool, 2 * MiB, pt, &p), MP_OK, "%s",
               mp_last_error());
  pthread_barrier_wait(u->bar); /* its arena knows its per-thread stream */
  pthread_barrier_wait(u->bar); /* the main thread is done */
  cr_assert_eq(mp_pool_free(u->pool, p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(cuStreamSynchronize(CU_STREAM_PER_THREAD), CUDA_SUCCESS);
  leave_ctx();
  return NULL;
}

Test(cuda_arenas_graph,
     a_range_waits_for_a_device_sync_where_its_lender_cannot_name_a_stream) {
  mp_device_t *dev = open_dev("cuda");
  mp_pool_t *pool = arenas_pool(dev), *g;
  CUstream s1, s2;
  cr_assert_eq(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  cr_assert_eq(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, 2);
  peer_t u = {.pool = pool, .bar = &bar};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, pt_user, &u), 0);
  pthread_barrier_wait(&bar);
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, g, (mp_stream_t)s1), MP_OK);
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, 3 * MiB, (mp_stream_t)s1, &p), MP_OK, "%s",
               mp_last_error());
  uintptr_t base = (uintptr_t)p;
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_pool_graph_end(pool, (mp_stream_t)s1), MP_OK);
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(cuStreamSynchronize(s1), CUDA_SUCCESS);
  void *q;
  cr_assert_eq(mp_pool_alloc(pool, 3 * MiB, (mp_stream_t)s2, &q), MP_OK, "%s",
               mp_last_error());
  cr_expect_neq((uintptr_t)q, base,
                "the range served s2 before the device was synchronized");
  cr_assert_eq(mp_pool_free(pool, q), MP_OK);
  cr_assert_eq(cuStreamSynchronize(s2), CUDA_SUCCESS);
  /* The lender's next sync is a device synchronize, and only the next. */
  long long syncs = fk_is_real() ? 0 : fk_calls("cuCtxSynchronize");
  cr_expect_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  if (!fk_is_real())
    cr_expect_eq(fk_calls("cuCtxSynchronize") - syncs, 1,
                 "the lender's sync was not a device synchronize");
  cr_assert_eq(mp_pool_alloc(pool, 3 * MiB, (mp_stream_t)s2, &q), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(pool, q), MP_OK);
  cr_assert_eq(cuStreamSynchronize(s2), CUDA_SUCCESS);
  syncs = fk_is_real() ? 0 : fk_calls("cuCtxSynchronize");
  cr_expect_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  if (!fk_is_real())
    cr_expect_eq(fk_calls("cuCtxSynchronize") - syncs, 0,
                 "a later sync of the lender synchronized the device again");
  pthread_barrier_wait(&bar);
  pthread_join(t, NULL);
  pthread_barrier_destroy(&bar);
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_forget(dev, (mp_stream_t)s1), MP_OK);
  cr_assert_eq(mp_stream_forget(dev, (mp_stream_t)s2), MP_OK);
  cr_assert_eq(cuStreamDestroy(s1), CUDA_SUCCESS);
  cr_assert_eq(cuStreamDestroy(s2), CUDA_SUCCESS);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  leave_ctx();
  mp_device_close(dev);
}

/* A graph released while another thread captures its per-thread stream:
 * the lending arena knows that stream only through the capture's mark.
 * The range waits for the marker the capture's end records, and the slot
 * goes with the mark. Named as a use, it stayed in the arena for good:
 * every later trim of the arena synchronized the device, and its
 * free_after_all blocks waited for the other thread. */
static void *capturer(void *arg) {
  peer_t *c = arg;
  enter_ctx();
  mp_stream_t pt = (mp_stream_t)CU_STREAM_PER_THREAD;
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(c->pool, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(c->pool, g, pt), MP_OK, "%s",
               mp_last_error());
  pthread_barrier_wait(c->bar); /* the main thread releases its graph */
  pthread_barrier_wait(c->bar);
  cr_assert_eq(mp_pool_graph_end(c->pool, pt), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  pthread_barrier_wait(c->bar); /* the main thread's round */
  pthread_barrier_wait(c->bar);
  leave_ctx();
  return NULL;
}

Test(cuda_arenas_graph, a_release_during_a_capture_leaves_no_stream_behind) {
  mp_device_t *dev = open_dev("cuda");
  mp_pool_t *pool = arenas_pool(dev), *g;
  CUstream s1;
  cr_assert_eq(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  seen_t before, after;
  round_on(pool, s1, &before);
  /* g: a range this thread's arena lends. */
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, g, (mp_stream_t)s1), MP_OK);
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, 3 * MiB, (mp_stream_t)s1, &p), MP_OK);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_pool_graph_end(pool, (mp_stream_t)s1), MP_OK);
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, 2);
  peer_t c = {.pool = pool, .bar = &bar};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, capturer, &c), 0);
  pthread_barrier_wait(&bar); /* its capture runs */
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  pthread_barrier_wait(&bar);
  pthread_barrier_wait(&bar); /* its capture ended */
  /* The released range waits for the marker the capture's end recorded on
   * the other thread's stream. Done before the round, so that the round's
   * two allocations choose among the same free blocks: with the marker
   * still running at the first and done at the second, the second took
   * the range and the test read that as the first block not reused (7 of
   * 240 runs under load). */
  cr_assert_eq(cuCtxSynchronize(), CUDA_SUCCESS);
  round_on(pool, s1, &after);
  pthread_barrier_wait(&bar);
  pthread_join(t, NULL);
  pthread_barrier_destroy(&bar);
  expect_undisturbed(&before, "before the capture");
  expect_undisturbed(&after, "after a release during the capture");
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_forget(dev, (mp_stream_t)s1), MP_OK);
  cr_assert_eq(cuStreamDestroy(s1), CUDA_SUCCESS);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  leave_ctx();
  mp_device_close(dev);
}
