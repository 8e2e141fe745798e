/* A pool on the cuda backend keeps CUDA's rules on the strict fake driver:
 * what it does for one thread must not break another thread's stream
 * capture, per-thread default streams are kept apart, and a destroyed
 * stream is forgotten: no event is ever recorded on its dead handle. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>
#include <mempool/host_pool.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "../support/host_pool_alignment.h"
#include "../support/stream_gate.h"
#include "../support/stream_markers.h"
#include "../support/stream_merges.h"
#include "../support/stream_reclaim.h"
#include "../support/stream_reuse.h"
#include "capture_beside.h"
#include "fakecuda_test.h"

/* The driver's entry points these tests call besides capture_beside.h's
 * (capcu). */
static struct {
  CUresult (*launch)(CUstream, CUhostFn, void *);
  CUresult (*event_create)(CUevent *, unsigned), (*event_destroy)(CUevent);
  CUresult (*record)(CUevent, CUstream), (*wait)(CUstream, CUevent, unsigned);
} cu;

static void load_driver(void) {
  capture_load();
  FK_LOAD(cu.launch, "cuLaunchHostFunc");
  FK_LOAD(cu.event_create, "cuEventCreate");
  FK_LOAD(cu.event_destroy, "cuEventDestroy_v2");
  FK_LOAD(cu.record, "cuEventRecord");
  FK_LOAD(cu.wait, "cuStreamWaitEvent");
}

/* Makes device 0's primary context current on this thread. */
static void enter_ctx(void) {
  CUcontext c;
  cr_assert_eq(capcu.retain(&c, 0), CUDA_SUCCESS);
  cr_assert_eq(capcu.push(c), CUDA_SUCCESS);
}

static void leave_ctx(void) {
  cr_assert_eq(capcu.pop(NULL), CUDA_SUCCESS);
  cr_assert_eq(capcu.release(0), CUDA_SUCCESS);
}

/* The application's side of the end of a stream a pool knows
 * (include/mempool/device.h): the pools forget it while it is valid, then
 * it goes. A pool still knowing a destroyed handle uses it (a marker at
 * destroy, a capture check): an H200 crashed in cuEventRecord there
 * (driver 580.159.04, 2026-11-28); the fake driver stops such a test. */
static void stream_end(mp_device_t *dev, CUstream s) {
  cr_assert_eq(mp_stream_forget(dev, (mp_stream_t)s), MP_OK);
  cr_assert_eq(capcu.destroy(s), CUDA_SUCCESS);
}

/* A pool on the cuda device with options opts. */
static mp_pool_t *cuda_pool(mp_device_t *dev, const char *opts) {
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_assert_eq(mp_pool_config_parse(&cfg, opts), MP_OK, "%s", mp_last_error());
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(dev, &cfg, &pool), MP_OK, "%s", mp_last_error());
  return pool;
}

/* ---- another thread's global-mode capture (capture_beside.h) ---------- */

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
  capture_t c;
  capture_start(&c);
  void *p = NULL;
  mp_status_t st = mp_pool_alloc(pool, 32u << 20, NULL, &p);
  capture_finish(&c);
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(dev);
}

/* A virtual pool's growth (cuMemAddressReserve, cuMemCreate, cuMemMap,
 * cuMemSetAccess), its trim (cuMemUnmap, cuMemRelease) and its destroy
 * (cuMemAddressFree) while another thread captures in global mode: each
 * makes, maps or gives back memory outside any stream, potentially unsafe
 * as cudaMalloc (cuda.h, cuThreadExchangeStreamCaptureMode; the fake
 * refuses them there, FK_UNSAFE_VMM), so the backend makes them all in
 * relaxed mode. Failed before: the reservation (and the release of the
 * range at destroy) was made in global mode, refused, and the capture was
 * invalidated. */
Test(cuda_pool_rules, virtual_growth_trim_and_destroy_keep_a_global_capture,
     .init = load_driver) {
  mp_device_t *dev = open_dev("cuda");
  mp_pool_t *pool = cuda_pool(dev, "virtual=1");
  capture_t c;
  capture_start(&c);
  void *p = NULL;
  mp_status_t st = mp_pool_alloc(pool, 32u << 20, NULL, &p);
  mp_status_t fr = st == MP_OK ? mp_pool_free(pool, p) : st;
  mp_status_t trim = fr == MP_OK ? mp_pool_trim(pool, 0) : fr;
  mp_stats_t stats;
  cr_assert_eq(mp_pool_get_stats(pool, &stats), MP_OK);
  mp_status_t destroy = mp_pool_destroy(pool);
  capture_finish(&c);
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  cr_assert_eq(fr, MP_OK, "%s", mp_last_error());
  cr_assert_eq(trim, MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats.reserved_bytes, 0, "the trim kept %zu bytes mapped",
               stats.reserved_bytes);
  cr_assert_eq(destroy, MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

/* Everything the pool does on its streams while another thread captures
 * in global mode: frees that record marker events, reuse that queries
 * them, record_stream, a free after all streams, trim. None of it may be
 * an unsafe call or touch the capture (cuda.h, cuStreamBeginCapture_v2:
 * in global mode "potentially unsafe API calls" from any thread are
 * prohibited). */
Test(cuda_pool_rules, stream_work_keeps_another_threads_global_capture,
     .init = load_driver) {
  mp_device_t *dev = open_dev("cuda");
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(dev, NULL, &pool), MP_OK, "%s", mp_last_error());
  enter_ctx();
  CUstream a, b;
  cr_assert_eq(capcu.create(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  cr_assert_eq(capcu.create(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  void *warm = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 8u << 20, (mp_stream_t)a, &warm), MP_OK);
  cr_assert_eq(mp_pool_free(pool, warm), MP_OK);
  capture_t c;
  capture_start(&c);
  mp_status_t st = MP_OK;
  for (int i = 0; i < 64 && st == MP_OK; i++) {
    void *p = NULL, *q = NULL;
    mp_stream_t s = (mp_stream_t)(i % 2 ? a : b);
    st = mp_pool_alloc(pool, 4096u << (i % 5), s, &p);
    if (st == MP_OK)
      st = mp_pool_alloc(pool, 1u << 20, s, &q);
    if (st == MP_OK)
      st = mp_pool_record_stream(pool, p, (mp_stream_t)(i % 2 ? b : a));
    if (st == MP_OK)
      st = mp_pool_free(pool, p);
    if (st == MP_OK)
      st = mp_pool_free_after_all(pool, q);
  }
  mp_status_t trim = mp_pool_trim(pool, 0);
  capture_finish(&c);
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  cr_assert_eq(trim, MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_check(pool), MP_OK);
  stream_end(dev, a);
  stream_end(dev, b);
  leave_ctx();
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(dev);
}

/* Movable blocks in conf's pool, half of them freed so that every segment
 * is half full: the allocation of a block bigger than any hole runs the
 * out-of-memory ladder down to its defragmentation rung, then the pool is
 * defragmented, frozen, paused and resumed where it can be, and destroyed.
 * Each of those waited for the device with cuCtxSynchronize, which CUDA
 * refuses while another thread captures in global mode (cuda.h,
 * cuStreamBeginCapture_v2: potentially unsafe calls are prohibited; the
 * capture is invalidated). Fails on main: the capture ended
 * CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and cuCtxSynchronize was called. */
static void syncs_beside_a_capture(const char *conf) {
  mp_device_t *dev = open_dev("cuda");
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_assert_eq(mp_pool_config_parse(&cfg, conf), MP_OK, "%s", mp_last_error());
  cfg.max_bytes = 32u << 20;
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(dev, &cfg, &pool), MP_OK, "%s", mp_last_error());
  enter_ctx();
  CUstream s;
  cr_assert_eq(capcu.create(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  enum { N = 32 };
  mp_handle_t *h[N] = {0};
  for (int i = 0; i < N; i++)
    cr_assert_eq(mp_pool_alloc_movable(pool, 1u << 20, (mp_stream_t)s, &h[i]),
                 MP_OK, "%d: %s", i, mp_last_error());
  for (int i = 0; i < N; i += 2) {
    cr_assert_eq(mp_handle_free(h[i]), MP_OK);
    h[i] = NULL;
  }
  if (!fk_is_real())
    fk_reset_calls();
  capture_t c;
  capture_start(&c);
  mp_stats_t before, after;
  cr_assert_eq(mp_pool_get_stats(pool, &before), MP_OK);
  void *big = NULL;
  mp_status_t st = mp_pool_alloc(pool, 8u << 20, (mp_stream_t)s, &big);
  cr_assert_eq(mp_pool_get_stats(pool, &after), MP_OK);
  mp_status_t frag = st == MP_OK ? mp_pool_free(pool, big) : st;
  if (frag == MP_OK)
    frag = mp_pool_defragment(pool, (mp_stream_t)s, NULL);
  if (frag == MP_OK)
    frag = mp_pool_freeze(pool);
  mp_status_t pause = MP_OK;
  if (frag == MP_OK && (cfg.flags & MP_POOL_VIRTUAL)) {
    pause = mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT);
    if (pause == MP_OK)
      pause = mp_pool_resume(pool);
  }
  for (int i = 1; i < N; i += 2)
    cr_assert_eq(mp_handle_free(h[i]), MP_OK);
  mp_status_t destroy = mp_pool_destroy(pool);
  capture_finish(&c);
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  cr_assert_gt(after.defrag_count, before.defrag_count,
               "the ladder never reached its defragmentation rung");
  cr_assert_eq(frag, MP_OK, "%s", mp_last_error());
  cr_assert_eq(pause, MP_OK, "%s", mp_last_error());
  cr_assert_eq(destroy, MP_OK, "%s", mp_last_error());
  if (!fk_is_real())
    cr_assert_eq(fk_calls("cuCtxSynchronize"), 0);
  stream_end(dev, s);
  leave_ctx();
  mp_device_close(dev);
}

Test(cuda_pool_rules, ladder_defragment_freeze_destroy_keep_a_global_capture,
     .init = load_driver) {
  syncs_beside_a_capture("virtual=0,segment_bytes=8M");
}

Test(cuda_pool_rules, virtual_pool_pause_and_ladder_keep_a_global_capture,
     .init = load_driver) {
  syncs_beside_a_capture("virtual=1");
}

/* No whole-device synchronize on the allocation path or in trim: a
 * multi-stream run (record_stream, frees after all streams, reuse across
 * streams, a cap that makes the out-of-memory ladder reclaim) and a trim
 * wait only for the pool's own streams' events. (A plain segment given
 * back goes through cuMemFree, which waits for the context by itself: the
 * driver does that, not the pool.) */
Test(cuda_pool_rules, no_device_synchronize_when_allocating_freeing_or_trimming,
     .init = load_driver) {
  mp_device_t *dev = open_dev("cuda");
  mp_pool_t *pool = NULL;
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cfg.max_bytes = 32u << 20;
  cr_assert_eq(mp_pool_create(dev, &cfg, &pool), MP_OK, "%s", mp_last_error());
  enter_ctx();
  CUstream s[4];
  for (int i = 0; i < 4; i++)
    cr_assert_eq(capcu.create(&s[i], CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  if (!fk_is_real())
    fk_reset_calls();
  void *live[8] = {0};
  long long allocs = 0;
  for (int i = 0; i < 2000; i++) {
    int k = i % 8;
    mp_stream_t on = (mp_stream_t)s[i % 4];
    if (live[k] != NULL) {
      cr_assert_eq(i % 3 ? mp_pool_free(pool, live[k])
                         : mp_pool_free_after_all(pool, live[k]),
                   MP_OK);
      live[k] = NULL;
    }
    size_t bytes = (size_t)(1 + (i * 7919) % 6) << 20;
    mp_status_t st = mp_pool_alloc(pool, bytes, on, &live[k]);
    cr_assert(st == MP_OK || st == MP_ELIMIT, "%d: %s", i, mp_last_error());
    if (st != MP_OK) {
      live[k] = NULL; /* the cap, after the ladder tried */
      continue;
    }
    allocs++;
    if (i % 5 == 0)
      cr_assert_eq(
          mp_pool_record_stream(pool, live[k], (mp_stream_t)s[(i + 1) % 4]),
          MP_OK);
  }
  for (int k = 0; k < 8; k++)
    cr_assert_eq(mp_pool_free(pool, live[k]), MP_OK); /* NULL: MP_OK */
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK);
  if (!fk_is_real())
    cr_assert_eq(fk_calls("cuCtxSynchronize"), 0,
                 "%lld device synchronizations for %lld allocations",
                 fk_calls("cuCtxSynchronize"), allocs);
  mp_stats_t st;
  cr_assert_eq(mp_pool_get_stats(pool, &st), MP_OK);
  cr_assert_eq(st.reserved_bytes, 0, "trim left %zu bytes", st.reserved_bytes);
  cr_assert_gt(st.alloc_retry_count, 0, "the ladder never ran");
  for (int i = 0; i < 4; i++)
    stream_end(dev, s[i]);
  leave_ctx();
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(dev);
}

/* A device pool or a pinned host pool, behind the same two calls. */
typedef struct {
  void *pool;
  mp_status_t (*alloc)(void *pool, size_t bytes, mp_stream_t s, void **out);
  mp_status_t (*free)(void *pool, void *ptr);
} churn_pool_t;

static mp_status_t dev_pool_alloc(void *pool, size_t bytes, mp_stream_t s,
                                  void **out) {
  return mp_pool_alloc(pool, bytes, s, out);
}
static mp_status_t dev_pool_free(void *pool, void *ptr) {
  return mp_pool_free(pool, ptr);
}
static mp_status_t host_pool_alloc(void *pool, size_t bytes, mp_stream_t s,
                                   void **out) {
  return mp_host_pool_alloc(pool, bytes, s, out);
}
static mp_status_t host_pool_free(void *pool, void *ptr) {
  return mp_host_pool_free(pool, ptr);
}

/* A 4 MiB block freed on owed, then a relaxed-mode capture on cap while
 * the pool allocates and frees on other for rounds rounds: the capture must
 * stay valid and nothing be refused. */
static void churn_in(churn_pool_t cp, mp_stream_t owed, CUstream cap,
                     CUstream other, int rounds) {
  void *p = NULL;
  cr_assert_eq(cp.alloc(cp.pool, 4u << 20, owed, &p), MP_OK);
  cr_assert_eq(cp.free(cp.pool, p), MP_OK);
  long long refused = capture_errors(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  cr_assert_eq(capcu.begin(cap, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  mp_status_t st = MP_OK;
  for (int i = 0; i < rounds && st == MP_OK; i++) {
    void *q = NULL;
    st = cp.alloc(cp.pool, (size_t)(1 + i % 4) << 20, (mp_stream_t)other, &q);
    if (st == MP_OK)
      st = cp.free(cp.pool, q);
  }
  CUgraph g = NULL;
  CUresult end = capcu.end(cap, &g);
  if (g != NULL)
    cr_assert_eq(capcu.graph_destroy(g), CUDA_SUCCESS);
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  cr_assert_eq(end, CUDA_SUCCESS, "the pool invalidated the capture");
  cr_assert_eq(capture_errors(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), refused);
}

static void churn_beside_a_capture(mp_pool_t *pool, mp_stream_t owed,
                                   CUstream cap, CUstream other, int rounds) {
  churn_in((churn_pool_t){pool, dev_pool_alloc, dev_pool_free}, owed, cap,
           other, rounds);
}

/* A stream the pool knows starts a capture of the application's own, and
 * the pool is not told (no mp_pool_graph_begin: a stream that joined a
 * capture, say). The release threshold's look at its streams, at frees on
 * another stream, must not ask it: cuStreamQuery is not allowed during
 * capture (cuda.h) and invalidates it. Failed before: the capture ended
 * CUDA_ERROR_STREAM_CAPTURE_INVALIDATED. */
static void unaware_capture_is_not_asked(unsigned flags) {
  mp_device_t *dev = open_dev("cuda");
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cfg.release_threshold = 1;
  cfg.flags |= flags;
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(dev, &cfg, &pool), MP_OK, "%s", mp_last_error());
  enter_ctx();
  CUstream a, b;
  cr_assert_eq(capcu.create(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  cr_assert_eq(capcu.create(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  churn_beside_a_capture(pool, (mp_stream_t)a, a, b, 32); /* a owes a free */
  stream_end(dev, a);
  stream_end(dev, b);
  leave_ctx();
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(dev);
}

Test(cuda_pool_rules, a_capturing_stream_the_pool_was_not_told_of_is_not_asked,
     .init = load_driver) {
  unaware_capture_is_not_asked(0);
}

/* The same with stream waits, where a block a owes a free of is what b
 * would get: the pool must neither record on the captured a nor ask
 * about it (the capture would be invalidated). */
Test(cuda_pool_rules, stream_waits_leave_an_unaware_capture_alone,
     .init = load_driver) {
  unaware_capture_is_not_asked(MP_POOL_STREAM_WAITS);
}

/* Destroying a pool while a stream it knows is captured without its
 * knowledge: the pool must wait for that stream's work before its memory
 * goes, and an event recorded there would be a node of the graph (and
 * waiting for it an unsafe call in global mode, cuda.h,
 * cuStreamBeginCapture_v2). So destroy refuses with MP_EBUSY and changes
 * nothing, as pause does; the capture ends valid, and once it has, destroy
 * goes through. Failed before: destroy recorded its event into the capture
 * and waited for it. */
Test(cuda_pool_rules, destroy_waits_for_no_unaware_capture,
     .init = load_driver) {
  mp_device_t *dev = open_dev("cuda");
  mp_pool_t *pool = cuda_pool(dev, "");
  enter_ctx();
  CUstream a;
  cr_assert_eq(capcu.create(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  void *p = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 4u << 20, (mp_stream_t)a, &p), MP_OK);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, 1u << 20, (mp_stream_t)a, &p), MP_OK);
  mp_stats_t before, after;
  cr_assert_eq(mp_pool_get_stats(pool, &before), MP_OK);
  long long refused = capture_errors(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  cr_assert_eq(capcu.begin(a, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  mp_status_t destroy = mp_pool_destroy(pool);
  CUgraph g = NULL;
  CUresult end = capcu.end(a, &g);
  if (g != NULL)
    cr_assert_eq(capcu.graph_destroy(g), CUDA_SUCCESS);
  cr_assert_eq(destroy, MP_EBUSY, "destroy during an unaware capture: %d",
               destroy);
  cr_assert(strstr(mp_last_error(), "mp_pool_destroy") != NULL, "%s",
            mp_last_error());
  cr_assert_eq(end, CUDA_SUCCESS, "the pool invalidated the capture");
  cr_assert_eq(capture_errors(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED), refused);
  /* Nothing changed: the live block is still the pool's. */
  cr_assert_eq(mp_pool_check(pool), MP_OK);
  cr_assert_eq(mp_pool_get_stats(pool, &after), MP_OK);
  cr_assert_eq(after.live_blocks, before.live_blocks);
  cr_assert_eq(after.reserved_bytes, before.reserved_bytes);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  stream_end(dev, a);
  leave_ctx();
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

typedef struct {
  mp_pool_t *pool;
  mp_status_t st;
} destroy_call_t;

static void destroy_call(void *arg) {
  destroy_call_t *c = arg;
  c->st = mp_pool_destroy(c->pool);
}

/* mp_pool_destroy from a host function, where every driver call is refused
 * (cuda.h, cuLaunchHostFunc: "must not make any CUDA API calls"; the fake
 * answers CUDA_ERROR_NOT_PERMITTED), of a pool of plain segments whose
 * streams were all destroyed and seen done: no stream leaves a wait, yet
 * the cuMemFree to come would be refused, so the destroy must fail first
 * and change nothing. Failed before: MP_OK, the refused frees unheard, the
 * pool gone and its memory lost. Not on a GPU, where the forbidden call
 * may hang. */
Test(cuda_pool_rules,
     destroy_in_a_host_function_keeps_a_pool_whose_streams_went,
     .init = load_driver) {
  if (fk_is_real())
    cr_skip_test("a driver call from a host function may hang a GPU");
  mp_device_t *dev = open_dev("cuda");
  size_t start = free_bytes(dev);
  mp_pool_t *pool = cuda_pool(dev, "virtual=0");
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  void *x = NULL, *y = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 3u << 20, s, &x), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, 5u << 20, s, &y), MP_OK);
  cr_assert_eq(mp_pool_free(pool, y), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  mp_stats_t before, after;
  cr_assert_eq(mp_pool_get_stats(pool, &before), MP_OK);
  cr_assert_gt(before.reserved_bytes, 0);
  long long frees = fk_calls("cuMemFree_v2");
  destroy_call_t c = {.pool = pool, .st = MP_OK};
  run_in_host_fn(dev, destroy_call, &c);
  cr_assert_neq(c.st, MP_OK, "a destroy from a host function succeeded");
  cr_expect_eq(fk_calls("cuMemFree_v2"), frees, "the failed destroy freed");
  cr_assert_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_get_stats(pool, &after), MP_OK);
  cr_expect_eq(after.reserved_bytes, before.reserved_bytes);
  cr_expect_eq(after.live_blocks, before.live_blocks);
  cr_expect_eq(after.device_free_count, before.device_free_count);
  cr_assert_eq(mp_pool_free(pool, x), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(free_bytes(dev), start, "device memory lost");
  mp_device_close(dev);
}

typedef struct {
  mp_pool_t *pool;
  mp_status_t st;
  char msg[512];
} alloc_call_t;

static void alloc_call(void *arg) {
  alloc_call_t *c = arg;
  void *p = NULL;
  c->st = mp_pool_alloc(c->pool, 3u << 20, NULL, &p);
  snprintf(c->msg, sizeof c->msg, "%s", mp_last_error()); /* thread-local */
}

/* An allocation that must grow, from a host function: the driver refuses
 * the call (cuda.h, cuLaunchHostFunc: "Attempting to use a CUDA API may
 * result in CUDA_ERROR_NOT_PERMITTED"), and the pool answers MP_EINVAL, as
 * the host device answers the same call (host.c, host_check_caller): one
 * status for one mistake on every backend. Before: MP_EDRIVER on cuda. Not
 * on a GPU, where the forbidden call may hang. */
Test(cuda_pool_rules, a_growth_in_a_host_function_is_einval_as_on_the_host,
     .init = load_driver) {
  if (fk_is_real())
    cr_skip_test("a driver call from a host function may hang a GPU");
  const char *specs[] = {"cuda", "host"};
  for (size_t i = 0; i < 2; i++) {
    mp_device_t *dev = open_dev(specs[i]);
    mp_pool_t *pool = cuda_pool(dev, "");
    alloc_call_t c = {.pool = pool, .st = MP_OK};
    run_in_host_fn(dev, alloc_call, &c);
    cr_expect_eq(c.st, MP_EINVAL, "%s: %s (%s)", specs[i], mp_status_name(c.st),
                 c.msg);
    cr_expect(strstr(c.msg, i == 0 ? "CUDA_ERROR_NOT_PERMITTED"
                                   : "host function") != NULL,
              "%s: %s", specs[i], c.msg);
    mp_stats_t st;
    cr_assert_eq(mp_pool_get_stats(pool, &st), MP_OK);
    cr_expect_eq(st.reserved_bytes, 0, "%s: the refused growth reserved",
                 specs[i]);
    cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
    mp_device_close(dev);
  }
}

/* While a blocking stream captures, the legacy stream is "in an unusable
 * state" (cuda.h, cuStreamIsCapturing): cuStreamIsCapturing on it answers
 * CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, and a cuStreamQuery of it or an event
 * recorded on it invalidates the capture, in relaxed mode too (an H200,
 * driver 580.159.04, 2026-11-28). A block freed on the legacy stream leaves
 * it with an open epoch; the pool's work on another stream (a new stream,
 * reuse checks, frees) must neither ask it nor mark it until the capture
 * ends. Failed before: the capture was invalidated by the pool's query. */
Test(cuda_pool_rules,
     the_legacy_stream_is_left_alone_while_a_blocking_one_captures,
     .init = load_driver) {
  mp_device_t *dev = open_dev("cuda");
  mp_pool_t *pool = cuda_pool(dev, "");
  enter_ctx();
  CUstream k, o;
  cr_assert_eq(capcu.create(&k, CU_STREAM_DEFAULT), CUDA_SUCCESS);
  cr_assert_eq(capcu.create(&o, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  churn_beside_a_capture(pool, NULL, k, o, 16); /* the legacy stream owes */
  /* Once the capture is over, the legacy stream's block is reusable: no
   * growth for it. */
  void *again = NULL;
  mp_stats_t before, after;
  cr_assert_eq(mp_stream_synchronize(dev, NULL), MP_OK);
  cr_assert_eq(mp_pool_get_stats(pool, &before), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, 4u << 20, (mp_stream_t)o, &again), MP_OK);
  cr_assert_eq(mp_pool_get_stats(pool, &after), MP_OK);
  cr_expect_eq(after.device_alloc_count, before.device_alloc_count);
  cr_expect_eq(after.reserved_bytes, before.reserved_bytes);
  cr_assert_eq(mp_pool_free(pool, again), MP_OK);
  cr_assert_eq(mp_pool_check(pool), MP_OK);
  stream_end(dev, k);
  stream_end(dev, o);
  leave_ctx();
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(dev);
}

/* The pinned host pool keeps the capture rules too: its streams are the
 * cuda device's, so a stream the application captures without telling the
 * pool gets neither a marker nor a query from it. Failed before: the
 * pinned view did not pass the device's capture check on, the pool took
 * every stream as not capturing and recorded its marker into the capture,
 * whose later query invalidated it. */
Test(cuda_pool_rules, a_host_pool_leaves_an_unaware_capture_alone,
     .init = load_driver) {
  mp_device_t *dev = open_dev("cuda");
  mp_host_pool_t *hp = NULL;
  cr_assert_eq(mp_host_pool_create(dev, NULL, &hp), MP_OK, "%s",
               mp_last_error());
  enter_ctx();
  CUstream a, b;
  cr_assert_eq(capcu.create(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  cr_assert_eq(capcu.create(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  churn_in((churn_pool_t){hp, host_pool_alloc, host_pool_free}, (mp_stream_t)a,
           a, b, 16); /* a owes a free */
  cr_assert_eq(mp_host_pool_check(hp), MP_OK);
  cr_assert_eq(mp_host_pool_destroy(hp), MP_OK);
  stream_end(dev, a);
  stream_end(dev, b);
  leave_ctx();
  mp_device_close(dev);
}

/* The host pool aligns blocks to the page on the cuda device too (its
 * chunks are cuMemHostAlloc's, which start on a page): align = 4096 was
 * refused as past the device's 512. */
Test(cuda_pool_rules, a_host_pool_aligns_blocks_to_the_page,
     .init = load_driver) {
  mp_device_t *dev = open_dev("cuda");
  expect_host_pool_page_alignment(dev);
  mp_device_close(dev);
}

/* The same rule for the pool's synchronizations: trim and pause wait for
 * each stream the pool knows by an event, and an event on the legacy stream
 * while a blocking stream captures invalidates that capture (so would the
 * device synchronize they fell back to). They refuse with MP_EBUSY until the
 * capture ends, and work after it. Failed before: the capture ended
 * invalidated. */
Test(cuda_pool_rules,
     no_synchronize_reaches_the_legacy_stream_while_a_blocking_one_captures,
     .init = load_driver) {
  mp_device_t *dev = open_dev("cuda");
  mp_pool_t *pool = cuda_pool(dev, "");
  enter_ctx();
  CUstream k;
  cr_assert_eq(capcu.create(&k, CU_STREAM_DEFAULT), CUDA_SUCCESS);
  void *p = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 4u << 20, NULL, &p), MP_OK);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(capcu.begin(k, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  mp_status_t trim = mp_pool_trim(pool, 0);
  mp_status_t pause = mp_pool_pause(pool, 0);
  CUgraph g = NULL;
  CUresult end = capcu.end(k, &g);
  if (g != NULL)
    cr_assert_eq(capcu.graph_destroy(g), CUDA_SUCCESS);
  cr_assert_eq(end, CUDA_SUCCESS, "the pool invalidated the capture");
  cr_assert_eq(trim, MP_EBUSY);
  cr_assert_eq(pause, MP_EBUSY);
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  mp_stats_t st;
  cr_assert_eq(mp_pool_get_stats(pool, &st), MP_OK);
  cr_assert_eq(st.reserved_bytes, 0);
  stream_end(dev, k);
  leave_ctx();
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(dev);
}

/* 8 MiB allocated on o and freed there, behind work on o that waits for
 * gate (made here). */
static void *gated_free(mp_pool_t *pool, CUstream o, gate_t *gate) {
  void *x = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 8u << 20, (mp_stream_t)o, &x), MP_OK);
  gate_init(gate);
  cr_assert_eq(cu.launch(o, gate_wait, gate), CUDA_SUCCESS);
  cr_assert_eq(mp_pool_free(pool, x), MP_OK);
  return x;
}

/* 8 MiB allocated on s while k captures, then k's capture ended and the
 * gate on the work that uses x opened: the capture must have stayed valid,
 * and the allocation got other memory than x. */
static void alloc_during_capture(mp_pool_t *pool, mp_stream_t s, CUstream k,
                                 void *x, gate_t *gate) {
  void *y = NULL;
  mp_status_t st = mp_pool_alloc(pool, 8u << 20, s, &y);
  CUgraph g = NULL;
  CUresult end = capcu.end(k, &g);
  if (g != NULL)
    cr_assert_eq(capcu.graph_destroy(g), CUDA_SUCCESS);
  gate_open(gate);
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  cr_assert_eq(end, CUDA_SUCCESS, "the pool invalidated the capture");
  cr_expect_neq(y, x, "handed on while o's work used it");
  cr_assert_eq(mp_device_synchronize(mp_pool_device(pool)), MP_OK);
  cr_assert_eq(mp_pool_free(pool, y), MP_OK);
}

/* stream_waits=1: a block o's gated work still uses is not handed to the
 * legacy stream by a wait on o's marker while a blocking stream captures
 * (cuStreamWaitEvent on the legacy stream would invalidate the capture):
 * the allocation takes other memory. Failed before: the capture ended
 * invalidated. */
Test(cuda_pool_rules, stream_waits_leave_the_legacy_stream_alone_in_a_capture,
     .init = load_driver) {
  mp_device_t *dev = open_dev("cuda");
  mp_pool_t *pool = cuda_pool(dev, "stream_waits=1");
  enter_ctx();
  CUstream k, o;
  cr_assert_eq(capcu.create(&k, CU_STREAM_DEFAULT), CUDA_SUCCESS);
  cr_assert_eq(capcu.create(&o, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  void *t = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 1u << 20, NULL, &t), MP_OK);
  cr_assert_eq(mp_pool_free(pool, t), MP_OK); /* the pool knows both */
  gate_t gate;
  void *x = gated_free(pool, o, &gate);
  cr_assert_eq(capcu.begin(k, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  alloc_during_capture(pool, NULL, k, x, &gate);
  stream_end(dev, k);
  stream_end(dev, o);
  gate_destroy(&gate);
  leave_ctx();
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(dev);
}

/* stream_waits=1: a stream that joined k's capture through an event (the
 * Programming Guide, "Cross-stream Dependencies and Events"; the pool is
 * not told) is not made to wait on o's marker for a block o's gated work
 * still uses: a capturing stream may not wait on an event recorded outside
 * its capture (the Guide, "Prohibited and Unhandled Operations";
 * CUDA_ERROR_STREAM_CAPTURE_ISOLATION), which would invalidate k's capture.
 * The allocation takes other memory. */
Test(cuda_pool_rules, stream_waits_leave_a_joined_stream_alone,
     .init = load_driver) {
  mp_device_t *dev = open_dev("cuda");
  mp_pool_t *pool = cuda_pool(dev, "stream_waits=1");
  enter_ctx();
  CUstream k, o, j;
  CUevent fork;
  cr_assert_eq(capcu.create(&k, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  cr_assert_eq(capcu.create(&o, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  cr_assert_eq(capcu.create(&j, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  cr_assert_eq(cu.event_create(&fork, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  void *t = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 1u << 20, (mp_stream_t)j, &t), MP_OK);
  cr_assert_eq(mp_pool_free(pool, t), MP_OK); /* the pool knows j */
  gate_t gate;
  void *x = gated_free(pool, o, &gate);
  cr_assert_eq(capcu.begin(k, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  cr_assert_eq(cu.record(fork, k), CUDA_SUCCESS);
  cr_assert_eq(cu.wait(j, fork, 0), CUDA_SUCCESS);
  alloc_during_capture(pool, (mp_stream_t)j, k, x, &gate);
  stream_end(dev, k);
  stream_end(dev, o);
  stream_end(dev, j);
  cr_assert_eq(cu.event_destroy(fork), CUDA_SUCCESS);
  gate_destroy(&gate);
  leave_ctx();
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(dev);
}

/* A default pool on the cuda device, its context current, and two
 * non-blocking streams; two_close ends them in the application's order. */
typedef struct two {
  mp_device_t *dev;
  mp_pool_t *pool;
  CUstream s1, s2;
} two_t;

static two_t two_open(void) {
  two_t t;
  t.dev = open_dev("cuda");
  t.pool = cuda_pool(t.dev, "");
  enter_ctx();
  cr_assert_eq(capcu.create(&t.s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  cr_assert_eq(capcu.create(&t.s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  return t;
}

static void two_close(two_t *t) {
  stream_end(t->dev, t->s1);
  stream_end(t->dev, t->s2);
  leave_ctx();
  cr_assert_eq(mp_pool_destroy(t->pool), MP_OK);
  mp_device_close(t->dev);
}

/* Blocks freed on a stream the application has synchronized go to another
 * stream at once, with no growth, even where a marker recorded now would
 * stay pending for a while (the pool asks whether the stream is idle
 * instead). On the fake the streams reach their work 20 ms late
 * (FAKECUDA_DEVICE=stream_latency_us=20000, a launch queue far behind);
 * the GPU twin runs it as a GPU does. Failed on the fake before the pool
 * asked (it grew and handed out other blocks). */
Test(cuda_pool_rules, blocks_of_a_synchronized_stream_go_to_another_at_once,
     .init = load_driver) {
  setenv("FAKECUDA_DEVICE", "stream_latency_us=20000", 1);
  two_t t = two_open();
  synced_blocks_go_to_another_stream(t.pool, t.dev, (mp_stream_t)t.s1,
                                     (mp_stream_t)t.s2);
  two_close(&t);
}

/* A free beside a block another stream's work still holds (scenarios:
 * support/stream_merges.h, the host device's in test_pool_stream_merges.c):
 * run on two non-blocking streams of the cuda device. */
typedef void (*merges_fn)(mp_pool_t *, mp_device_t *, gate_t *, mp_stream_t,
                          mp_stream_t);
static void merges_on_cuda(merges_fn fn) {
  two_t t = two_open();
  gate_t gate;
  gate_init(&gate);
  fn(t.pool, t.dev, &gate, (mp_stream_t)t.s1, (mp_stream_t)t.s2);
  gate_open(&gate);
  cr_assert_eq(mp_device_synchronize(t.dev), MP_OK);
  cr_expect_eq(mp_pool_check(t.pool), MP_OK, "%s", mp_last_error());
  two_close(&t);
  gate_destroy(&gate);
}

Test(cuda_pool_rules,
     a_block_freed_beside_another_streams_pending_block_serves_its_stream,
     .init = load_driver) {
  merges_on_cuda(merges_b_serves_its_stream_at_once);
}

Test(cuda_pool_rules, neighbours_kept_apart_join_before_the_pool_grows,
     .init = load_driver) {
  merges_on_cuda(merges_join_before_growth);
}

/* support/stream_reclaim.h (the host device's in test_pool_vm_holes.c),
 * run as the merges are: growth past the peak gives back the chunk an idle
 * stream freed, asking the stream with cuStreamQuery, and keeps the one a
 * stream held behind a host function freed, without waiting for it. On a
 * GPU the twin shows the real driver's answers and its cuMemUnmap. */
static void reclaim_idle(mp_pool_t *p, mp_device_t *dev, gate_t *gate,
                         mp_stream_t s1, mp_stream_t s2) {
  (void)gate;
  reclaim_past_a_chunk_freed_on_another_stream(p, dev, s1, s2, NULL);
}

static void reclaim_busy(mp_pool_t *p, mp_device_t *dev, gate_t *gate,
                         mp_stream_t s1, mp_stream_t s2) {
  reclaim_past_a_chunk_freed_on_another_stream(p, dev, s1, s2, gate);
}

Test(cuda_pool_rules,
     growth_past_the_peak_gives_back_a_chunk_an_idle_stream_freed,
     .init = load_driver) {
  merges_on_cuda(reclaim_idle);
}

Test(cuda_pool_rules, growth_past_the_peak_keeps_a_chunk_a_busy_stream_freed,
     .init = load_driver) {
  merges_on_cuda(reclaim_busy);
}

/* Calls of driver entry points a and b (may be NULL) since *seen was
 * last set; -1 on a real driver. */
static long long calls_since(long long *seen, const char *a, const char *b) {
  if (fk_is_real())
    return -1;
  long long n = fk_calls(a) + (b != NULL ? fk_calls(b) : 0);
  long long d = n - *seen;
  *seen = n;
  return d;
}

static long long markers_recorded(void) {
  static long long seen;
  return calls_since(&seen, "cuEventRecord", NULL);
}

static long long asks_made(void) {
  static long long seen;
  return calls_since(&seen, "cuStreamQuery", "cuEventQuery");
}

/* A scenario on s1 held behind a gate that counts the fake's calls (count:
 * -1 on the GPU twin, which checks the rest), on two non-blocking streams
 * of the cuda device. */
typedef void (*counted_fn)(mp_pool_t *, mp_device_t *, gate_t *, mp_stream_t,
                           mp_stream_t, long long (*)(void));
static void counted_on_cuda(counted_fn fn, long long (*count)(void)) {
  two_t t = two_open();
  gate_t gate;
  gate_init(&gate);
  fn(t.pool, t.dev, &gate, (mp_stream_t)t.s1, (mp_stream_t)t.s2, count);
  cr_expect_eq(mp_pool_check(t.pool), MP_OK, "%s", mp_last_error());
  two_close(&t);
  gate_destroy(&gate);
}

/* Frees on a stream held behind a gate (support/stream_markers.h): 16
 * frees record one marker, not 16 (each was a cuEventRecord), and none of
 * the blocks goes to the other stream before the gate opens. */
Test(cuda_pool_rules, frees_on_a_busy_stream_record_one_marker_and_stay_with_it,
     .init = load_driver) {
  counted_on_cuda(markers_frees_on_a_busy_stream, markers_recorded);
}

/* markers_capture_fn: a relaxed capture of s, begun and ended (its graph
 * destroyed). */
static void capture_relaxed(mp_stream_t s, bool begin) {
  if (begin) {
    cr_assert_eq(capcu.begin((CUstream)s, CU_STREAM_CAPTURE_MODE_RELAXED),
                 CUDA_SUCCESS);
    return;
  }
  CUgraph g = NULL;
  cr_assert_eq(capcu.end((CUstream)s, &g), CUDA_SUCCESS);
  if (g != NULL)
    cr_assert_eq(capcu.graph_destroy(g), CUDA_SUCCESS);
}

/* support/stream_markers.h: blocks freed and finished on s1 before its
 * capture serve s2 during it, with no growth and no call on s1 (the fake
 * refuses a query of or a record on the capturing stream). */
Test(cuda_pool_rules, frees_finished_before_a_capture_serve_another_stream,
     .init = load_driver) {
  two_t t = two_open();
  long long refused = capture_errors(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) +
                      capture_errors(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  markers_frees_before_a_capture(t.pool, t.dev, (mp_stream_t)t.s1,
                                 (mp_stream_t)t.s2, capture_relaxed);
  cr_expect_eq(capture_errors(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) +
                   capture_errors(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED),
               refused, "the pool broke s1's capture");
  cr_expect_eq(mp_pool_check(t.pool), MP_OK, "%s", mp_last_error());
  two_close(&t);
}

/* support/stream_merges.h: a growth beside a pair kept apart looks at the
 * pair once instead of waiting 200 us for it. */
Test(cuda_pool_rules, growth_beside_a_pair_kept_apart_does_not_wait_for_it,
     .init = load_driver) {
  counted_on_cuda(merges_growth_beside_a_pair_does_not_wait_for_it, asks_made);
}

/* A pool of dev with stream_waits=1. */
static mp_pool_t *stream_waits_pool(mp_device_t *dev) {
  mp_pool_t *pool = NULL;
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_assert_eq(mp_pool_config_parse(&cfg, "stream_waits=1"), MP_OK);
  cr_assert_eq(mp_pool_create(dev, &cfg, &pool), MP_OK, "%s", mp_last_error());
  return pool;
}

/* stream_waits=1: the block a's kernel still writes is handed to b at
 * once, and b's copy of it runs after a's write (a cuStreamWaitEvent on
 * the marker the free recorded). a's kernel is a memset queued behind a
 * gated host function; b copies the block into page-locked memory, so the
 * host never touches device memory and the test runs on a GPU too. */
Test(cuda_pool_rules, stream_waits_order_the_reusing_stream_after_the_free,
     .init = load_driver) {
  mp_device_t *dev = open_dev("cuda");
  mp_pool_t *pool = stream_waits_pool(dev);
  enter_ctx();
  CUstream a, b;
  cr_assert_eq(capcu.create(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  cr_assert_eq(capcu.create(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  unsigned char *h = NULL;
  cr_assert_eq(mp_device_host_alloc(dev, 4096, (void **)&h), MP_OK);
  memset(h, 0, 4096);
  void *t = NULL, *x = NULL, *guard = NULL, *y = NULL;
  /* The pool meets b first, so a's free records its marker at once. */
  cr_assert_eq(mp_pool_alloc(pool, 1u << 20, (mp_stream_t)b, &t), MP_OK);
  cr_assert_eq(mp_pool_free(pool, t), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, 8u << 20, (mp_stream_t)a, &x), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, 2u << 20, (mp_stream_t)a, &guard), MP_OK);
  cr_assert_eq(mp_memset_async(dev, x, 1, 4096, (mp_stream_t)a), MP_OK);
  gate_t g;
  gate_init(&g);
  cr_assert_eq(cu.launch(a, gate_wait, &g), CUDA_SUCCESS);
  cr_assert_eq(mp_memset_async(dev, x, 2, 4096, (mp_stream_t)a), MP_OK);
  cr_assert_eq(mp_pool_free(pool, x), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, 8u << 20, (mp_stream_t)b, &y), MP_OK);
  cr_expect_eq(y, x, "the block a still writes was passed over");
  cr_assert_eq(mp_memcpy_async(dev, h, y, 4096, (mp_stream_t)b), MP_OK);
  /* The host opens the gate after giving b time to run: b's wait is what
   * orders it. (A third stream's host function opened it at first, and
   * hung on an H200, 2026-11-28: the driver runs host functions one at a
   * time, and the gate's own host function held that one.) */
  usleep(50000);
  gate_open(&g);
  cr_assert_eq(mp_stream_synchronize(dev, (mp_stream_t)b), MP_OK);
  cr_expect_eq(h[0], 2, "b read the block before a's write");
  cr_expect_eq(h[4095], 2);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_assert_eq(mp_pool_free(pool, y), MP_OK);
  cr_assert_eq(mp_pool_free(pool, guard), MP_OK);
  stream_end(dev, a);
  stream_end(dev, b);
  mp_device_host_free(dev, h);
  gate_destroy(&g);
  leave_ctx();
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(dev);
}

/* stream_waits=1 with neighbours freed on five streams (more than a block
 * record names): they merge through the pool's join stream, b gets the
 * joined block at once, and b's copy of it sees every stream's last write
 * (each queued behind one gate; the host opens the gate). */
Test(cuda_pool_rules, stream_waits_join_more_streams_than_a_record_names,
     .init = load_driver) {
  enum { NS = 5, BLK = 2u << 20 };
  mp_device_t *dev = open_dev("cuda");
  mp_pool_t *pool = stream_waits_pool(dev);
  enter_ctx();
  CUstream s[NS], b;
  void *x[NS], *t, *guard, *y;
  cr_assert_eq(capcu.create(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  for (int i = 0; i < NS; i++) {
    cr_assert_eq(capcu.create(&s[i], CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    cr_assert_eq(mp_pool_alloc(pool, 4096, (mp_stream_t)s[i], &t), MP_OK);
    cr_assert_eq(mp_pool_free(pool, t), MP_OK);
  }
  cr_assert_eq(mp_pool_alloc(pool, 4096, (mp_stream_t)b, &t), MP_OK);
  cr_assert_eq(mp_pool_free(pool, t), MP_OK);
  for (int i = 0; i < NS; i++)
    cr_assert_eq(mp_pool_alloc(pool, BLK, (mp_stream_t)s[i], &x[i]), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, BLK, (mp_stream_t)b, &guard), MP_OK);
  gate_t g;
  gate_init(&g);
  for (int i = 0; i < NS; i++) {
    cr_assert_eq((char *)x[i], (char *)x[0] + (size_t)i * BLK);
    cr_assert_eq(mp_memset_async(dev, x[i], 1, 4096, (mp_stream_t)s[i]), MP_OK);
    cr_assert_eq(cu.launch(s[i], gate_wait, &g), CUDA_SUCCESS);
    cr_assert_eq(mp_memset_async(dev, x[i], 2, 4096, (mp_stream_t)s[i]), MP_OK);
    cr_assert_eq(mp_pool_free(pool, x[i]), MP_OK);
  }
  cr_assert_eq(mp_pool_alloc(pool, NS * BLK, (mp_stream_t)b, &y), MP_OK);
  cr_expect_eq(y, x[0], "the neighbours were left apart");
  unsigned char *h = NULL;
  cr_assert_eq(mp_device_host_alloc(dev, NS * 4096, (void **)&h), MP_OK);
  memset(h, 0, NS * 4096);
  for (int i = 0; i < NS; i++)
    cr_assert_eq(mp_memcpy_async(dev, h + i * 4096, (char *)y + (size_t)i * BLK,
                                 4096, (mp_stream_t)b),
                 MP_OK);
  usleep(50000);
  gate_open(&g); /* from the host: see the test above */
  cr_assert_eq(mp_stream_synchronize(dev, (mp_stream_t)b), MP_OK);
  for (int i = 0; i < NS; i++)
    cr_expect_eq(h[i * 4096], 2, "b read block %d before its write", i);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_assert_eq(mp_pool_free(pool, y), MP_OK);
  cr_assert_eq(mp_pool_free(pool, guard), MP_OK);
  mp_device_host_free(dev, h);
  gate_destroy(&g);
  for (int i = 0; i < NS; i++)
    stream_end(dev, s[i]);
  stream_end(dev, b);
  leave_ctx();
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(dev);
}

/* ---- per-thread streams ------------------------------------------------- */

static void slow_start(void *unused) {
  (void)unused;
  usleep(150000);
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
 * overwrite at once. The "kernel" starts late (a host function that
 * sleeps) and reads the block into page-locked memory, so the host never
 * touches device memory and the test runs on a GPU too. */
Test(cuda_pool_rules, per_thread_streams_of_two_threads_are_kept_apart,
     .init = load_driver) {
  mp_device_t *dev = open_dev("cuda");
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(dev, NULL, &pool), MP_OK);
  enter_ctx();
  mp_stream_t pt = (mp_stream_t)CU_STREAM_PER_THREAD;
  unsigned char *p = NULL, *seen = NULL;
  cr_assert_eq(mp_device_host_alloc(dev, 1, (void **)&seen), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, 4096, pt, (void **)&p), MP_OK);
  cr_assert_eq(mp_memset_async(dev, p, 1, 1, pt), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, pt, slow_start, NULL), MP_OK);
  cr_assert_eq(mp_memcpy_async(dev, seen, p, 1, pt), MP_OK);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  pt_t b = {.pool = pool, .dev = dev};
  pthread_t t;
  cr_assert_eq(
      pthread_create(&t, NULL, alloc_and_write_on_own_per_thread_stream, &b),
      0);
  pthread_join(t, NULL);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_assert_eq(*seen, 1,
               "thread B overwrote the block under thread A's kernel "
               "(B's block %s A's)",
               b.got == p ? "==" : "!=");
  cr_assert_eq(mp_device_host_free(dev, seen), MP_OK);
  leave_ctx();
  cr_assert_eq(mp_pool_free(pool, b.got), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(dev);
}

/* A thread that frees blocks on its per-thread stream, finishes that work
 * and then lives on without calling the pool (a worker parked on a
 * condition). */
enum { QUIET_N = 4 };
typedef struct {
  mp_pool_t *pool;
  mp_device_t *dev;
  gate_t done, leave; /* its frees are finished; it may exit */
} quiet_t;

static void *free_on_own_per_thread_stream_then_park(void *p) {
  quiet_t *q = p;
  enter_ctx();
  mp_stream_t pt = (mp_stream_t)CU_STREAM_PER_THREAD;
  void *v[QUIET_N];
  for (int i = 0; i < QUIET_N; i++) {
    cr_assert_eq(mp_pool_alloc(q->pool, 1u << 20, pt, &v[i]), MP_OK, "%s",
                 mp_last_error());
    cr_assert_eq(mp_memset_async(q->dev, v[i], 3, 1u << 20, pt), MP_OK);
  }
  for (int i = 0; i < QUIET_N; i++)
    cr_assert_eq(mp_pool_free(q->pool, v[i]), MP_OK);
  cr_assert_eq(mp_stream_synchronize(q->dev, pt), MP_OK);
  gate_open(&q->done);
  gate_wait(&q->leave);
  leave_ctx();
  return NULL;
}

/* What a thread freed on its per-thread stream and finished serves another
 * stream while that thread lives on without calling the pool: no growth.
 * Only the owner can close a per-thread stream's epoch (the handle names
 * the caller's own stream; another thread leaves a request), so such a
 * free closes it at once. When frees after the first of a run joined the
 * open epoch (lazy close), s2 grew the pool instead, for as long as the
 * owner did not call again (here, for good). */
Test(cuda_pool_rules, a_parked_threads_finished_frees_serve_another_stream,
     .init = load_driver) {
  two_t t = two_open();
  void *own = NULL, *w[QUIET_N];
  cr_assert_eq(mp_pool_alloc(t.pool, 1u << 20, (mp_stream_t)t.s2, &own), MP_OK);
  quiet_t q = {.pool = t.pool, .dev = t.dev};
  gate_init(&q.done);
  gate_init(&q.leave);
  pthread_t th;
  cr_assert_eq(
      pthread_create(&th, NULL, free_on_own_per_thread_stream_then_park, &q),
      0);
  gate_wait(&q.done);
  mp_stats_t st;
  cr_assert_eq(mp_pool_get_stats(t.pool, &st), MP_OK);
  size_t reserved = st.reserved_bytes;
  for (int i = 0; i < QUIET_N; i++)
    cr_assert_eq(mp_pool_alloc(t.pool, 1u << 20, (mp_stream_t)t.s2, &w[i]),
                 MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_get_stats(t.pool, &st), MP_OK);
  cr_expect_eq(st.reserved_bytes, reserved,
               "s2 grew the pool instead of taking what the parked thread "
               "freed and finished");
  for (int i = 0; i < QUIET_N; i++)
    cr_assert_eq(mp_pool_free(t.pool, w[i]), MP_OK);
  gate_open(&q.leave);
  pthread_join(th, NULL);
  cr_assert_eq(mp_pool_free(t.pool, own), MP_OK);
  cr_expect_eq(mp_pool_check(t.pool), MP_OK, "%s", mp_last_error());
  two_close(&t);
  gate_destroy(&q.done);
  gate_destroy(&q.leave);
}

/* A thread's per-thread stream goes with the thread: 40 threads that each
 * allocate on CU_STREAM_PER_THREAD and exit leave no live slot behind
 * (the pool's dump counts its streams). */
static void *alloc_on_own_stream_and_exit(void *p) {
  mp_pool_t *pool = p;
  enter_ctx();
  void *b = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 4096, (mp_stream_t)CU_STREAM_PER_THREAD, &b),
               MP_OK);
  cr_assert_eq(mp_pool_free(pool, b), MP_OK);
  leave_ctx();
  return NULL;
}

static unsigned live_streams(mp_pool_t *pool) {
  char buf[8192] = "";
  FILE *f = fmemopen(buf, sizeof buf - 1, "w");
  cr_assert_not_null(f);
  cr_assert_eq(mp_pool_dump(pool, f, "json"), MP_OK);
  fclose(f);
  const char *at = strstr(buf, "\"streams\":{\"live\":");
  cr_assert_not_null(at, "%s", buf);
  return (unsigned)strtoul(at + strlen("\"streams\":{\"live\":"), NULL, 10);
}

Test(cuda_pool_rules, an_exited_threads_per_thread_stream_is_forgotten,
     .init = load_driver) {
  mp_device_t *dev = open_dev("cuda");
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(dev, NULL, &pool), MP_OK);
  for (int i = 0; i < 40; i++) {
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, alloc_on_own_stream_and_exit, pool),
                 0);
    pthread_join(t, NULL);
  }
  cr_assert_eq(live_streams(pool), 0, "slots of exited threads stayed");
  cr_assert_eq(mp_pool_check(pool), MP_OK);
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
  cr_assert_eq(capcu.create(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  void *a = NULL, *b = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 1u << 20, (mp_stream_t)s, &a), MP_OK);
  cr_assert_eq(cu.launch(s, gate_wait, &gate), CUDA_SUCCESS);
  cr_assert_eq(mp_pool_free(pool, a), MP_OK);
  long long bad = capture_errors(CUDA_ERROR_INVALID_HANDLE);
  cr_assert_eq(mp_stream_forget(dev, (mp_stream_t)s), MP_OK);
  cr_assert_eq(capcu.destroy(s), CUDA_SUCCESS);
  cr_assert_eq(capcu.create(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  cr_assert_eq(mp_pool_alloc(pool, 1u << 20, (mp_stream_t)s2, &b), MP_OK);
  cr_assert_neq(b, a,
                "the block was reused while the destroyed stream's "
                "work still held it");
  cr_assert_eq(mp_pool_free(pool, b), MP_OK);
  cr_assert_eq(capture_errors(CUDA_ERROR_INVALID_HANDLE), bad,
               "the pool used the destroyed handle");
  gate_open(&gate);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  stream_end(dev, s2);
  cr_assert_eq(mp_pool_check(pool), MP_OK);
  leave_ctx();
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  gate_destroy(&gate);
  mp_device_close(dev);
}

/* ---- arenas and a per-thread stream given to mp_pool_add_stream -------- */
typedef struct {
  mp_pool_t *pool;
  mp_device_t *dev;
  mp_stream_t x;
  unsigned char *got;
} arena_maker_t;

/* Makes the pool's arena (its first allocation) on another thread: a
 * block on stream x, set to 1 there. */
static void *first_arena_alloc(void *p) {
  arena_maker_t *m = p;
  enter_ctx();
  cr_assert_eq(mp_pool_alloc(m->pool, 4096, m->x, (void **)&m->got), MP_OK);
  cr_assert_eq(mp_memset_async(m->dev, m->got, 1, 1, m->x), MP_OK);
  cr_assert_eq(mp_stream_synchronize(m->dev, m->x), MP_OK);
  leave_ctx();
  return NULL;
}

/* mp_pool_add_stream(CU_STREAM_PER_THREAD) names the calling thread's own
 * stream; on a pool with arenas it reaches every arena, those made later
 * too (pool.h, Arenas). Here the arena is made after the call, by another
 * thread: a block freed with free_after_all while this thread's stream
 * (held by a gate) still reads it is not reused by x meanwhile. */
Test(cuda_pool_rules, added_per_thread_stream_reaches_arenas_made_later,
     .init = load_driver) {
  mp_device_t *dev = open_dev("cuda");
  mp_pool_t *pool = cuda_pool(dev, "arenas=1");
  enter_ctx();
  mp_stream_t pt = (mp_stream_t)CU_STREAM_PER_THREAD;
  cr_assert_eq(mp_pool_add_stream(pool, pt), MP_OK, "%s", mp_last_error());
  arena_maker_t m = {.pool = pool, .dev = dev};
  cr_assert_eq(mp_stream_create(dev, &m.x), MP_OK);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, first_arena_alloc, &m), 0);
  pthread_join(t, NULL);
  unsigned char *seen = NULL, *q = NULL;
  cr_assert_eq(mp_device_host_alloc(dev, 1, (void **)&seen), MP_OK);
  gate_t g;
  gate_init(&g);
  /* This thread's "kernel" reads the block once the gate opens. */
  cr_assert_eq(mp_stream_launch_host(dev, pt, gate_wait, &g), MP_OK);
  cr_assert_eq(mp_memcpy_async(dev, seen, m.got, 1, pt), MP_OK);
  cr_assert_eq(mp_pool_free_after_all(pool, m.got), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, 4096, m.x, (void **)&q), MP_OK);
  cr_assert_eq(mp_memset_async(dev, q, 2, 1, m.x), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, m.x), MP_OK);
  gate_open(&g);
  cr_assert_eq(mp_stream_synchronize(dev, pt), MP_OK);
  cr_expect_eq(*seen, 1,
               "x overwrote the block under this thread's per-thread "
               "stream's work (the new block %s the freed one)",
               q == m.got ? "is" : "is not");
  cr_assert_eq(mp_pool_free(pool, q), MP_OK);
  cr_assert_eq(mp_device_host_free(dev, seen), MP_OK);
  gate_destroy(&g);
  leave_ctx();
  cr_assert_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, m.x), MP_OK);
  mp_device_close(dev);
}

/* Device 0's granule: cuMemGetAllocationGranularity's minimum for its
 * pinned memory (cuda.h promises no value; 2 MiB on the fake and on every
 * GPU the pool has met). */
static size_t device_granule(void) {
  CUresult (*granularity)(size_t *, const CUmemAllocationProp *,
                          CUmemAllocationGranularity_flags);
  FK_LOAD(granularity, "cuMemGetAllocationGranularity");
  CUmemAllocationProp prop = {
      .type = CU_MEM_ALLOCATION_TYPE_PINNED,
      .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
  size_t g = 0;
  cr_assert_eq(granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
               CUDA_SUCCESS);
  return g;
}

/* map_piece on the driver: each piece is a cuMemCreate handle mapped on
 * its own, and trim gives the free ones back with cuMemUnmap of exactly
 * one mapping each (cuda.h: cuMemUnmap's range must be a whole mapping;
 * the fake refuses any other). On a GPU the twin shows the real driver
 * takes the pieces back one by one. The counts below are for 2 MiB
 * pieces of a 2 MiB granule; a GPU of another granule (cuda.h,
 * cuMemGetAllocationGranularity, names none) rounds the pieces to its
 * own, so the twin skips there. */
Test(cuda_pool_rules, map_pieces_are_whole_mappings_trim_unmaps_one_by_one,
     .init = load_driver) {
  mp_device_t *dev = open_dev("cuda");
  size_t granule = device_granule();
  if (granule != (size_t)2 << 20) {
    mp_device_close(dev);
    cr_skip_test("a granule of %zu bytes, not 2 MiB", granule);
  }
  mp_pool_t *pool = cuda_pool(dev, "map_piece=2M");
  if (!fk_is_real())
    fk_reset_calls();
  long long refused = capture_errors(CUDA_ERROR_INVALID_VALUE);
  void *a, *b;
  cr_assert_eq(mp_pool_alloc(pool, 8u << 20, NULL, &a), MP_OK, "%s",
               mp_last_error());
  mp_stats_t st;
  cr_assert_eq(mp_pool_get_stats(pool, &st), MP_OK);
  cr_assert_eq(st.reserved_bytes, 8u << 20);
  cr_expect_eq(st.device_alloc_count, 4);
  if (!fk_is_real())
    cr_expect_eq(fk_calls("cuMemMap"), 4);
  cr_assert_eq(mp_pool_free(pool, a), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, 2u << 20, NULL, &b), MP_OK);
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK);
  cr_assert_eq(mp_pool_get_stats(pool, &st), MP_OK);
  cr_expect_eq(st.reserved_bytes, 2u << 20,
               "trim kept %zu bytes: a free piece did not go back",
               st.reserved_bytes);
  cr_expect_eq(st.device_free_count, 3);
  if (!fk_is_real())
    cr_expect_eq(fk_calls("cuMemUnmap"), 3);
  cr_expect_eq(capture_errors(CUDA_ERROR_INVALID_VALUE), refused);
  cr_assert_eq(mp_pool_free(pool, b), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(dev);
}

/* A close while another thread captures in global mode on the device: its
 * wait (cuCtxSynchronize) is refused, so it closes nothing and says why,
 * and the device serves on; the wait invalidates the capture beside it
 * all the same, as a device-wide synchronize from another thread does on
 * a GPU in global and thread-local captures alike (device.h says so). */
Test(cuda_pool_rules, a_close_beside_a_global_capture_is_refused,
     .init = load_driver) {
  mp_device_t *dev = open_dev("cuda");
  capture_t c;
  capture_start(&c);
  mp_status_t st = mp_device_close_ex(dev);
  char why[512];
  snprintf(why, sizeof why, "%s", mp_last_error());
  atomic_store(&c.stage, 2);
  pthread_join(c.thread, NULL);
  cr_assert_neq(st, MP_OK, "the close went on beside the capture");
  cr_expect(strstr(why, "nothing was closed") != NULL, "%s", why);
  cr_expect_eq(c.end, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
               "the capture beside ended with %d", (int)c.end);
  void *p = NULL;
  cr_assert_eq(mp_device_alloc(dev, 4096, &p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_device_free(dev, p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_device_close_ex(dev), MP_OK, "%s", mp_last_error());
}
