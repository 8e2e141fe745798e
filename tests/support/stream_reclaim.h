/* stream_reclaim.h - growth past the peak in a pool used from two streams,
 * in one scenario shared by the host-device tests
 * (integration/test_pool_vm_holes.c) and their strict-fake-driver / GPU
 * twins (fakecuda/test_cuda_pool_rules.c).
 *
 * Four blocks of C bytes, each one C-byte chunk of the pool's virtual
 * range: v[1] on s2, the others on s1. v[1] is freed on s2, then a 2C
 * request on s1 finds no free block that holds it and must grow past the
 * peak (4C). Where s2 is idle (synchronized), v[1]'s chunk goes back first
 * and the peak is 5C; where s2 is held behind a gate, the chunk stays (its
 * work may still use it), the allocation does not wait for s2, and the
 * peak is 6C.
 *
 * C is the pool's smallest growth (include/mempool/pool.h: segment_bytes,
 * 2 MiB by default, rounded to the granule), read from the pool itself:
 * what its first, one-byte allocation reserved. So the twin holds on a GPU
 * whose granule is not 2 MiB without this header asking the driver as the
 * library does. The pool must be new and empty. */
#ifndef MEMPOOL_TEST_STREAM_RECLAIM_H
#define MEMPOOL_TEST_STREAM_RECLAIM_H

#include <criterion/criterion.h>
#include <stdint.h>

#include <mempool/mempool.h>

#include "stream_gate.h"

/* The bytes pool p's first growth reserves (C above), on stream s: a
 * one-byte allocation's, given back to the cache at once. */
static inline size_t reclaim_chunk(mp_pool_t *p, mp_stream_t s) {
  void *b;
  mp_stats_t st;
  cr_assert_eq(mp_pool_alloc(p, 1, s, &b), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_get_stats(p, &st), MP_OK);
  cr_assert_eq(mp_pool_free(p, b), MP_OK);
  return st.reserved_bytes;
}

/* held: NULL to synchronize s2 after the free, else the gate s2 waits on
 * (opened here once the allocation returned). */
static inline void
reclaim_past_a_chunk_freed_on_another_stream(mp_pool_t *p, mp_device_t *dev,
                                             mp_stream_t s1, mp_stream_t s2,
                                             gate_t *held) {
  const size_t c = reclaim_chunk(p, s1);
  cr_assert(c >= ((size_t)2 << 20), "a first growth of %zu bytes", c);
  void *v[4], *x;
  mp_stats_t st;
  for (int i = 0; i < 4; i++)
    cr_assert_eq(mp_pool_alloc(p, c, i == 1 ? s2 : s1, &v[i]), MP_OK, "%s",
                 mp_last_error());
  for (int i = 1; i < 4; i++)
    cr_assert_eq((uintptr_t)v[i], (uintptr_t)v[i - 1] + c,
                 "not four adjacent chunks of %zu bytes", c);
  cr_assert_eq(mp_pool_get_stats(p, &st), MP_OK);
  cr_assert_eq(st.reserved_bytes, 4 * c);
  if (held != NULL) {
    /* Work on v[1] held back: its chunk must stay mapped until it ran (a
     * GPU faults on an unmap under it; the strict fake stops there). */
    cr_assert_eq(mp_stream_launch_host(dev, s2, gate_wait, held), MP_OK);
    cr_assert_eq(mp_memset_async(dev, v[1], 1, c, s2), MP_OK);
  }
  cr_assert_eq(mp_pool_free(p, v[1]), MP_OK);
  if (held == NULL)
    cr_assert_eq(mp_stream_synchronize(dev, s2), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 2 * c, s1, &x), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_get_stats(p, &st), MP_OK);
  if (held != NULL) {
    pthread_mutex_lock(&held->mu);
    bool was_open = held->open;
    pthread_mutex_unlock(&held->mu);
    gate_open(held);
    cr_expect(!was_open, "the allocation waited for the busy stream");
    cr_expect_eq(st.device_free_count, 0, "a busy stream's chunk went back");
    cr_expect_eq(st.peak_reserved_bytes, 6 * c);
  } else {
    cr_expect_eq(st.device_free_count, 1, "v[1]'s chunk went back first");
    cr_expect_eq(st.reserved_bytes, 5 * c);
    cr_expect_eq(st.peak_reserved_bytes, 5 * c,
                 "without the reclaim the peak is 6 chunks");
  }
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_expect_eq(mp_pool_check(p), MP_OK, "%s", mp_last_error());
  for (int i = 0; i < 4; i++)
    if (i != 1)
      cr_assert_eq(mp_pool_free(p, v[i]), MP_OK);
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
}

#endif
