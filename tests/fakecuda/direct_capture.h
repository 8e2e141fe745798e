/* direct_capture.h - what the tests of the direct allocator beside a
 * capture that reach mempool's internals (unit/) share: the driver's
 * capture entry points (capture_beside.h's capcu) and device 0 of the
 * fake with 64 MiB. */
#ifndef MEMPOOL_TEST_DIRECT_CAPTURE_H
#define MEMPOOL_TEST_DIRECT_CAPTURE_H

#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <mempool/mempool.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "capture_beside.h"
#pragma GCC diagnostic pop
#include "../support/device_helpers.h"
#include "device/backend.h"

/* Criterion's .init: the fake's device read at cuInit, capcu loaded. */
static void direct_capture_init(void) {
  setenv("FAKECUDA_DEVICE", "capacity=64M", 1);
  capture_load();
}

/* The blocks d keeps freed for its next session. */
static size_t deferred_blocks(mp_direct_t *d) {
  mp_stats_t s;
  cr_assert_eq(mp_direct_get_stats(d, &s), MP_OK, "%s", mp_last_error());
  return s.free_blocks;
}

/* A direct allocator on dev with one block freed, its session not ended. */
static mp_direct_t *one_deferred(mp_device_t *dev) {
  mp_direct_t *d = NULL;
  cr_assert_eq(mp_direct_create(dev, &d), MP_OK, "%s", mp_last_error());
  void *p = NULL;
  cr_assert_eq(mp_direct_alloc(d, 1 << 20, NULL, &p), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_direct_free(d, p), MP_OK, "%s", mp_last_error());
  return d;
}

/* mp_direct_free_session(d) beside a capture: its answer, its message in
 * why; neither a device synchronization nor free_fn (the device's free)
 * reached the driver (where the fake counts). */
static mp_status_t session_beside(mp_direct_t *d, const char *free_fn,
                                  char *why, size_t n) {
  if (!fk_is_real())
    fk_reset_calls();
  mp_status_t st = mp_direct_free_session(d);
  snprintf(why, n, "%s", mp_last_error());
  fk_assert_calls("cuCtxSynchronize", 0);
  fk_assert_calls(free_fn, 0);
  return st;
}

#endif /* MEMPOOL_TEST_DIRECT_CAPTURE_H */
