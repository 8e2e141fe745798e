/* test_cuda_default_pool.c - mp_malloc and mp_default_pool serve the device
 * the calling thread's context is on, as cudaMalloc does: on a machine of
 * two devices (FAKECUDA_DEVICE_COUNT=2, the strict fake), device 1's
 * context gets memory of device 1 from a pool of its own, and mp_free finds
 * a pointer's pool whatever context is current. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>
#include <mempool/mempool.h>

#include "fakecuda_test.h"

static struct {
  CUresult (*retain)(CUcontext *, CUdevice), (*release)(CUdevice);
  CUresult (*set)(CUcontext);
  CUresult (*init)(unsigned);
  CUresult (*stream_create)(CUstream *, unsigned);
  CUresult (*stream_destroy)(CUstream);
  CUresult (*stream_sync)(CUstream);
} cu;

/* The driver's entry points, with n devices (skipped where it sees
 * fewer). */
static void devices(const char *n) {
  setenv("FAKECUDA_DEVICE_COUNT", n, 1);
  setenv("MEMPOOL_DEVICE", "cuda", 1);
  FK_LOAD(cu.retain, "cuDevicePrimaryCtxRetain");
  FK_LOAD(cu.release, "cuDevicePrimaryCtxRelease_v2");
  FK_LOAD(cu.set, "cuCtxSetCurrent");
  FK_LOAD(cu.init, "cuInit");
  FK_LOAD(cu.stream_create, "cuStreamCreate");
  FK_LOAD(cu.stream_destroy, "cuStreamDestroy_v2");
  FK_LOAD(cu.stream_sync, "cuStreamSynchronize");
  cr_assert_eq(cu.init(0), CUDA_SUCCESS);
  CUresult (*count)(int *);
  FK_LOAD(count, "cuDeviceGetCount");
  int have = 0;
  cr_assert_eq(count(&have), CUDA_SUCCESS);
  if (have < atoi(n))
    cr_skip_test("%d device(s) only (a GPU twin)", have);
}

static void two_devices(void) {
  devices("2");
}

static void one_device(void) {
  devices("1");
}

static CUcontext on_device(int d) {
  CUcontext c = NULL;
  cr_assert_eq(cu.retain(&c, d), CUDA_SUCCESS);
  cr_assert_eq(cu.set(c), CUDA_SUCCESS);
  return c;
}

Test(cuda_default_pool, serves_the_device_of_the_current_context,
     .init = two_devices) {
  on_device(1);
  void *p = NULL;
  cr_assert_eq(mp_malloc(&p, 1u << 20), MP_OK, "%s", mp_last_error());
  mp_pool_t *pool1 = mp_default_pool();
  cr_assert_not_null(pool1);
  const char *name = mp_device_name(mp_pool_device(pool1));
  cr_assert(strncmp(name, "cuda:1", 6) == 0, "device 1 got '%s'", name);
  on_device(0);
  mp_pool_t *pool0 = mp_default_pool();
  cr_assert_neq(pool0, pool1);
  name = mp_device_name(mp_pool_device(pool0));
  cr_assert(strncmp(name, "cuda:0", 6) == 0, "device 0 got '%s'", name);
  /* A device-1 pointer freed with device 0 current goes to its own pool. */
  mp_stats_t s;
  cr_assert_eq(mp_pool_get_stats(pool1, &s), MP_OK);
  cr_assert_eq(s.live_blocks, 1);
  cr_assert_eq(mp_free(p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_get_stats(pool1, &s), MP_OK);
  cr_assert_eq(s.live_blocks, 0);
  cr_assert_eq(mp_free(p), MP_EINVAL, "a double free was accepted");
  cr_assert_eq(cu.release(0), CUDA_SUCCESS);
  cr_assert_eq(cu.release(1), CUDA_SUCCESS);
}

/* cuMemAllocAsync: "The allocation comes from the memory pool current to
 * the stream's device", whatever context is current. mp_malloc_async took
 * the current device's pool, which refused device 1's stream as one of
 * another context (MP_EINVAL). The legacy stream is still the current
 * device's, and the free goes to the block's own pool. */
Test(cuda_default_pool, malloc_async_serves_the_streams_device,
     .init = two_devices) {
  on_device(1);
  CUstream s1 = NULL;
  cr_assert_eq(cu.stream_create(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  mp_pool_t *pool1 = mp_default_pool();
  cr_assert_not_null(pool1, "%s", mp_last_error());
  on_device(0);
  void *p = NULL;
  cr_assert_eq(mp_malloc_async(&p, 1u << 20, (mp_stream_t)s1), MP_OK, "%s",
               mp_last_error());
  mp_stats_t st;
  cr_assert_eq(mp_pool_get_stats(pool1, &st), MP_OK);
  cr_assert_eq(st.live_blocks, 1, "device 1's pool did not serve its stream");
  void *q = NULL;
  cr_assert_eq(mp_malloc_async(&q, 4096, NULL), MP_OK, "%s", mp_last_error());
  mp_pool_t *pool0 = mp_default_pool();
  cr_assert_neq(pool0, pool1);
  cr_assert_eq(mp_pool_get_stats(pool0, &st), MP_OK);
  cr_assert_eq(st.live_blocks, 1, "the legacy stream left device 0");
  if (!fk_is_real()) { /* a handle no driver knows: refused, nothing made */
    int junk;
    void *r = &junk;
    cr_assert_eq(mp_malloc_async(&r, 4096, (mp_stream_t)&junk), MP_EINVAL);
    cr_assert_eq(r, &junk);
    cr_assert(strstr(mp_last_error(), "not a live stream") != NULL, "%s",
              mp_last_error());
  }
  cr_assert_eq(mp_free_async(p, (mp_stream_t)s1), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_free(q), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_get_stats(pool1, &st), MP_OK);
  cr_assert_eq(st.live_blocks, 0);
  on_device(1);
  cr_assert_eq(cu.stream_sync(s1), CUDA_SUCCESS);
  cr_assert_eq(mp_stream_forget(mp_pool_device(pool1), (mp_stream_t)s1), MP_OK);
  cr_assert_eq(cu.stream_destroy(s1), CUDA_SUCCESS);
  cr_assert_eq(cu.release(0), CUDA_SUCCESS);
  cr_assert_eq(cu.release(1), CUDA_SUCCESS);
}

static atomic_bool gate;

static void CUDA_CB wait_for_gate(void *arg) {
  (void)arg;
  while (!atomic_load(&gate))
    usleep(1000);
}

static void *open_gate_later(void *arg) {
  (void)arg;
  usleep(300 * 1000);
  atomic_store(&gate, true);
  return NULL;
}

/* A MiB of device 1's default pool (*pool1), with device 0 current after. */
static void *device_1_block(mp_pool_t **pool1) {
  on_device(1);
  void *p = NULL;
  cr_assert_eq(mp_malloc(&p, 1u << 20), MP_OK, "%s", mp_last_error());
  *pool1 = mp_default_pool();
  on_device(0);
  return p;
}

/* A device-1 block freed with mp_free_async on device 0's stream s (NULL:
 * its legacy stream) while work queued on s holds the gate: the free must
 * come after that work, as cudaFreeAsync's on s. */
static void free_on_device_0(CUstream s) {
  CUresult (*host_fn)(CUstream, CUhostFn, void *);
  FK_LOAD(host_fn, "cuLaunchHostFunc");
  mp_pool_t *pool1;
  void *p = device_1_block(&pool1);
  atomic_store(&gate, false);
  cr_assert_eq(host_fn(s, wait_for_gate, NULL), CUDA_SUCCESS);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, open_gate_later, NULL), 0);
  cr_assert_eq(mp_free_async(p, (mp_stream_t)s), MP_OK, "%s", mp_last_error());
  cr_expect(atomic_load(&gate), "freed before the stream's work passed");
  pthread_join(t, NULL);
  mp_stats_t st;
  cr_assert_eq(mp_pool_get_stats(pool1, &st), MP_OK);
  cr_assert_eq(st.live_blocks, 0);
  cr_assert_eq(cu.stream_sync(s), CUDA_SUCCESS);
}

/* cudaFreeAsync takes any device's stream, the default ones being the
 * current device's. mp_free_async of a device-1 block on device 0's
 * legacy stream ordered it on device 1's legacy stream, so the block was
 * free for device 1 while device 0's work still used it; on a device-0
 * stream it was refused (MP_EINVAL, the block still allocated). Found by a
 * review, 2026-12-01. */
Test(cuda_default_pool, free_async_on_another_devices_stream_waits_for_it,
     .init = two_devices) {
  free_on_device_0(NULL);
  CUstream s0 = NULL;
  cr_assert_eq(cu.stream_create(&s0, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  free_on_device_0(s0);
  cr_assert_eq(cu.stream_destroy(s0), CUDA_SUCCESS);
  cr_assert_eq(cu.release(0), CUDA_SUCCESS);
  cr_assert_eq(cu.release(1), CUDA_SUCCESS);
}

/* The same free while device 0's stream is being captured: the wait that
 * orders it would synchronize a capturing stream, which cuda.h forbids
 * (it invalidated the capture, and the free failed with MP_EDRIVER). It is
 * refused (MP_EBUSY), the capture goes on, the block stays allocated.
 * Found by a review of the fix above. */
Test(cuda_default_pool, free_async_on_another_devices_capture_is_refused,
     .init = two_devices) {
  CUresult (*begin)(CUstream, CUstreamCaptureMode);
  CUresult (*end)(CUstream, CUgraph *);
  CUresult (*graph_destroy)(CUgraph);
  FK_LOAD(begin, "cuStreamBeginCapture_v2");
  FK_LOAD(end, "cuStreamEndCapture");
  FK_LOAD(graph_destroy, "cuGraphDestroy");
  mp_pool_t *pool1;
  void *p = device_1_block(&pool1);
  CUstream s0 = NULL;
  cr_assert_eq(cu.stream_create(&s0, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  cr_assert_eq(begin(s0, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  cr_expect_eq(mp_free_async(p, (mp_stream_t)s0), MP_EBUSY, "%s",
               mp_last_error());
  CUgraph g = NULL;
  cr_assert_eq(end(s0, &g), CUDA_SUCCESS, "the free invalidated the capture");
  mp_stats_t st;
  cr_assert_eq(mp_pool_get_stats(pool1, &st), MP_OK);
  cr_expect_eq(st.live_blocks, 1, "the refused free freed the block");
  cr_assert_eq(mp_free_async(p, (mp_stream_t)s0), MP_OK, "%s", mp_last_error());
  cr_assert_eq(graph_destroy(g), CUDA_SUCCESS);
  cr_assert_eq(cu.stream_destroy(s0), CUDA_SUCCESS);
  cr_assert_eq(cu.release(0), CUDA_SUCCESS);
  cr_assert_eq(cu.release(1), CUDA_SUCCESS);
}

/* The same free after a kernel's fault (the fake's sticky error): the
 * capture question fails with the driver's error, which is the answer
 * (MP_EDRIVER, code 700); it was taken for a capture (MP_EBUSY, code 0).
 * The block stays allocated, and is freed once the driver answers. The
 * fault is the fake's (cuFakeSetStickyError): a real driver (the GPU twin
 * on two GPUs) has no such hook, and a real fault (cuda.h,
 * CUDA_ERROR_ILLEGAL_ADDRESS: "the context cannot be used") would leave
 * the process unable to go on, so the twin skips. */
Test(cuda_default_pool,
     free_async_elsewhere_after_a_fault_says_the_drivers_error,
     .init = two_devices) {
  if (fk_is_real())
    cr_skip_test("the sticky error is the fake's");
  mp_pool_t *pool1;
  void *p = device_1_block(&pool1);
  cr_assert_not_null(mp_default_pool(), "%s", mp_last_error());
  fk_sticky_error(CUDA_ERROR_ILLEGAL_ADDRESS);
  mp_status_t st = mp_free_async(p, NULL);
  int code = mp_last_driver_error();
  fk_sticky_error(0);
  cr_expect_eq(st, MP_EDRIVER, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect_eq(code, CUDA_ERROR_ILLEGAL_ADDRESS, "%d", code);
  mp_stats_t stats;
  cr_assert_eq(mp_pool_get_stats(pool1, &stats), MP_OK);
  cr_expect_eq(stats.live_blocks, 1, "the refused free freed the block");
  cr_assert_eq(mp_free_async(p, NULL), MP_OK, "%s", mp_last_error());
  cr_assert_eq(cu.release(0), CUDA_SUCCESS);
  cr_assert_eq(cu.release(1), CUDA_SUCCESS);
}

/* Where the driver sees one device every stream is its: the drop-in asks
 * the driver nothing per call to find the stream's device (it asked
 * cuCtxGetDevice for every mp_malloc and default-stream mp_free_async, and
 * three calls for every explicit stream, after 0b50e3d and 50ea93c). */
Test(cuda_default_pool, one_device_asks_the_driver_nothing_per_call,
     .init = one_device) {
  on_device(0);
  CUstream s = NULL;
  cr_assert_eq(cu.stream_create(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  void *p = NULL;
  cr_assert_eq(mp_malloc_async(&p, 4096, (mp_stream_t)s), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_free_async(p, (mp_stream_t)s), MP_OK, "%s", mp_last_error());
  /* What the stream's device is asked with (the pool's own calls, an
   * event on a stream switch, are not counted). Counted where the driver
   * counts calls (the fake); a real driver (the GPU twin) has no
   * cuFakeGetCallCount, so there the calls run and only their answers
   * are checked. */
  const char *asked[] = {"cuCtxGetDevice", "cuStreamGetCtx"};
  bool counted = !fk_is_real();
  long long before[2] = {0};
  for (int i = 0; counted && i < 2; i++)
    before[i] = fk_calls(asked[i]);
  for (int k = 0; k < 100; k++) {
    cr_assert_eq(mp_malloc_async(&p, 4096, (mp_stream_t)s), MP_OK);
    cr_assert_eq(mp_free_async(p, (mp_stream_t)s), MP_OK);
    cr_assert_eq(mp_malloc(&p, 4096), MP_OK);
    cr_assert_eq(mp_free_async(p, NULL), MP_OK);
  }
  for (int i = 0; counted && i < 2; i++)
    cr_expect_eq(fk_calls(asked[i]), before[i], "%s: %lld calls in 400",
                 asked[i], fk_calls(asked[i]) - before[i]);
  cr_assert_eq(cu.stream_sync(s), CUDA_SUCCESS);
  cr_assert_eq(
      mp_stream_forget(mp_pool_device(mp_default_pool()), (mp_stream_t)s),
      MP_OK);
  cr_assert_eq(cu.stream_destroy(s), CUDA_SUCCESS);
  cr_assert_eq(cu.release(0), CUDA_SUCCESS);
}

Test(cuda_default_pool, a_thread_without_a_context_gets_the_first_device,
     .init = two_devices) {
  void *p = NULL;
  cr_assert_eq(mp_malloc(&p, 4096), MP_OK, "%s", mp_last_error());
  const char *name = mp_device_name(mp_pool_device(mp_default_pool()));
  cr_assert(strncmp(name, "cuda:0", 6) == 0, "got '%s'", name);
  cr_assert_eq(mp_free(p), MP_OK);
}

/* cudaFree frees memory of any device, whatever context is current.
 * mp_free from a thread on device 1, which had no pool yet, made device
 * 1's pool just to look there first (opening the device: a primary context
 * retained), and where that pool could not be made the free failed with
 * MP_ENODEV, leaving device 0's block allocated. It finds the owner among
 * the pools already made now, and makes none; a pointer none holds is
 * MP_EINVAL, said so. */
Test(cuda_default_pool, a_free_on_another_device_makes_no_pool_there,
     .init = two_devices) {
  on_device(0);
  void *p = NULL;
  cr_assert_eq(mp_malloc(&p, 1u << 20), MP_OK, "%s", mp_last_error());
  mp_pool_t *pool0 = mp_default_pool();
  cr_assert_not_null(pool0);
  on_device(1);
  long long opened = fk_is_real() ? 0 : fk_calls("cuDevicePrimaryCtxRetain");
  cr_assert_eq(mp_free(p), MP_OK, "%s", mp_last_error());
  mp_stats_t s;
  cr_assert_eq(mp_pool_get_stats(pool0, &s), MP_OK);
  cr_assert_eq(s.live_blocks, 0);
  if (!fk_is_real())
    cr_assert_eq(fk_calls("cuDevicePrimaryCtxRetain"), opened,
                 "mp_free opened device 1 to make its pool");
  int local;
  cr_assert_eq(mp_free(&local), MP_EINVAL);
  cr_assert(strncmp(mp_last_error(), "mp_free: ", 9) == 0 &&
                strstr(mp_last_error(), "any device's default pool") != NULL,
            "%s", mp_last_error());
  cr_assert_eq(mp_free_async(&local, NULL), MP_EINVAL);
  cr_assert(strncmp(mp_last_error(), "mp_free_async: ", 15) == 0, "%s",
            mp_last_error());
  if (!fk_is_real())
    cr_assert_eq(fk_calls("cuDevicePrimaryCtxRetain"), opened,
                 "a refused free opened device 1");
  cr_assert_eq(cu.release(0), CUDA_SUCCESS);
  cr_assert_eq(cu.release(1), CUDA_SUCCESS);
}

/* The pool of the current device cannot be made (device 1 is small: a
 * max_fraction device 0 takes is under the alignment there): mp_malloc
 * says the status of the reason mp_last_error() gives, MP_EINVAL, and
 * says it again on the next call; it said MP_ENODEV whatever the reason. */
static void two_devices_the_second_small(void) {
  setenv("FAKECUDA_DEVICE_1", "capacity=64M", 1); /* read at cuInit */
  setenv("MEMPOOL_CONF", "max_fraction=0.0000001", 1);
  two_devices();
}

Test(cuda_default_pool, a_pool_that_cannot_be_made_says_its_reasons_status,
     .init = two_devices_the_second_small) {
  if (fk_is_real())
    cr_skip_test("the fake's small second device");
  on_device(0);
  void *p = NULL;
  cr_assert_eq(mp_malloc(&p, 1024), MP_OK, "%s", mp_last_error());
  on_device(1);
  for (int i = 0; i < 2; i++) {
    void *q = NULL;
    cr_expect_eq(mp_malloc(&q, 1024), MP_EINVAL, "call %d: %s", i,
                 mp_last_error());
    cr_expect(strstr(mp_last_error(), "max_fraction") != NULL, "%s",
              mp_last_error());
  }
  on_device(0);
  cr_expect_eq(mp_free(p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(cu.release(0), CUDA_SUCCESS);
  cr_assert_eq(cu.release(1), CUDA_SUCCESS);
}

/* $MEMPOOL_CONF is read once, when the first default pool is made, and
 * every device's pool takes those options (mempool.h: "fixed for the
 * process"): each other device's pool read it again when it was made, so a
 * change in between gave devices different caps. Device 0's pool is made
 * under max_bytes=4M; device 1's, made after the variable changed, keeps
 * that cap. */
static void two_devices_capped(void) {
  setenv("MEMPOOL_CONF", "max_bytes=4M", 1);
  two_devices();
}

static mp_status_t malloc_and_free(size_t bytes) {
  void *p = NULL;
  mp_status_t st = mp_malloc(&p, bytes);
  if (st == MP_OK)
    cr_assert_eq(mp_free(p), MP_OK, "%s", mp_last_error());
  return st;
}

Test(cuda_default_pool, every_devices_pool_takes_the_conf_read_first,
     .init = two_devices_capped) {
  on_device(0);
  cr_assert_eq(malloc_and_free(1u << 20), MP_OK, "%s", mp_last_error());
  unsetenv("MEMPOOL_CONF");
  on_device(1);
  mp_status_t st = malloc_and_free(8u << 20);
  cr_expect_eq(st, MP_ELIMIT, "device 1's pool read $MEMPOOL_CONF again (%s)",
               mp_status_name(st));
  cr_expect_eq(malloc_and_free(1u << 20), MP_OK, "%s", mp_last_error());
  cr_assert_eq(cu.release(0), CUDA_SUCCESS);
  cr_assert_eq(cu.release(1), CUDA_SUCCESS);
}
