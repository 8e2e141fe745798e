/* pt_device.h - a fake device with one handle that names a per-thread
 * default stream (a different stream in every thread, as CUDA's
 * CU_STREAM_PER_THREAD), and a pool of it that already holds a per-thread
 * slot. */
#ifndef MEMPOOL_TEST_PT_DEVICE_H
#define MEMPOOL_TEST_PT_DEVICE_H

#include <criterion/criterion.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define PT_STREAM ((mp_stream_t)0x70)
static inline int pt_kind(mp_device_t *d, mp_stream_t s) {
  (void)d;
  return s == PT_STREAM ? MP__STREAM_PER_THREAD : MP__STREAM_SHARED;
}

static inline mp_device_t *pt_device(void) {
  static mp__backend_t ops;
  mp_device_t *d = fake_open((size_t)1 << 30, 0);
  ops = *d->ops;
  ops.stream_kind = pt_kind;
  d->ops = &ops;
  return d;
}

/* A pool of d with a per-thread slot (its block freed): the process's list
 * of such pools has room then, so that host-memory faults land in the
 * table of the next pool. */
static inline mp_pool_t *pt_pool_first(mp_device_t *d) {
  mp_pool_t *p0 = make_pool(d, NULL);
  void *x;
  cr_assert_eq(mp_pool_alloc(p0, 4096, PT_STREAM, &x), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(p0, x), MP_OK, "%s", mp_last_error());
  return p0;
}

#endif
