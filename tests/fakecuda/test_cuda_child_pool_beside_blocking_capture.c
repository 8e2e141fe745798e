/* A child pool made before another thread begins a capture on a blocking
 * stream (global mode) serves its other streams during that capture: its
 * range, given by the parent on the NULL stream, starts settled there. The
 * legacy stream can be neither asked nor recorded on while a blocking
 * stream captures (cuStreamIsCapturing answers
 * CUDA_ERROR_STREAM_CAPTURE_IMPLICIT; work there would invalidate the
 * capture, cuda.h), so a range left to be asked about on first use was
 * refused as "child pool full" with all of it free. */
#include <stdint.h>

#include <cuda.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "capture_beside.h"
#include "fakecuda_test.h"

#define MiB ((size_t)1 << 20)

static mp_device_t *dev;
static mp_pool_t *pool, *child;
static mp_stream_t s;
static char why[512];

static void setup(void) {
  dev = open_dev("cuda");
  cr_assert_eq(mp_pool_create(dev, NULL, &pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
}

static void teardown(void) {
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

/* A MiB of the child on s, freed again; the failure's message in why. */
static mp_status_t use_child(void) {
  void *p = NULL;
  mp_status_t st = mp_pool_alloc(child, MiB, s, &p);
  if (st == MP_OK)
    st = mp_pool_free(child, p);
  snprintf(why, sizeof why, "%s", st == MP_OK ? "" : mp_last_error());
  return st;
}

/* The capture of capture_beside.h, on a blocking stream: begun, held until
 * stage 2, ended. */
static void *capture_blocking(void *p) {
  capture_t *c = p;
  CUstream cs = capture_begin_with(0, CU_STREAM_CAPTURE_MODE_GLOBAL);
  for (atomic_store(&c->stage, 1); atomic_load(&c->stage) != 2;)
    usleep(1000);
  c->end = capture_end_here(cs);
  return NULL;
}

Test(cuda_child_pool_beside_blocking_capture,
     a_child_made_before_serves_other_streams_during_the_capture, .init = setup,
     .fini = teardown) {
  cr_assert_eq(mp_pool_create_child(pool, 4 * MiB, &child), MP_OK, "%s",
               mp_last_error());
  capture_t cap = {.end = CUDA_ERROR_UNKNOWN};
  capture_load();
  atomic_init(&cap.stage, 0);
  cr_assert_eq(pthread_create(&cap.thread, NULL, capture_blocking, &cap), 0);
  while (atomic_load(&cap.stage) != 1)
    usleep(1000);
  cap.refused = capture_errors(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  mp_status_t st = use_child();
  capture_finish(&cap);
  cr_assert_eq(st, MP_OK, "the child's free range refused: %s", why);
  cr_assert_eq(mp_pool_check(child), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(child), MP_OK, "%s", mp_last_error());
}

/* Beside a capture on a non-blocking stream the legacy stream stays free
 * to ask: a child made during it serves other streams at once, and its
 * destroy, which waits for the NULL stream, leaves the capture valid. */
Test(cuda_child_pool_beside_blocking_capture,
     a_child_made_beside_a_non_blocking_capture_serves_other_streams,
     .init = setup, .fini = teardown) {
  capture_t cap;
  capture_start(&cap);
  mp_status_t st = mp_pool_create_child(pool, 4 * MiB, &child);
  if (st == MP_OK)
    st = use_child();
  if (st == MP_OK)
    st = mp_pool_destroy(child);
  if (st != MP_OK && why[0] == '\0')
    snprintf(why, sizeof why, "%s", mp_last_error());
  capture_finish(&cap);
  cr_assert_eq(st, MP_OK, "%s", why);
}
