/* test_fakecuda_other_context_stream_queries_not_counted.c - the fake
 * driver answers the queries of a stream of another context (cuda.h,
 * cuStreamGetCtx: "Returns the CUDA context that the stream is associated
 * with"; cuStreamGetFlags, cuStreamIsCapturing, cuStreamGetCaptureInfo),
 * another device's primary context's or one cuCtxCreate made, and counts
 * as an invalid handle (cuFakeGetErrorCount(CUDA_ERROR_INVALID_HANDLE))
 * only a handle that is no live stream at all. Before, each such legal
 * query was counted first (fakecuda.c, fk_resolve) and answered after, so
 * a test that counted invalid handles saw refusals that never were. The
 * count is the fake's: no GPU twin. */
#include <cuda.h>

#include "fakecuda_test.h"

static struct {
  CUresult (*init)(unsigned);
  CUresult (*retain)(CUcontext *, CUdevice);
  CUresult (*set)(CUcontext);
  CUresult (*create)(CUstream *, unsigned);
  CUresult (*destroy)(CUstream);
  CUresult (*ctx_create)(CUcontext *, CUctxCreateParams *, unsigned, CUdevice);
  CUresult (*ctx_destroy)(CUcontext);
  CUresult (*get_ctx)(CUstream, CUcontext *);
  CUresult (*get_flags)(CUstream, unsigned *);
  CUresult (*is_capturing)(CUstream, CUstreamCaptureStatus *);
  CUresult (*capture_info)(CUstream, CUstreamCaptureStatus *, cuuint64_t *,
                           CUgraph *, const CUgraphNode **,
                           const CUgraphEdgeData **, size_t *);
  long long (*errors)(CUresult);
} fk;

static void two_devices(void) {
  cr_assert_eq(setenv("FAKECUDA_DEVICE_COUNT", "2", 1), 0);
  FK_LOAD(fk.init, "cuInit");
  FK_LOAD(fk.retain, "cuDevicePrimaryCtxRetain");
  FK_LOAD(fk.set, "cuCtxSetCurrent");
  FK_LOAD(fk.create, "cuStreamCreate");
  FK_LOAD(fk.destroy, "cuStreamDestroy_v2");
  FK_LOAD(fk.ctx_create, "cuCtxCreate_v4");
  FK_LOAD(fk.ctx_destroy, "cuCtxDestroy_v2");
  FK_LOAD(fk.get_ctx, "cuStreamGetCtx");
  FK_LOAD(fk.get_flags, "cuStreamGetFlags");
  FK_LOAD(fk.is_capturing, "cuStreamIsCapturing");
  FK_LOAD(fk.capture_info, "cuStreamGetCaptureInfo_v3");
  FK_LOAD(fk.errors, "cuFakeGetErrorCount");
  cr_assert_eq(fk.init(0), CUDA_SUCCESS);
}

TestSuite(fakecuda_other_context_stream_queries_not_counted,
          .init = two_devices);

static CUcontext primary(int d) {
  CUcontext c = NULL;
  cr_assert_eq(fk.retain(&c, d), CUDA_SUCCESS);
  return c;
}

static long long bad_handles(void) {
  return fk.errors(CUDA_ERROR_INVALID_HANDLE);
}

/* The four queries of s, with device 0's primary context current: each
 * answers want (owner: s's context, when answered). */
static void queries(CUstream s, CUresult want, CUcontext owner) {
  cr_assert_eq(fk.set(primary(0)), CUDA_SUCCESS);
  CUcontext got = NULL;
  unsigned flags = 0;
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  cuuint64_t id = 0;
  cr_expect_eq(fk.get_ctx(s, &got), want, "cuStreamGetCtx");
  if (want == CUDA_SUCCESS)
    cr_expect_eq(got, owner, "cuStreamGetCtx named another context");
  cr_expect_eq(fk.get_flags(s, &flags), want, "cuStreamGetFlags");
  cr_expect_eq(fk.is_capturing(s, &st), want, "cuStreamIsCapturing");
  cr_expect_eq(fk.capture_info(s, &st, &id, NULL, NULL, NULL, NULL), want,
               "cuStreamGetCaptureInfo");
}

/* A stream of context owner (current), asked about from device 0's
 * primary context: answered, nothing counted; destroyed after. */
static void answered_uncounted(CUcontext owner, const char *whose) {
  CUstream s = NULL;
  cr_assert_eq(fk.create(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  long long bad = bad_handles();
  queries(s, CUDA_SUCCESS, owner);
  cr_expect_eq(bad_handles() - bad, 0,
               "legal queries of %s stream were counted as %lld invalid "
               "handles",
               whose, bad_handles() - bad);
  cr_assert_eq(fk.set(owner), CUDA_SUCCESS);
  cr_expect_eq(fk.destroy(s), CUDA_SUCCESS);
}

Test(fakecuda_other_context_stream_queries_not_counted,
     another_devices_stream) {
  CUcontext one = primary(1);
  cr_assert_eq(fk.set(one), CUDA_SUCCESS);
  answered_uncounted(one, "another device's");
}

Test(fakecuda_other_context_stream_queries_not_counted,
     a_made_contexts_stream) {
  CUcontext made = NULL;
  cr_assert_eq(fk.ctx_create(&made, NULL, 0, 0), CUDA_SUCCESS);
  answered_uncounted(made, "a made context's");
  cr_expect_eq(fk.ctx_destroy(made), CUDA_SUCCESS);
}

/* A handle that is no stream of any context is still refused, and each
 * refusal counted. */
Test(fakecuda_other_context_stream_queries_not_counted, no_stream_counted) {
  int not_a_stream;
  long long bad = bad_handles();
  queries((CUstream)&not_a_stream, CUDA_ERROR_INVALID_HANDLE, NULL);
  cr_expect_eq(bad_handles() - bad, 4, "%lld refusals counted, not 4",
               bad_handles() - bad);
}
