/* host_pool_capture.h - what the host pool's capture tests share: a host
 * pool on the cuda device (the fake driver), a stream of it, device 0's
 * primary context current, and the driver's capture and graph entry points
 * (reached through fakecuda_test.h: these tests do not link the fake). */
#ifndef MEMPOOL_TEST_HOST_POOL_CAPTURE_H
#define MEMPOOL_TEST_HOST_POOL_CAPTURE_H

#include <criterion/criterion.h>

#include <cuda.h>
#include <mempool/host_pool.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "fakecuda_test.h"

static struct {
  CUresult (*retain)(CUcontext *, CUdevice), (*release)(CUdevice);
  CUresult (*push)(CUcontext), (*pop)(CUcontext *);
  CUresult (*begin)(CUstream, CUstreamCaptureMode);
  CUresult (*end)(CUstream, CUgraph *);
  CUresult (*instantiate)(CUgraphExec *, CUgraph, unsigned long long);
  CUresult (*launch)(CUgraphExec, CUstream);
  CUresult (*sync)(CUstream);
  CUresult (*exec_destroy)(CUgraphExec), (*graph_destroy)(CUgraph);
} cu;

static mp_device_t *dev;
static mp_host_pool_t *hp;
static mp_stream_t a; /* non-blocking (mp_stream_create on CUDA) */

static inline void hpc_setup(void) {
  dev = open_dev("cuda");
  FK_LOAD(cu.retain, "cuDevicePrimaryCtxRetain");
  FK_LOAD(cu.release, "cuDevicePrimaryCtxRelease_v2");
  FK_LOAD(cu.push, "cuCtxPushCurrent_v2");
  FK_LOAD(cu.pop, "cuCtxPopCurrent_v2");
  FK_LOAD(cu.begin, "cuStreamBeginCapture_v2");
  FK_LOAD(cu.end, "cuStreamEndCapture");
  FK_LOAD(cu.instantiate, "cuGraphInstantiateWithFlags");
  FK_LOAD(cu.launch, "cuGraphLaunch");
  FK_LOAD(cu.sync, "cuStreamSynchronize");
  FK_LOAD(cu.exec_destroy, "cuGraphExecDestroy");
  FK_LOAD(cu.graph_destroy, "cuGraphDestroy");
  CUcontext c = NULL;
  cr_assert_eq(cu.retain(&c, 0), CUDA_SUCCESS);
  cr_assert_eq(cu.push(c), CUDA_SUCCESS);
  cr_assert_eq(mp_host_pool_create(dev, NULL, &hp), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_stream_create(dev, &a), MP_OK, "%s", mp_last_error());
}

/* hp destroyed unless NULL, then the rest. */
static inline void hpc_teardown(void) {
  if (hp != NULL)
    cr_expect_eq(mp_host_pool_destroy(hp), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_stream_destroy(dev, a), MP_OK, "%s", mp_last_error());
  cr_expect_eq(cu.pop(NULL), CUDA_SUCCESS);
  cr_expect_eq(cu.release(0), CUDA_SUCCESS);
  mp_device_close(dev);
}

/* A 4 KiB buffer used on s and freed: a chunk cached. */
static inline void hpc_used_on(mp_stream_t s) {
  void *p = NULL;
  cr_assert_eq(mp_host_pool_alloc(hp, 4096, s, &p), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_host_pool_free(hp, p), MP_OK, "%s", mp_last_error());
}

/* Begins a relaxed capture on a. */
static inline void hpc_capture_begin(void) {
  cr_assert_eq(cu.begin((CUstream)a, CU_STREAM_CAPTURE_MODE_RELAXED),
               CUDA_SUCCESS);
}

/* Ends the capture of a, which must have stayed valid; its graph
 * destroyed. */
static inline void hpc_capture_end(void) {
  CUgraph g = NULL;
  cr_expect_eq(cu.end((CUstream)a, &g), CUDA_SUCCESS);
  if (g != NULL)
    cr_expect_eq(cu.graph_destroy(g), CUDA_SUCCESS);
}

#endif /* MEMPOOL_TEST_HOST_POOL_CAPTURE_H */
