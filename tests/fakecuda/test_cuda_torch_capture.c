/* test_cuda_torch_capture.c - the PyTorch entry points on the cuda backend
 * (the strict fake; a GPU twin on a real driver): a graph captured with
 * only malloc and free hooked (what Python's CUDAPluggableAllocator sets)
 * gets its memory from a graph pool without invalidating the global-mode
 * capture, keeps it from everyone else until mp_torch_reset, and every
 * device gets its own pool. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>
#include <mempool/mempool.h>

#include "fakecuda_test.h"

#define MiB ((size_t)1 << 20)

static long long refusals(void) {
  long long (*count)(CUresult);
  void *sym = fk_test_sym_opt("cuFakeGetErrorCount");
  if (sym == NULL)
    return 0;
  memcpy(&count, &sym, sizeof sym);
  return count(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
}

static void on_cuda(void) {
  setenv("MEMPOOL_DEVICE", "cuda", 1);
  setenv("FAKECUDA_DEVICE_COUNT", "2", 1);
  cr_assert_eq(cuInit(0), CUDA_SUCCESS);
}

static CUcontext on_device(int d) {
  CUcontext c = NULL;
  cr_assert_eq(cuDevicePrimaryCtxRetain(&c, d), CUDA_SUCCESS);
  cr_assert_eq(cuCtxSetCurrent(c), CUDA_SUCCESS);
  return c;
}

static size_t allocated(void) {
  mp_stats_t s;
  cr_assert_eq(mp_pool_get_stats(mp_default_pool(), &s), MP_OK);
  return s.allocated_bytes;
}

/* mp_torch_reset until the default pool holds nothing (at most 30 s): a
 * real driver tells that a graph is gone from a thread of its own, a
 * while after it is destroyed. */
static void reset_until_released(void) {
  for (int i = 0; i < 3000; i++) {
    mp_torch_reset();
    if (allocated() == 0)
      return;
    usleep(10000);
  }
}

TestSuite(cuda_torch_capture, .init = on_cuda);

Test(cuda_torch_capture, a_capture_with_only_malloc_and_free_hooked_succeeds) {
  on_device(0);
  CUstream s;
  cr_assert_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  mp_stream_t ms = (mp_stream_t)s;
  void *warm = mp_torch_malloc(MiB, 0, ms),
       *side = mp_torch_malloc(MiB, 0, NULL);
  cr_assert_not_null(warm, "%s", mp_last_error());
  mp_torch_free(warm, MiB, 0, ms);
  long long refused = refusals();
  cr_assert_eq(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL),
               CUDA_SUCCESS);
  void *a = mp_torch_malloc(MiB, 0, ms);
  cr_assert_not_null(a, "%s", mp_last_error());
  cr_assert_eq(cuMemsetD8Async((CUdeviceptr)a, 3, MiB, s), CUDA_SUCCESS);
  mp_torch_free(a, MiB, 0, ms);
  void *b = mp_torch_malloc(MiB, 0, ms);
  cr_expect_eq(b, a, "reused inside the capture, on its stream");
  cr_assert_eq(cuMemsetD8Async((CUdeviceptr)b, 9, MiB, s), CUDA_SUCCESS);
  mp_torch_free(side, MiB, 0, NULL); /* another stream, meanwhile */
  CUgraph g = NULL;
  cr_assert_eq(cuStreamEndCapture(s, &g), CUDA_SUCCESS,
               "the pool invalidated the capture");
  cr_expect_eq(refusals(), refused);
  /* After the capture, the graph's memory is nobody else's; the first
   * call, on any stream, sees the capture has ended. */
  void *d = mp_torch_malloc(MiB, 0, NULL);
  cr_expect_null(mp_pool_graph_of(mp_default_pool(), ms), "route not ended");
  void *c = mp_torch_malloc(MiB, 0, ms);
  cr_expect(c != a && d != a, "graph memory reused outside the capture");
  CUgraphExec x;
  cr_assert_eq(cuGraphInstantiate(&x, g, 0), CUDA_SUCCESS);
  cr_assert_eq(cuGraphLaunch(x, s), CUDA_SUCCESS);
  cr_assert_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
  unsigned char h = 0;
  cr_assert_eq(cuMemcpyDtoH(&h, (CUdeviceptr)b, 1), CUDA_SUCCESS);
  cr_expect_eq(h, 9, "the replay wrote the captured address");
  cr_assert_eq(cuGraphExecDestroy(x), CUDA_SUCCESS);
  cr_assert_eq(cuGraphDestroy(g), CUDA_SUCCESS);
  mp_torch_free(b, MiB, 0, ms);
  mp_torch_free(c, MiB, 0, ms);
  mp_torch_free(d, MiB, 0, NULL);
  cr_expect_gt(allocated(), 0, "the graph pool's range stays lent");
  reset_until_released();
  cr_expect_eq(allocated(), 0, "released at reset");
  cr_expect_eq(mp_pool_check(mp_default_pool()), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_forget(mp_pool_device(mp_default_pool()), ms), MP_OK);
  cr_assert_eq(cuStreamDestroy(s), CUDA_SUCCESS);
}

/* A refused mp_torch_begin_allocate_to_pool (NULL filter) changes nothing:
 * it switched automatic routing off for the process anyway, so a capture
 * with only malloc and free hooked took the pool's own memory, which the
 * next allocation outside the capture was handed while replays still
 * wrote it. */
Test(cuda_torch_capture, a_refused_begin_leaves_automatic_routing_on) {
  on_device(0);
  CUstream s;
  cr_assert_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  mp_stream_t ms = (mp_stream_t)s;
  void *warm = mp_torch_malloc(MiB, 0, ms);
  cr_assert_not_null(warm, "%s", mp_last_error());
  mp_torch_free(warm, MiB, 0, ms);
  mp_torch_begin_allocate_to_pool(0, (mp_torch_pool_id_t){1, 2}, NULL, NULL,
                                  NULL);
  cr_assert(strstr(mp_last_error(), "filter is NULL") != NULL, "%s",
            mp_last_error());
  cr_assert_eq(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL),
               CUDA_SUCCESS);
  void *a = mp_torch_malloc(MiB, 0, ms);
  cr_assert_not_null(a, "%s", mp_last_error());
  cr_expect_not_null(mp_pool_graph_of(mp_default_pool(), ms),
                     "the capture's allocation was not routed");
  mp_torch_free(a, MiB, 0, ms);
  CUgraph g = NULL;
  cr_assert_eq(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
  void *d = mp_torch_malloc(MiB, 0, NULL);
  cr_expect(d != a, "graph memory reused outside the capture");
  mp_torch_free(d, MiB, 0, NULL);
  cr_assert_eq(cuGraphDestroy(g), CUDA_SUCCESS);
  reset_until_released();
  cr_expect_eq(allocated(), 0, "released at reset");
  cr_assert_eq(mp_stream_forget(mp_pool_device(mp_default_pool()), ms), MP_OK);
  cr_assert_eq(cuStreamDestroy(s), CUDA_SUCCESS);
}

Test(cuda_torch_capture, each_device_gets_its_own_pool) {
  int n = 0;
  cr_assert_eq(cuDeviceGetCount(&n), CUDA_SUCCESS);
  if (n < 2)
    cr_skip_test("one device only (a GPU twin on a one-GPU machine)");
  on_device(0);
  void *p = mp_torch_malloc(MiB, 1, NULL);
  cr_assert_not_null(p, "%s", mp_last_error());
  cr_expect_eq(allocated(), 0, "device 0's pool did not serve it");
  on_device(1);
  cr_expect_geq(allocated(), MiB, "device 1's pool did");
  on_device(0);
  mp_torch_free(p, MiB, 1, NULL);
  on_device(1);
  cr_expect_eq(allocated(), 0);
  cr_expect_null(mp_torch_malloc(MiB, 9, NULL), "no device 9");
}

/* Another thread's call while this thread captures on its per-thread
 * default stream (CU_STREAM_PER_THREAD: one handle, a stream per thread). */
static void *alloc_on_own_per_thread_stream(void *p) {
  CUcontext c = p;
  cr_assert_eq(cuCtxSetCurrent(c), CUDA_SUCCESS);
  mp_stream_t pt = (mp_stream_t)CU_STREAM_PER_THREAD;
  void *x = mp_torch_malloc(MiB, 0, pt);
  cr_assert_not_null(x, "%s", mp_last_error());
  mp_torch_free(x, MiB, 0, pt);
  cr_assert_eq(cuStreamSynchronize(CU_STREAM_PER_THREAD), CUDA_SUCCESS);
  return NULL;
}

/* On the calling thread's per-thread stream: a warm-up block allocated and
 * freed, the stream synchronized, a thread-local capture begun and one
 * 1 MiB block allocated in it (returned). */
static void *warm_then_capture_one(void) {
  mp_stream_t pt = (mp_stream_t)CU_STREAM_PER_THREAD;
  void *warm = mp_torch_malloc(MiB, 0, pt);
  cr_assert_not_null(warm, "%s", mp_last_error());
  mp_torch_free(warm, MiB, 0, pt);
  cr_assert_eq(cuStreamSynchronize(CU_STREAM_PER_THREAD), CUDA_SUCCESS);
  cr_assert_eq(cuStreamBeginCapture(CU_STREAM_PER_THREAD,
                                    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
               CUDA_SUCCESS);
  void *a = mp_torch_malloc(MiB, 0, pt);
  cr_assert_not_null(a, "%s", mp_last_error());
  return a;
}

/* The automatic capture asked whether its stream was still captured from
 * whichever thread called: for the per-thread handle another thread asked
 * about its own stream, found it not captured, and ended the capture's
 * entry from there, where mp_pool_graph_end names that thread's stream and
 * refuses. The route stayed behind: after the capture the capturing
 * thread's stream still allocated to the graph pool, and mp_torch_reset
 * could not release it. */
Test(cuda_torch_capture,
     another_thread_does_not_end_a_per_thread_streams_capture) {
  CUcontext ctx = on_device(0);
  mp_stream_t pt = (mp_stream_t)CU_STREAM_PER_THREAD;
  mp_pool_t *pool = mp_default_pool();
  void *a = warm_then_capture_one();
  mp_pool_t *g = mp_pool_graph_of(pool, pt);
  cr_assert_not_null(g, "the capture is not routed to a graph pool");
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, alloc_on_own_per_thread_stream, ctx),
               0);
  pthread_join(t, NULL);
  void *b = mp_torch_malloc(MiB, 0, pt);
  cr_assert_not_null(b, "%s", mp_last_error());
  mp_torch_free(a, MiB, 0, pt);
  mp_torch_free(b, MiB, 0, pt);
  CUgraph graph = NULL;
  cr_assert_eq(cuStreamEndCapture(CU_STREAM_PER_THREAD, &graph), CUDA_SUCCESS,
               "the pool invalidated the capture");
  /* The capturing thread's next call sees the capture has ended. */
  void *c = mp_torch_malloc(MiB, 0, pt);
  cr_assert_not_null(c, "%s", mp_last_error());
  cr_expect_null(mp_pool_graph_of(pool, pt),
                 "the per-thread stream still allocates to a graph pool");
  mp_torch_free(c, MiB, 0, pt);
  cr_assert_eq(cuStreamSynchronize(CU_STREAM_PER_THREAD), CUDA_SUCCESS);
  if (graph != NULL)
    cr_assert_eq(cuGraphDestroy(graph), CUDA_SUCCESS);
  reset_until_released();
  cr_expect_eq(allocated(), 0, "the graph pool was not released at reset");
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
}

static int accept_all(mp_stream_t s, void *ctx) {
  (void)s;
  (void)ctx;
  return 1;
}

typedef struct {
  CUcontext ctx;
  pthread_barrier_t *bar;
  mp_pool_t *routed_during, *routed_after;
} pt_hooked_t;

/* Allocates on its own per-thread stream while the begin is open (its
 * stream is routed from here), waits for the end, and tells whether its
 * stream still allocates to the graph pool. */
static void *hooked_per_thread(void *p) {
  pt_hooked_t *h = p;
  cr_assert_eq(cuCtxSetCurrent(h->ctx), CUDA_SUCCESS);
  mp_stream_t pt = (mp_stream_t)CU_STREAM_PER_THREAD;
  void *x = mp_torch_malloc(MiB, 0, pt);
  cr_assert_not_null(x, "%s", mp_last_error());
  h->routed_during = mp_pool_graph_of(mp_default_pool(), pt);
  mp_torch_free(x, MiB, 0, pt);
  pthread_barrier_wait(h->bar); /* the begin is open */
  pthread_barrier_wait(h->bar); /* ended and released */
  h->routed_after = mp_pool_graph_of(mp_default_pool(), pt);
  cr_assert_eq(cuStreamSynchronize(CU_STREAM_PER_THREAD), CUDA_SUCCESS);
  return NULL;
}

/* With the hooks, end_allocate_to_pool ended every route of the pool with
 * mp_pool_graph_end from the calling thread: another thread's per-thread
 * stream, routed from that thread, was not ended (the handle named the
 * caller's stream), so it went on allocating to the graph pool, and the
 * release could not release it. */
Test(cuda_torch_capture, end_allocate_to_pool_ends_another_threads_route) {
  CUcontext ctx = on_device(0);
  pthread_barrier_t bar;
  cr_assert_eq(pthread_barrier_init(&bar, NULL, 2), 0);
  mp_torch_pool_id_t id = {1, 7};
  mp_torch_begin_allocate_to_pool(0, id, accept_all, NULL, NULL);
  pt_hooked_t h = {.ctx = ctx, .bar = &bar};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, hooked_per_thread, &h), 0);
  pthread_barrier_wait(&bar);
  mp_torch_end_allocate_to_pool(0, id);
  mp_torch_release_pool(0, id);
  pthread_barrier_wait(&bar);
  pthread_join(t, NULL);
  pthread_barrier_destroy(&bar);
  cr_expect_not_null(h.routed_during, "the thread's stream was not routed");
  cr_expect_null(h.routed_after,
                 "the thread's stream still allocates to a graph pool");
  cr_expect_eq(allocated(), 0, "the graph pool was not released");
  cr_expect_eq(mp_pool_check(mp_default_pool()), MP_OK, "%s", mp_last_error());
}

/* Captures on its own per-thread stream, allocating in the capture, and
 * exits without another call. */
static void *capture_and_exit(void *p) {
  cr_assert_eq(cuCtxSetCurrent((CUcontext)p), CUDA_SUCCESS);
  mp_stream_t pt = (mp_stream_t)CU_STREAM_PER_THREAD;
  void *a = warm_then_capture_one();
  mp_torch_free(a, MiB, 0, pt);
  CUgraph g = NULL;
  cr_assert_eq(cuStreamEndCapture(CU_STREAM_PER_THREAD, &g), CUDA_SUCCESS);
  if (g != NULL)
    cr_assert_eq(cuGraphDestroy(g), CUDA_SUCCESS);
  return NULL;
}

/* Another thread cannot ask whether a per-thread stream still captures;
 * once that stream's thread has exited (its route gone with it), the
 * entry still ends, and mp_torch_reset releases its graph pool. */
Test(cuda_torch_capture, a_capture_of_an_exited_threads_stream_is_released) {
  CUcontext ctx = on_device(0);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, capture_and_exit, ctx), 0);
  pthread_join(t, NULL);
  cr_expect_gt(allocated(), 0, "the graph pool's range is lent");
  reset_until_released();
  cr_expect_eq(allocated(), 0, "the graph pool was not released at reset");
  cr_expect_eq(mp_pool_check(mp_default_pool()), MP_OK, "%s", mp_last_error());
}

/* Captures seen without the hooks each get a private pool, which stays
 * pinned until mp_torch_reset finds its graph gone: more of them than the
 * 64 the table once held. Past 64 the allocation failed (the entry could
 * not be made), where PyTorch's own allocator makes a pool for every
 * capture. */
Test(cuda_torch_capture, eighty_captures_each_get_a_private_pool) {
  on_device(0);
  CUstream s;
  cr_assert_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  mp_stream_t ms = (mp_stream_t)s;
  void *warm = mp_torch_malloc(MiB, 0, ms);
  cr_assert_not_null(warm, "%s", mp_last_error());
  mp_torch_free(warm, MiB, 0, ms);
  cr_assert_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
  for (int i = 0; i < 80; i++) {
    cr_assert_eq(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED),
                 CUDA_SUCCESS);
    void *a = mp_torch_malloc(MiB, 0, ms);
    cr_assert_not_null(a, "capture %d: %s", i, mp_last_error());
    cr_expect_not_null(mp_pool_graph_of(mp_default_pool(), ms),
                       "capture %d allocates outside a graph pool", i);
    mp_torch_free(a, MiB, 0, ms);
    CUgraph g = NULL;
    cr_assert_eq(cuStreamEndCapture(s, &g), CUDA_SUCCESS,
                 "capture %d invalidated", i);
    if (g != NULL)
      cr_assert_eq(cuGraphDestroy(g), CUDA_SUCCESS);
    /* A call after the capture ends its entry; the pool stays pinned. */
    mp_torch_free(mp_torch_malloc(MiB, 0, NULL), MiB, 0, NULL);
  }
  cr_expect_gt(allocated(), 0, "the graph pools' ranges are lent");
  reset_until_released();
  cr_expect_eq(allocated(), 0);
  cr_expect_eq(mp_pool_check(mp_default_pool()), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_forget(mp_pool_device(mp_default_pool()), ms), MP_OK);
  cr_assert_eq(cuStreamDestroy(s), CUDA_SUCCESS);
}

/* On device 0, a new stream the default pool has met: a block allocated
 * and freed on it, the stream synchronized. */
static CUstream warmed_stream(void) {
  on_device(0);
  CUstream s;
  cr_assert_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  void *warm = mp_torch_malloc(MiB, 0, (mp_stream_t)s);
  cr_assert_not_null(warm, "%s", mp_last_error());
  mp_torch_free(warm, MiB, 0, (mp_stream_t)s);
  cr_assert_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
  return s;
}

/* The graph pools released once their graphs are gone, the default pool
 * sound, and s forgotten and destroyed. */
static void all_released_then_destroy(CUstream s) {
  reset_until_released();
  cr_expect_eq(allocated(), 0, "a graph pool was not released at reset");
  cr_expect_eq(mp_pool_check(mp_default_pool()), MP_OK, "%s", mp_last_error());
  cr_assert_eq(
      mp_stream_forget(mp_pool_device(mp_default_pool()), (mp_stream_t)s),
      MP_OK);
  cr_assert_eq(cuStreamDestroy(s), CUDA_SUCCESS);
}

/* A global-mode capture begun on s and its first MiB allocated. */
static void *captured_malloc(CUstream s) {
  cr_assert_eq(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL),
               CUDA_SUCCESS);
  void *a = mp_torch_malloc(MiB, 0, (mp_stream_t)s);
  cr_assert_not_null(a, "%s", mp_last_error());
  return a;
}

/* Two captures back to back on one stream, no call between them: the
 * automatic entry of the first asked only whether its stream still
 * captured, found it did (the second capture), and kept routing it to the
 * first graph's pool. The second capture then reused memory the first had
 * freed, which the first graph's replays still write: the two graphs
 * aliased. Each capture (told by its id) gets its own graph pool. */
Test(cuda_torch_capture, back_to_back_captures_on_one_stream_get_own_pools) {
  CUstream s = warmed_stream();
  mp_stream_t ms = (mp_stream_t)s;
  mp_pool_t *pool = mp_default_pool();
  CUgraph g[2] = {NULL, NULL};
  void *a[2];
  mp_pool_t *gp[2];
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL),
                 CUDA_SUCCESS);
    a[i] = mp_torch_malloc(MiB, 0, ms);
    cr_assert_not_null(a[i], "%s", mp_last_error());
    gp[i] = mp_pool_graph_of(pool, ms);
    cr_assert_eq(cuMemsetD8Async((CUdeviceptr)a[i], 1, MiB, s), CUDA_SUCCESS);
    mp_torch_free(a[i], MiB, 0, ms); /* a temporary of graph i */
    cr_assert_eq(cuStreamEndCapture(s, &g[i]), CUDA_SUCCESS,
                 "capture %d invalidated", i);
  }
  cr_expect_not_null(gp[0]);
  cr_expect_neq(gp[1], gp[0],
                "the second capture allocates to the first's "
                "graph pool");
  cr_expect_neq(a[1], a[0], "the second graph reuses the first's memory");
  /* A call after the captures ends the second's entry. */
  mp_torch_free(mp_torch_malloc(MiB, 0, ms), MiB, 0, ms);
  cr_expect_null(mp_pool_graph_of(pool, ms), "route not ended");
  for (int i = 0; i < 2; i++)
    if (g[i] != NULL)
      cr_assert_eq(cuGraphDestroy(g[i]), CUDA_SUCCESS);
  cr_assert_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
  all_released_then_destroy(s);
}

/* mp_torch_reset (Python's mempool.torch.empty_cache) released the graph
 * pool of every capture that had ended, though its graph could still be
 * replayed: the pool of a graph whose capture freed all it allocated (its
 * results copied into tensors made before it, say) went back to the
 * device's pool at once, the next allocation got that memory, and each
 * replay wrote over it. The pool now goes once the graph and every
 * executable made from it are destroyed. */
Test(cuda_torch_capture, reset_keeps_the_pool_of_a_graph_still_replayable) {
  CUstream s = warmed_stream();
  mp_stream_t ms = (mp_stream_t)s;
  void *a = captured_malloc(s);
  cr_assert_eq(cuMemsetD8Async((CUdeviceptr)a, 7, MiB, s), CUDA_SUCCESS);
  mp_torch_free(a, MiB, 0, ms); /* a temporary of the graph */
  CUgraph g = NULL;
  cr_assert_eq(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
  CUgraphExec x;
  cr_assert_eq(cuGraphInstantiate(&x, g, 0), CUDA_SUCCESS);
  cr_assert_eq(cuGraphDestroy(g), CUDA_SUCCESS);          /* as PyTorch does */
  mp_torch_free(mp_torch_malloc(MiB, 0, ms), MiB, 0, ms); /* ends the route */
  mp_torch_reset();
  cr_expect_gt(allocated(), 0, "the pool of a replayable graph was released");
  void *d = mp_torch_malloc(MiB, 0, NULL);
  cr_assert_not_null(d, "%s", mp_last_error());
  cr_expect_neq(d, a, "memory the graph's replays write was handed out");
  cr_assert_eq(cuMemsetD8Async((CUdeviceptr)d, 1, MiB, NULL), CUDA_SUCCESS);
  cr_assert_eq(cuCtxSynchronize(), CUDA_SUCCESS);
  cr_assert_eq(cuGraphLaunch(x, s), CUDA_SUCCESS);
  cr_assert_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
  unsigned char h = 0;
  cr_assert_eq(cuMemcpyDtoH(&h, (CUdeviceptr)d, 1), CUDA_SUCCESS);
  cr_expect_eq(h, 1, "the replay wrote over a tensor of the program's");
  mp_torch_free(d, MiB, 0, NULL);
  cr_assert_eq(cuGraphExecDestroy(x), CUDA_SUCCESS);
  all_released_then_destroy(s); /* the graph is gone now */
}

/* A capture invalidated after its first allocation (here by a
 * synchronize of its stream; on a GPU by any call CUDA forbids there):
 * cuStreamGetCaptureInfo gives no id for it (cuda.h: valid data only for an
 * active capture), and the automatic entry took the id it read for another
 * capture's, ended its own and made a graph pool for "capture 0", whose
 * graph could not be watched (there is none to hold a user object): that
 * pool and its memory were never released. An invalidated capture's graph
 * is never replayed, so its later allocations are the pool's own. */
Test(cuda_torch_capture, an_invalidated_captures_pool_is_released) {
  CUstream s = warmed_stream();
  mp_stream_t ms = (mp_stream_t)s;
  void *a = captured_malloc(s);
  cr_assert_not_null(mp_pool_graph_of(mp_default_pool(), ms));
  cr_assert_eq(cuStreamSynchronize(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  void *b = mp_torch_malloc(MiB, 0, ms);
  cr_assert_not_null(b, "%s", mp_last_error());
  mp_torch_free(b, MiB, 0, ms);
  mp_torch_free(a, MiB, 0, ms);
  CUgraph g = NULL;
  cr_assert_eq(cuStreamEndCapture(s, &g),
               CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  cr_expect_null(g);
  mp_torch_free(mp_torch_malloc(MiB, 0, ms), MiB, 0, ms); /* ends the route */
  cr_expect_null(mp_pool_graph_of(mp_default_pool(), ms), "route not ended");
  all_released_then_destroy(s);
}

/* A side stream joins s's capture by waiting on an event recorded there
 * (the Programming Guide, "Cross-stream Dependencies and Events"): it is
 * then capturing, with s's capture id (cuStreamGetCaptureInfo), into s's
 * graph. PyTorch's caching allocator picks the private pool of an
 * allocation in a capture by that id, so the side stream's memory comes
 * from the origin's pool, and the graph's replays use it with the rest. */
Test(cuda_torch_capture, a_stream_joined_to_a_capture_allocates_to_its_pool) {
  CUstream s = warmed_stream(), side;
  cr_assert_eq(cuStreamCreate(&side, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  mp_stream_t ms = (mp_stream_t)s, mside = (mp_stream_t)side;
  mp_pool_t *pool = mp_default_pool();
  CUevent fork, back;
  cr_assert_eq(cuEventCreate(&fork, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  cr_assert_eq(cuEventCreate(&back, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  long long refused = refusals();
  void *a = captured_malloc(s);
  cr_assert_eq(cuMemsetD8Async((CUdeviceptr)a, 4, MiB, s), CUDA_SUCCESS);
  cr_assert_eq(cuEventRecord(fork, s), CUDA_SUCCESS);
  cr_assert_eq(cuStreamWaitEvent(side, fork, 0), CUDA_SUCCESS);
  void *b = mp_torch_malloc(MiB, 0, mside);
  cr_assert_not_null(b, "%s", mp_last_error());
  cr_expect_not_null(mp_pool_graph_of(pool, ms));
  cr_expect_eq(mp_pool_graph_of(pool, mside), mp_pool_graph_of(pool, ms),
               "the joined stream got a graph pool of its own");
  cr_assert_eq(cuMemcpyAsync((CUdeviceptr)b, (CUdeviceptr)a, MiB, side),
               CUDA_SUCCESS);
  cr_assert_eq(cuEventRecord(back, side), CUDA_SUCCESS);
  cr_assert_eq(cuStreamWaitEvent(s, back, 0), CUDA_SUCCESS);
  mp_torch_free(a, MiB, 0, ms); /* a temporary of the graph */
  CUgraph g = NULL;
  cr_assert_eq(cuStreamEndCapture(s, &g), CUDA_SUCCESS,
               "the pool broke the capture");
  cr_expect_eq(refusals(), refused);
  mp_torch_free(mp_torch_malloc(MiB, 0, ms), MiB, 0, ms); /* ends the routes */
  cr_expect_null(mp_pool_graph_of(pool, ms), "route not ended");
  cr_expect_null(mp_pool_graph_of(pool, mside), "side route not ended");
  CUgraphExec x;
  cr_assert_eq(cuGraphInstantiate(&x, g, 0), CUDA_SUCCESS);
  cr_assert_eq(cuGraphLaunch(x, s), CUDA_SUCCESS);
  cr_assert_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
  unsigned char h = 0;
  cr_assert_eq(cuMemcpyDtoH(&h, (CUdeviceptr)b + MiB - 1, 1), CUDA_SUCCESS);
  cr_expect_eq(h, 4, "the replay's side-stream copy");
  cr_assert_eq(cuGraphExecDestroy(x), CUDA_SUCCESS);
  cr_assert_eq(cuGraphDestroy(g), CUDA_SUCCESS);
  mp_torch_free(b, MiB, 0, mside);
  cr_assert_eq(cuStreamSynchronize(side), CUDA_SUCCESS);
  cr_assert_eq(mp_stream_forget(mp_pool_device(pool), mside), MP_OK);
  cr_assert_eq(cuStreamDestroy(side), CUDA_SUCCESS);
  cr_assert_eq(cuEventDestroy(fork), CUDA_SUCCESS);
  cr_assert_eq(cuEventDestroy(back), CUDA_SUCCESS);
  all_released_then_destroy(s);
}

/* mp_torch_base_alloc is PyTorch's getBaseAllocation: the device
 * allocation a tensor's storage lies in. Sharing a tensor with another
 * process (torch.multiprocessing, a DataLoader worker's CUDA tensor),
 * PyTorch exports it with cudaIpcGetMemHandle(base) and sends ptr - base
 * as the offset; the receiver opens the handle at the allocation's base
 * and adds the offset. It answered the pool block: inside a plain segment
 * that is no allocation's base, and the driver refuses it (CUDA: "a
 * pointer to the base of an existing device memory allocation"), or,
 * where one takes an interior pointer, exports the whole segment, which
 * the receiver opened at its base plus offset 0: another tensor's
 * memory. */
Test(cuda_torch_capture, base_alloc_is_the_device_allocation_pytorch_shares) {
  setenv("MEMPOOL_CONF", "virtual=0", 1);
  on_device(0);
  char *a = mp_torch_malloc(4096, 0, NULL), *b = mp_torch_malloc(4096, 0, NULL);
  cr_assert(a != NULL && b != NULL, "%s", mp_last_error());
  char *p = a < b ? b : a; /* the higher: not at its segment's start */
  CUdeviceptr rbase = 0;
  size_t rsize = 0;
  cr_assert_eq(cuMemGetAddressRange(&rbase, &rsize, (CUdeviceptr)p + 100),
               CUDA_SUCCESS);
  cr_assert_neq(rbase, (CUdeviceptr)p, "both blocks in one segment");
  size_t size = 0;
  void *base = mp_torch_base_alloc(p + 100, &size);
  cr_expect_eq((CUdeviceptr)base, rbase, "base %p, the allocation's %p", base,
               (void *)rbase);
  cr_expect_eq(size, rsize, "size %zu, the allocation's %zu", size, rsize);
  CUipcMemHandle h;
  cr_expect_eq(cuIpcGetMemHandle(&h, (CUdeviceptr)base), CUDA_SUCCESS,
               "PyTorch's export of the base");
  mp_torch_free(a, 4096, 0, NULL);
  mp_torch_free(b, 4096, 0, NULL);
}
