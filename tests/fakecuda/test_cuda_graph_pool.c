/* Graph-private pools on the strict fake driver: a global-mode capture on
 * one thread, with the pool allocating and freeing on the capturing stream
 * (through a graph pool) and on another thread's streams at the same time,
 * ends with CUDA_SUCCESS; the graph's replays find their memory at the
 * same addresses, nobody else gets it until the graph pool is released,
 * and then the parent does; a capture borrows no memory that work queued
 * before it still uses. Run on a real GPU too (gpu_cuda_graph_pool). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "../support/stream_gate.h"
#include "fakecuda_test.h"

#define MiB  ((size_t)1 << 20)
#define NCAP 16

static long long refusals(void) {
  long long (*count)(CUresult);
  void *sym = fk_test_sym_opt("cuFakeGetErrorCount");
  if (sym == NULL)
    return 0; /* a real driver: the capture's own status stands alone */
  memcpy(&count, &sym, sizeof sym);
  return count(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
}

static CUcontext enter_ctx(void) {
  CUcontext c;
  cr_assert_eq(cuInit(0), CUDA_SUCCESS);
  cr_assert_eq(cuDevicePrimaryCtxRetain(&c, 0), CUDA_SUCCESS);
  cr_assert_eq(cuCtxPushCurrent(c), CUDA_SUCCESS);
  return c;
}

static void leave_ctx(void) {
  cr_assert_eq(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
  cr_assert_eq(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
}

/* The other thread: allocates and frees on two streams of its own (record
 * stream, frees after all streams) while the capture runs. The capture
 * publishes each block it is handed (held, held_sz; nheld counts them): one
 * of them belongs to the graph pool from then on, freed in the capture or
 * not, until the pool is released. So a block the other thread holds may
 * overlap none of those handed out by then. (Only those: a range the other
 * thread held and freed before may later be lent to the graph pool, once
 * its work is done.) */
typedef struct {
  mp_pool_t *pool;
  atomic_int stop;
  mp_status_t st;
  void *const *held;
  const size_t *held_sz;
  atomic_int *nheld;
  void *clash; /* the first block of the other thread that overlapped */
  int nclash, nchecked;
} beside_t;

/* Does [p, p + bytes) overlap one of the n blocks ptrs[i], sizes[i]? */
static bool overlaps(void *p, size_t bytes, void *const *ptrs,
                     const size_t *sizes, int n) {
  for (int i = 0; i < n; i++)
    if ((uintptr_t)p < (uintptr_t)ptrs[i] + sizes[i] &&
        (uintptr_t)ptrs[i] < (uintptr_t)p + bytes)
      return true;
  return false;
}

/* x, held by the other thread now: does it overlap a block the capture was
 * handed before this moment? */
/* The capture was handed p (bytes long): the other thread may see it. */
static void publish(void **held, size_t *held_sz, atomic_int *nheld, void *p,
                    size_t bytes) {
  int n = atomic_load_explicit(nheld, memory_order_relaxed);
  held[n] = p;
  held_sz[n] = bytes;
  atomic_store_explicit(nheld, n + 1, memory_order_release);
}

static void check_held(beside_t *b, void *x, size_t bytes) {
  int k = atomic_load_explicit(b->nheld, memory_order_acquire);
  b->nchecked++;
  if (overlaps(x, bytes, b->held, b->held_sz, k) && b->nclash++ == 0)
    b->clash = x;
}

static void *work_beside(void *p) {
  beside_t *b = p;
  enter_ctx();
  CUstream s[2];
  for (int i = 0; i < 2; i++)
    cr_assert_eq(cuStreamCreate(&s[i], CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  b->st = MP_OK;
  for (int i = 0; b->st == MP_OK && (i < 64 || !atomic_load(&b->stop)); i++) {
    void *x = NULL, *y = NULL;
    mp_stream_t on = (mp_stream_t)s[i % 2];
    size_t xb = (64u << 10) << (i % 6);
    b->st = mp_pool_alloc(b->pool, xb, on, &x);
    if (b->st == MP_OK)
      b->st = mp_pool_alloc(b->pool, MiB, on, &y);
    if (b->st == MP_OK) {
      check_held(b, x, xb);
      check_held(b, y, MiB);
    }
    if (b->st == MP_OK)
      b->st = mp_pool_record_stream(b->pool, x, (mp_stream_t)s[(i + 1) % 2]);
    if (b->st == MP_OK)
      b->st = mp_pool_free(b->pool, x);
    if (b->st == MP_OK)
      b->st = mp_pool_free_after_all(b->pool, y);
  }
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(cuStreamSynchronize(s[i]), CUDA_SUCCESS);
    /* Forgotten while valid (mp_stream_forget): the graph's release later
     * frees blocks these streams used, and asking a destroyed handle
     * crashed an H200 (cuStreamIsCapturing, 2026-11-28). */
    cr_assert_eq(mp_stream_forget(mp_pool_device(b->pool), (mp_stream_t)s[i]),
                 MP_OK);
    cr_assert_eq(cuStreamDestroy(s[i]), CUDA_SUCCESS);
  }
  leave_ctx();
  return NULL;
}

/* A pool on the cuda device (*dev), the primary context made current. */
static mp_pool_t *pool_in_ctx(mp_device_t **dev) {
  mp_pool_t *pool = NULL;
  *dev = open_dev("cuda");
  cr_assert_eq(mp_pool_create(*dev, NULL, &pool), MP_OK, "%s", mp_last_error());
  enter_ctx();
  return pool;
}

Test(cuda_graph_pool,
     global_capture_with_the_pool_on_its_stream_and_another_thread_succeeds) {
  mp_device_t *dev = NULL;
  mp_pool_t *pool = pool_in_ctx(&dev), *g = NULL;
  CUstream cap;
  cr_assert_eq(cuStreamCreate(&cap, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  /* Warm-up on the stream (PyTorch's warm-up iterations): the parent then
   * holds free blocks whose epochs on cap are still open. */
  void *warm[4];
  for (int i = 0; i < 4; i++)
    cr_assert_eq(mp_pool_alloc(pool, MiB << i, (mp_stream_t)cap, &warm[i]),
                 MP_OK);
  for (int i = 0; i < 4; i++)
    cr_assert_eq(mp_pool_free(pool, warm[i]), MP_OK);

  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, g, (mp_stream_t)cap), MP_OK);
  /* What the capture is handed, published to the other thread. */
  void *held[NCAP + 1];
  size_t held_sz[NCAP + 1];
  atomic_int nheld = 0;
  beside_t b = {
      .pool = pool, .held = held, .held_sz = held_sz, .nheld = &nheld};
  pthread_t t;
  long long refused = refusals();
  cr_assert_eq(cuStreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_GLOBAL),
               CUDA_SUCCESS);
  cr_assert_eq(pthread_create(&t, NULL, work_beside, &b), 0);
  /* The "decode step": temporaries allocated, written and freed on the
   * capturing stream, one output kept. */
  void *out = NULL, *ptrs[NCAP];
  size_t sizes[NCAP];
  mp_status_t st = mp_pool_alloc(pool, 4096, (mp_stream_t)cap, &out);
  if (st == MP_OK)
    publish(held, held_sz, &nheld, out, 4096);
  CUresult r = CUDA_SUCCESS;
  for (int i = 0; i < NCAP && st == MP_OK && r == CUDA_SUCCESS; i++) {
    sizes[i] = (256u << 10) << (i % 4);
    st = mp_pool_alloc(pool, sizes[i], (mp_stream_t)cap, &ptrs[i]);
    if (st == MP_OK)
      publish(held, held_sz, &nheld, ptrs[i], sizes[i]);
    if (st == MP_OK)
      r = cuMemsetD8Async((CUdeviceptr)ptrs[i], (unsigned char)i, sizes[i],
                          cap);
    if (st == MP_OK && i % 2 == 1)
      st = mp_pool_free(pool, ptrs[i - 1]);
  }
  if (st == MP_OK && r == CUDA_SUCCESS)
    r = cuMemsetD8Async((CUdeviceptr)out, 42, 4096, cap);
  usleep(20000); /* let the other thread work during the capture */
  CUgraph graph = NULL;
  CUresult end = cuStreamEndCapture(cap, &graph);
  cr_assert_eq(mp_pool_graph_end(pool, (mp_stream_t)cap), MP_OK);
  atomic_store(&b.stop, 1);
  pthread_join(t, NULL);
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  cr_assert_eq(r, CUDA_SUCCESS);
  cr_assert_eq(b.st, MP_OK, "the other thread: %s", mp_last_error());
  cr_assert_eq(end, CUDA_SUCCESS, "the pool invalidated the capture");
  cr_assert_eq(refusals(), refused, "an unsafe call during the capture");

  /* Nobody outside the capture got its memory, during it or after it. */
  mp_stats_t gs;
  cr_assert_eq(mp_pool_get_stats(g, &gs), MP_OK);
  cr_expect_gt(gs.reserved_bytes, 0);
  cr_expect_gt(b.nchecked, 0);
  cr_expect_eq(b.nclash, 0,
               "%d blocks given to the other thread overlapped the "
               "capture's (the first at %p)",
               b.nclash, b.clash);
  for (int i = 0; i < 8; i++) {
    void *p;
    cr_assert_eq(
        mp_pool_alloc(pool, (256u << 10) << (i % 4), (mp_stream_t)cap, &p),
        MP_OK);
    cr_expect_not(overlaps(p, (256u << 10) << (i % 4), held, held_sz,
                           atomic_load(&nheld)),
                  "graph memory %p reused outside the capture", p);
    cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  }

  /* Replays write the same addresses. */
  CUgraphExec x;
  cr_assert_eq(cuMemsetD8((CUdeviceptr)out, 0, 4096), CUDA_SUCCESS);
  cr_assert_eq(cuGraphInstantiate(&x, graph, 0), CUDA_SUCCESS);
  unsigned char host[4096];
  for (int k = 0; k < 2; k++) {
    cr_assert_eq(cuGraphLaunch(x, cap), CUDA_SUCCESS);
    cr_assert_eq(cuStreamSynchronize(cap), CUDA_SUCCESS);
    cr_assert_eq(cuMemcpyDtoH(host, (CUdeviceptr)out, sizeof host),
                 CUDA_SUCCESS);
    cr_expect_eq(host[0], 42);
    cr_expect_eq(host[4095], 42);
  }
  cr_expect_eq(mp_pool_check(g), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());

  /* The graph goes: its memory returns to the parent, reserved there. */
  cr_assert_eq(cuGraphExecDestroy(x), CUDA_SUCCESS);
  cr_assert_eq(cuGraphDestroy(graph), CUDA_SUCCESS);
  for (int i = 1; i < NCAP; i += 2)
    cr_assert_eq(mp_pool_free(pool, ptrs[i]), MP_OK);
  cr_assert_eq(mp_pool_free(pool, out), MP_OK);
  mp_stats_t before, after;
  cr_assert_eq(mp_pool_get_stats(pool, &before), MP_OK);
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_get_stats(pool, &after), MP_OK);
  cr_expect_eq(after.reserved_bytes, before.reserved_bytes);
  cr_expect_eq(after.allocated_bytes, 0);
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_forget(dev, (mp_stream_t)cap), MP_OK);
  cr_assert_eq(cuStreamDestroy(cap), CUDA_SUCCESS);
  leave_ctx();
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

/* Another thread's allocation on its own CU_STREAM_PER_THREAD while this
 * thread's per-thread stream allocates to a graph pool: what it got, and
 * whether the graph pool still holds nothing live but the capture's. */
typedef struct {
  mp_pool_t *pool, *g;
  void *got;
  mp_status_t st;
  size_t g_allocated; /* g's allocated bytes once it held its block */
  mp_pool_t *routed;  /* mp_pool_graph_of there */
} pt_beside_t;

static void *alloc_on_own_per_thread_stream(void *p) {
  pt_beside_t *b = p;
  enter_ctx();
  mp_stream_t pt = (mp_stream_t)CU_STREAM_PER_THREAD;
  b->routed = mp_pool_graph_of(b->pool, pt);
  b->st = mp_pool_alloc(b->pool, MiB, pt, &b->got);
  mp_stats_t s;
  if (mp_pool_get_stats(b->g, &s) == MP_OK)
    b->g_allocated = s.allocated_bytes;
  if (b->st == MP_OK)
    b->st = mp_pool_free(b->pool, b->got);
  if (b->st == MP_OK)
    b->st = mp_stream_synchronize(mp_pool_device(b->pool), pt);
  leave_ctx();
  return NULL;
}

/* CU_STREAM_PER_THREAD is one handle but a different stream in every
 * thread. Routing went by the handle alone: once one thread's per-thread
 * stream allocated to a graph pool, every thread's did, outside any
 * capture. Here the graph pool holds a block the first capture freed (its
 * graph lives on and replays may use it); during a second capture sharing
 * the pool, another thread's ordinary allocation on its own per-thread
 * stream was handed that very block. */
Test(cuda_graph_pool,
     another_threads_per_thread_stream_is_not_routed_to_the_graph_pool) {
  mp_device_t *dev = NULL;
  mp_pool_t *pool = pool_in_ctx(&dev), *g = NULL;
  mp_stream_t pt = (mp_stream_t)CU_STREAM_PER_THREAD;
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  /* The first "capture": a temporary the graph uses, freed in it. */
  cr_assert_eq(mp_pool_graph_begin(pool, g, pt), MP_OK, "%s", mp_last_error());
  void *tmp = NULL;
  cr_assert_eq(mp_pool_alloc(pool, MiB, pt, &tmp), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(pool, tmp), MP_OK);
  cr_assert_eq(mp_pool_graph_end(pool, pt), MP_OK, "%s", mp_last_error());
  cr_assert_eq(cuStreamSynchronize(CU_STREAM_PER_THREAD), CUDA_SUCCESS);
  /* A second capture sharing the pool; meanwhile another thread works. */
  cr_assert_eq(mp_pool_graph_begin(pool, g, pt), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_of(pool, pt), g);
  pt_beside_t b = {.pool = pool, .g = g};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, alloc_on_own_per_thread_stream, &b), 0);
  pthread_join(t, NULL);
  cr_assert_eq(mp_pool_graph_end(pool, pt), MP_OK, "%s", mp_last_error());
  cr_expect_eq(b.st, MP_OK, "the other thread: %s", mp_last_error());
  cr_expect_null(b.routed, "the other thread's stream is routed to %p",
                 (void *)b.routed);
  cr_expect_eq(b.g_allocated, 0,
               "the other thread's allocation came from the graph pool");
  cr_expect_neq(b.got, tmp,
                "the other thread got the graph's freed temporary %p", tmp);
  cr_expect_eq(mp_pool_check(g), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  leave_ctx();
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

/* A graph runs after nothing queued before its capture unless it is
 * launched on the capturing stream: a block freed on that stream while
 * work before the capture still used it is reusable on the stream (stream
 * order), but not as a graph's range, which a launch on another stream
 * would use while that work runs. Here the work is a host function held
 * at a gate for the whole capture. */
Test(cuda_graph_pool, a_capture_borrows_no_block_that_work_before_it_uses) {
  mp_device_t *dev = NULL;
  mp_pool_t *pool = pool_in_ctx(&dev), *g = NULL;
  CUstream cap;
  cr_assert_eq(cuStreamCreate(&cap, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  mp_stream_t s = (mp_stream_t)cap;
  gate_t gate;
  gate_init(&gate);
  void *x = NULL, *y = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 4 * MiB, s, &x), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_stream_launch_host(dev, s, gate_wait, &gate), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(pool, x), MP_OK); /* the gated work uses x */
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, g, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(cuStreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_GLOBAL),
               CUDA_SUCCESS);
  mp_status_t st = mp_pool_alloc(pool, 3 * MiB, s, &y);
  char why[256];
  snprintf(why, sizeof why, "%s", st == MP_OK ? "" : mp_last_error());
  CUgraph graph = NULL;
  CUresult end = cuStreamEndCapture(cap, &graph);
  cr_expect_eq(mp_pool_graph_end(pool, s), MP_OK, "%s", mp_last_error());
  gate_open(&gate);
  cr_expect_eq(st, MP_OK, "the capture's allocation: %s", why);
  cr_expect_eq(end, CUDA_SUCCESS, "the capture ended with %d", (int)end);
  cr_expect(st != MP_OK || (uintptr_t)y + 3 * MiB <= (uintptr_t)x ||
                (uintptr_t)x + 4 * MiB <= (uintptr_t)y,
            "the graph borrowed %p, which work before the capture used (%p)", y,
            x);
  if (st == MP_OK)
    cr_expect_eq(mp_pool_free(pool, y), MP_OK, "%s", mp_last_error());
  if (graph != NULL)
    cr_expect_eq(cuGraphDestroy(graph), CUDA_SUCCESS);
  cr_assert_eq(cuStreamSynchronize(cap), CUDA_SUCCESS);
  cr_expect_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_forget(dev, s), MP_OK);
  cr_assert_eq(cuStreamDestroy(cap), CUDA_SUCCESS);
  leave_ctx();
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
  gate_destroy(&gate);
}

/* At the pool's cap, a capture's allocation that only memory freed while
 * work before the capture still uses it can serve waits for that work
 * (core.c's ladder, stream.c's mp__pool_sync_partial) instead of failing,
 * and the global-mode capture still ends with CUDA_SUCCESS: the events
 * recorded and waited for are on the other stream, or (on_captured) the
 * marker recorded on the captured stream before its capture began, waited
 * for by the pool's join stream, never a record on or a query of the
 * captured stream. The work is a host function at a gate that a timer
 * opens 300 ms later. A cap of 12 MiB (a fraction of the device's memory,
 * so that the case runs on a GPU too): an 8 MiB block freed, then 6 MiB
 * asked in the capture. */
static void capture_at_cap_waits(bool on_captured) {
  mp_device_t *dev = NULL;
  mp_pool_t *pool = pool_in_ctx(&dev), *g = NULL;
  size_t total = 0;
  cr_assert_eq(mp_device_mem_info(dev, NULL, &total), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_set_max_fraction(pool, (double)(12 * MiB) / total),
               MP_OK, "%s", mp_last_error());
  CUstream cap, other;
  cr_assert_eq(cuStreamCreate(&cap, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  cr_assert_eq(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  mp_stream_t s = (mp_stream_t)cap, o = (mp_stream_t)other;
  gate_t gate;
  gate_init(&gate);
  void *x = NULL, *y = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 8 * MiB, o, &x), MP_OK, "%s",
               mp_last_error());
  if (on_captured)
    cr_assert_eq(mp_pool_record_stream(pool, x, s), MP_OK, "%s",
                 mp_last_error());
  cr_assert_eq(
      mp_stream_launch_host(dev, on_captured ? s : o, gate_wait, &gate), MP_OK,
      "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, x), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, g, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(cuStreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_GLOBAL),
               CUDA_SUCCESS);
  gate_timer_t timer;
  cr_assert_eq(gate_timer_start(&timer, &gate, 300000), 0);
  mp_status_t st = mp_pool_alloc(pool, 6 * MiB, s, &y);
  bool opened = atomic_load(&timer.opened) == 1;
  char why[256];
  snprintf(why, sizeof why, "%s", st == MP_OK ? "" : mp_last_error());
  CUgraph graph = NULL;
  CUresult end = cuStreamEndCapture(cap, &graph);
  cr_expect_eq(mp_pool_graph_end(pool, s), MP_OK, "%s", mp_last_error());
  gate_timer_join(&timer);
  cr_expect_eq(st, MP_OK, "the capture's allocation: %s", why);
  cr_expect(st != MP_OK || opened,
            "the allocation answered before the work was done");
  cr_expect(st != MP_OK || ((uintptr_t)y >= (uintptr_t)x &&
                            (uintptr_t)y + 6 * MiB <= (uintptr_t)x + 8 * MiB),
            "the graph got %p, not the freed block %p", y, x);
  cr_expect_eq(end, CUDA_SUCCESS, "the capture ended with %d", (int)end);
  if (st == MP_OK)
    cr_expect_eq(mp_pool_free(pool, y), MP_OK, "%s", mp_last_error());
  if (graph != NULL)
    cr_expect_eq(cuGraphDestroy(graph), CUDA_SUCCESS);
  cr_assert_eq(cuStreamSynchronize(cap), CUDA_SUCCESS);
  cr_assert_eq(cuStreamSynchronize(other), CUDA_SUCCESS);
  cr_expect_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_forget(dev, s), MP_OK);
  cr_assert_eq(mp_stream_forget(dev, o), MP_OK);
  cr_assert_eq(cuStreamDestroy(cap), CUDA_SUCCESS);
  cr_assert_eq(cuStreamDestroy(other), CUDA_SUCCESS);
  leave_ctx();
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
  gate_destroy(&gate);
}

Test(cuda_graph_pool, at_the_cap_a_capture_waits_for_another_streams_work,
     .timeout = 120) {
  capture_at_cap_waits(false);
}

Test(cuda_graph_pool, at_the_cap_a_capture_waits_for_its_streams_work_before_it,
     .timeout = 120) {
  capture_at_cap_waits(true);
}
