/* The host pool waits only for the streams that used it (host_pool.h: trim
 * synchronizes "the streams that used them", destroy "the streams that used
 * the pool"), not for the default stream where no buffer was used. On CUDA
 * the default stream is the legacy stream: an event there waits for every
 * blocking stream's work, and while a blocking stream captures it would
 * invalidate that capture (cuda.h, cuStreamBeginCapture_v2), so the pool
 * refuses such a wait with MP_EBUSY. The create made the default stream's
 * slot before any use, so a host pool used only on its own non-blocking
 * streams refused every trim and destroy while any blocking stream
 * captured, where a device pool used the same way trims. */
#include <criterion/criterion.h>

#include <cuda.h>
#include <mempool/host_pool.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"
/* Only its driver entry points (capcu) are used here, not its capture on
 * another thread. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "capture_beside.h"
#pragma GCC diagnostic pop
#include "fakecuda_test.h"

static mp_device_t *dev;
static mp_host_pool_t *hp;
static mp_stream_t a; /* non-blocking (mp_stream_create on CUDA) */
static CUstream k;    /* blocking: it waits for the legacy stream */

static void setup(void) {
  capture_load();
  dev = open_dev("cuda");
  cr_assert_eq(mp_host_pool_create(dev, NULL, &hp), MP_OK, "%s",
               mp_last_error());
  CUcontext c;
  cr_assert_eq(capcu.retain(&c, 0), CUDA_SUCCESS);
  cr_assert_eq(capcu.push(c), CUDA_SUCCESS);
  cr_assert_eq(mp_stream_create(dev, &a), MP_OK, "%s", mp_last_error());
  cr_assert_eq(capcu.create(&k, CU_STREAM_DEFAULT), CUDA_SUCCESS);
}

static void teardown(void) {
  cr_expect_eq(mp_stream_destroy(dev, a), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_stream_forget(dev, (mp_stream_t)k), MP_OK);
  cr_expect_eq(capcu.destroy(k), CUDA_SUCCESS);
  cr_expect_eq(capcu.pop(NULL), CUDA_SUCCESS);
  cr_expect_eq(capcu.release(0), CUDA_SUCCESS);
  mp_device_close(dev);
}

TestSuite(host_pool_unused_default_stream, .init = setup, .fini = teardown);

/* A 4 MiB buffer used on s and freed, then a relaxed capture on k. */
static void used_on_then_capture(mp_stream_t s) {
  void *p = NULL;
  cr_assert_eq(mp_host_pool_alloc(hp, 4u << 20, s, &p), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_host_pool_free(hp, p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(capcu.begin(k, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
}

/* cuStreamEndCapture's answer on k (the graph destroyed). */
static CUresult capture_end(void) {
  CUgraph g = NULL;
  CUresult end = capcu.end(k, &g);
  if (g != NULL)
    cr_assert_eq(capcu.graph_destroy(g), CUDA_SUCCESS);
  return end;
}

Test(host_pool_unused_default_stream, trim_beside_a_blocking_capture) {
  used_on_then_capture(a);
  mp_status_t trim = mp_host_pool_trim(hp, 0);
  cr_expect_eq(capture_end(), CUDA_SUCCESS, "the pool invalidated the capture");
  cr_expect_eq(trim, MP_OK, "%s", mp_last_error());
  mp_stats_t st;
  cr_assert_eq(mp_host_pool_get_stats(hp, &st), MP_OK);
  cr_expect_eq(st.reserved_bytes, 0);
  cr_expect_eq(mp_host_pool_destroy(hp), MP_OK, "%s", mp_last_error());
}

Test(host_pool_unused_default_stream, destroy_beside_a_blocking_capture) {
  used_on_then_capture(a);
  mp_status_t destroy = mp_host_pool_destroy(hp);
  cr_expect_eq(capture_end(), CUDA_SUCCESS, "the pool invalidated the capture");
  cr_expect_eq(destroy, MP_OK, "%s", mp_last_error());
  if (destroy != MP_OK)
    cr_expect_eq(mp_host_pool_destroy(hp), MP_OK, "%s", mp_last_error());
}

/* Once a buffer was used on the default stream, the pool waits for it as
 * for any stream, and refuses while a blocking stream captures. */
Test(host_pool_unused_default_stream, once_used_it_is_waited_for) {
  used_on_then_capture(NULL);
  mp_status_t trim = mp_host_pool_trim(hp, 0);
  cr_expect_eq(capture_end(), CUDA_SUCCESS, "the pool invalidated the capture");
  cr_expect_eq(trim, MP_EBUSY, "%s", mp_status_name(trim));
  cr_expect_eq(mp_host_pool_trim(hp, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_host_pool_destroy(hp), MP_OK, "%s", mp_last_error());
}
