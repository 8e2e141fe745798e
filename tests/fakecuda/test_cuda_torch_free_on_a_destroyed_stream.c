/* test_cuda_torch_free_on_a_destroyed_stream.c - mp_torch_free on the cuda
 * backend with the stream the block was allocated on, destroyed since with
 * mp_stream_destroy (every pool forgot it first): PyTorch's
 * CUDAPluggableAllocator passes the allocation's stream to the free hook
 * whatever became of it. A destroyed stream's handle is undefined
 * behaviour to pass to the driver at all (cuda.h; an H200 died in
 * cuEventRecord and cuStreamIsCapturing given one, fakecuda.c), and the
 * strict fake stops the process at its first use: the hook must free the
 * block on its own stream without asking the driver about the handle. */
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <mempool/mempool.h>

#include "../support/torch_dead_stream.h"
#include "fakecuda_test.h"

#define MiB ((size_t)1 << 20)

static void on_cuda(void) {
  setenv("MEMPOOL_DEVICE", "cuda", 1);
}

static mp_stats_t stats(void) {
  mp_stats_t s;
  cr_assert_eq(mp_pool_get_stats(mp_default_pool(), &s), MP_OK);
  return s;
}

TestSuite(cuda_torch_free_dead_stream, .init = on_cuda);

Test(cuda_torch_free_dead_stream, the_block_is_freed_without_using_the_handle) {
  mp_stream_t s = NULL;
  void *p = block_of_a_dead_stream(&s);
  mp_torch_free(p, MiB, 0, s);
  cr_assert_eq(stats().live_blocks, 0, "the block was kept: %s",
               mp_last_error());
  cr_assert_eq(mp_pool_check(mp_default_pool()), MP_OK, "%s", mp_last_error());
  void *q = mp_torch_malloc(MiB, 0, NULL);
  cr_assert_not_null(q, "%s", mp_last_error());
  mp_torch_free(q, MiB, 0, NULL);
  cr_assert_eq(stats().live_blocks, 0);
}

/* A stream mempool did not make (PyTorch's, the program's), forgotten as
 * device.h asks before the program destroys it (mp_stream_forget, which
 * the LD_PRELOAD shim's cuStreamDestroy hook calls). */
Test(cuda_torch_free_dead_stream, a_forgotten_streams_block_is_freed_too) {
  mp_device_t *dev = mp_pool_device(mp_default_pool());
  CUresult (*create)(CUstream *, unsigned);
  CUresult (*destroy)(CUstream);
  FK_LOAD(create, "cuStreamCreate");
  FK_LOAD(destroy, "cuStreamDestroy_v2");
  CUresult (*retain)(CUcontext *, CUdevice);
  CUresult (*set_current)(CUcontext);
  FK_LOAD(retain, "cuDevicePrimaryCtxRetain");
  FK_LOAD(set_current, "cuCtxSetCurrent");
  CUcontext ctx = NULL; /* the default pool's: device 0's primary one */
  cr_assert_eq(retain(&ctx, 0), CUDA_SUCCESS);
  cr_assert_eq(set_current(ctx), CUDA_SUCCESS);
  CUstream cs = NULL;
  cr_assert_eq(create(&cs, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  mp_stream_t s = (mp_stream_t)cs;
  void *p = mp_torch_malloc(MiB, 0, s);
  cr_assert_not_null(p, "%s", mp_last_error());
  cr_assert_eq(mp_stream_forget(dev, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(destroy(cs), CUDA_SUCCESS);
  mp_torch_free(p, MiB, 0, s);
  cr_assert_eq(stats().live_blocks, 0, "the block was kept: %s",
               mp_last_error());
  cr_assert_eq(mp_pool_check(mp_default_pool()), MP_OK, "%s", mp_last_error());
}

/* A new stream the driver gives the destroyed one's handle
 * (FAKECUDA_REUSE_STREAMS=1) is a live stream once PyTorch allocates on
 * it: its blocks are freed on it, and so is the old block freed with the
 * handle, now the new stream's. */
static void on_cuda_reusing_handles(void) {
  on_cuda();
  setenv("FAKECUDA_REUSE_STREAMS", "1", 1);
}

Test(cuda_torch_free_dead_stream, a_handle_given_to_a_new_stream_is_live_again,
     .init = on_cuda_reusing_handles) {
  mp_device_t *dev = mp_pool_device(mp_default_pool());
  mp_stream_t s = NULL, again = NULL;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  void *p = mp_torch_malloc(MiB, 0, s);
  cr_assert_not_null(p, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  /* Its work done, the fake reaps it at the next call (fk_unbury). */
  cr_assert_eq(mp_device_synchronize(dev), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_create(dev, &again), MP_OK, "%s", mp_last_error());
  if (again != s) /* a driver that does not reuse it: nothing to ask */
    cr_skip_test("the driver gave the new stream another handle");
  void *q = mp_torch_malloc(MiB, 0, again);
  cr_assert_not_null(q, "%s", mp_last_error());
  mp_torch_free(p, MiB, 0, again);
  mp_torch_free(q, MiB, 0, again);
  cr_assert_eq(stats().live_blocks, 0, "%s", mp_last_error());
  cr_assert(strstr(mp_last_error(), "freed on its own stream") == NULL, "%s",
            mp_last_error());
  cr_assert_eq(mp_pool_check(mp_default_pool()), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, again), MP_OK, "%s", mp_last_error());
}

/* While the pool is paused (which refuses frees), such a free is kept and
 * made at the first hook after the resume (mp_torch_free's contract), on
 * the block's own stream still. */
Test(cuda_torch_free_dead_stream, a_free_while_paused_is_kept_for_the_resume) {
  mp_stream_t s = NULL;
  void *p = block_of_a_dead_stream(&s);
  cr_assert_eq(mp_pool_pause(mp_default_pool(), MP_PAUSE_KEEP_CONTENT), MP_OK,
               "%s", mp_last_error());
  mp_torch_free(p, MiB, 0, s);
  cr_assert(strstr(mp_last_error(), "kept") != NULL, "%s", mp_last_error());
  cr_assert_eq(mp_pool_resume(mp_default_pool()), MP_OK, "%s", mp_last_error());
  cr_assert_eq(stats().live_blocks, 1, "no hook called since the resume");
  mp_torch_reset();
  cr_assert_eq(stats().live_blocks, 0, "the kept free was not made");
  cr_assert_eq(mp_pool_check(mp_default_pool()), MP_OK, "%s", mp_last_error());
}
