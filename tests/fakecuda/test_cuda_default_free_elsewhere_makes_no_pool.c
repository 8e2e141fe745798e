/* mp_free_async of a block of device 0's default pool on a stream of
 * device 1 (cudaFreeAsync takes any device's stream) waits for that stream
 * through device 1's handle, and makes no default pool for device 1: the
 * program asked for none. It made one (mp__default_pool_for) only to get at
 * the device, which could fail and leave the block allocated; a free
 * refused because the stream captures made it too. On the fake, where
 * calls are counted, no pool asked the device's size (mp_pool_create's
 * cuMemGetInfo; a device open asks none); the pool device 1 gets later is
 * made at its first allocation and serves it. On the strict fake with two
 * devices, and a GPU twin where there are two. Found by a review,
 * 2026-12-06. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>
#include <mempool/mempool.h>

#include "../support/pool_helpers.h"
#include "fakecuda_test.h"

static CUresult (*ctx_retain)(CUcontext *, CUdevice);
static CUresult (*ctx_release)(CUdevice);
static CUresult (*ctx_set)(CUcontext);
static CUresult (*mk_stream)(CUstream *, unsigned);
static CUresult (*rm_stream)(CUstream);
static CUresult (*capture_begin)(CUstream, CUstreamCaptureMode);
static CUresult (*capture_end)(CUstream, CUgraph *);
static CUresult (*graph_drop)(CUgraph);

static void two_devices(void) {
  setenv("FAKECUDA_DEVICE_COUNT", "2", 1);
  setenv("MEMPOOL_DEVICE", "cuda", 1);
  unsetenv("MEMPOOL_CONF");
  CUresult (*init)(unsigned);
  CUresult (*count)(int *);
  FK_LOAD(init, "cuInit");
  FK_LOAD(count, "cuDeviceGetCount");
  FK_LOAD(ctx_retain, "cuDevicePrimaryCtxRetain");
  FK_LOAD(ctx_release, "cuDevicePrimaryCtxRelease_v2");
  FK_LOAD(ctx_set, "cuCtxSetCurrent");
  FK_LOAD(mk_stream, "cuStreamCreate");
  FK_LOAD(rm_stream, "cuStreamDestroy_v2");
  FK_LOAD(capture_begin, "cuStreamBeginCapture_v2");
  FK_LOAD(capture_end, "cuStreamEndCapture");
  FK_LOAD(graph_drop, "cuGraphDestroy");
  int n = 0;
  cr_assert_eq(init(0), CUDA_SUCCESS);
  cr_assert_eq(count(&n), CUDA_SUCCESS);
  if (n < 2)
    cr_skip_test("%d device only (a GPU twin)", n);
}

static void switch_to(CUdevice d) {
  CUcontext ctx = NULL;
  cr_assert_eq(ctx_retain(&ctx, d), CUDA_SUCCESS);
  cr_assert_eq(ctx_set(ctx), CUDA_SUCCESS);
}

/* A MiB of device 0's default pool, device 1 current after; *pool0 its
 * pool. */
static void *block_of_device_0(mp_pool_t **pool0) {
  switch_to(0);
  void *p = NULL;
  cr_assert_eq(mp_malloc(&p, (size_t)1 << 20), MP_OK, "%s", mp_last_error());
  *pool0 = mp_default_pool();
  cr_assert_not_null(*pool0, "%s", mp_last_error());
  switch_to(1);
  return p;
}

static uint64_t live(mp_pool_t *pool) {
  return stats(pool).live_blocks;
}

/* Driver calls that ask a device's size (0 where calls are not counted). */
static long long sizings(void) {
  return fk_is_real() ? 0 : fk_calls("cuMemGetInfo_v2");
}

/* Device 1 (current) has no default pool yet: no pool was made since the
 * count `sized` of sizings; the one it gets now serves 8 MiB. */
static void device_1_pool_is_made_now(long long sized) {
  cr_expect_eq(sizings(), sized, "a pool was made (it asked the size)");
  void *q = NULL;
  mp_status_t st = mp_malloc(&q, (size_t)8 << 20);
  cr_expect_eq(st, MP_OK, "device 1's pool (%s: %s)", mp_status_name(st),
               mp_last_error());
  mp_pool_t *pool1 = mp_default_pool();
  cr_assert_not_null(pool1, "%s", mp_last_error());
  cr_assert(strncmp(mp_device_name(mp_pool_device(pool1)), "cuda:1", 6) == 0,
            "%s", mp_device_name(mp_pool_device(pool1)));
  if (st == MP_OK)
    cr_assert_eq(mp_free(q), MP_OK, "%s", mp_last_error());
}

/* Work queued on a stream that ends 200 ms after it starts. */
static atomic_bool work_done;

static void CUDA_CB slow_work(void *arg) {
  (void)arg;
  usleep(200 * 1000);
  atomic_store(&work_done, true);
}

/* The free of p on s (of device 1, current) comes after s's work. */
static void free_after_slow_work(void *p, CUstream s, mp_pool_t *pool0) {
  CUresult (*host_fn)(CUstream, CUhostFn, void *);
  FK_LOAD(host_fn, "cuLaunchHostFunc");
  uint64_t was = live(pool0);
  atomic_store(&work_done, false);
  cr_assert_eq(host_fn(s, slow_work, NULL), CUDA_SUCCESS);
  cr_assert_eq(mp_free_async(p, (mp_stream_t)s), MP_OK, "%s", mp_last_error());
  cr_expect(atomic_load(&work_done), "freed before the stream's work ended");
  cr_expect_eq(live(pool0), was - 1, "the block is still allocated");
}

Test(cuda_default_free_elsewhere, makes_no_pool_on_the_streams_device,
     .init = two_devices) {
  mp_pool_t *pool0;
  void *p = block_of_device_0(&pool0);
  void *q = block_of_device_0(&pool0);
  CUstream s1 = NULL;
  cr_assert_eq(mk_stream(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  long long sized = sizings();
  free_after_slow_work(p, s1, pool0);
  free_after_slow_work(q, NULL, pool0); /* device 1's legacy stream */
  cr_expect_eq(live(pool0), 0);
  device_1_pool_is_made_now(sized);
  cr_assert_eq(rm_stream(s1), CUDA_SUCCESS);
  cr_assert_eq(ctx_release(0), CUDA_SUCCESS);
  cr_assert_eq(ctx_release(1), CUDA_SUCCESS);
}

/* Refused while device 1's stream captures (no wait there: cuda.h), and
 * the refusal changes nothing: the block stays allocated, device 1 has no
 * pool, the capture goes on. */
Test(cuda_default_free_elsewhere, refused_on_a_capture_makes_no_pool,
     .init = two_devices) {
  mp_pool_t *pool0;
  void *p = block_of_device_0(&pool0);
  CUstream s1 = NULL;
  cr_assert_eq(mk_stream(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  long long sized = sizings();
  cr_assert_eq(capture_begin(s1, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  mp_status_t st = mp_free_async(p, (mp_stream_t)s1);
  cr_expect_eq(st, MP_EBUSY, "%s: %s", mp_status_name(st), mp_last_error());
  CUgraph g = NULL;
  cr_assert_eq(capture_end(s1, &g), CUDA_SUCCESS,
               "the free invalidated the capture");
  cr_expect_eq(live(pool0), 1, "the refused free freed the block");
  device_1_pool_is_made_now(sized);
  cr_assert_eq(mp_free_async(p, (mp_stream_t)s1), MP_OK, "%s", mp_last_error());
  cr_expect_eq(live(pool0), 0);
  cr_assert_eq(graph_drop(g), CUDA_SUCCESS);
  cr_assert_eq(rm_stream(s1), CUDA_SUCCESS);
  cr_assert_eq(ctx_release(0), CUDA_SUCCESS);
  cr_assert_eq(ctx_release(1), CUDA_SUCCESS);
}
