/* test_cuda_torch_capture.c - the PyTorch entry points on the cuda backend
 * (the strict fake; a GPU twin on a real driver): a graph captured with
 * only malloc and free hooked (what Python's CUDAPluggableAllocator sets)
 * gets its memory from a graph pool without invalidating the global-mode
 * capture, keeps it from everyone else until mp_torch_reset, and every
 * device gets its own pool. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
  mp_torch_reset();
  cr_expect_eq(allocated(), 0, "released at reset");
  cr_expect_eq(mp_pool_check(mp_default_pool()), MP_OK, "%s", mp_last_error());
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
