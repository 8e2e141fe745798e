/* stream_reclaim.h - growth past the peak in a pool used from two streams,
 * in one scenario shared by the host-device tests
 * (integration/test_pool_vm_holes.c) and their strict-fake-driver / GPU
 * twins (fakecuda/test_cuda_pool_rules.c).
 *
 * Four 2 MiB blocks, each one 2 MiB chunk of the pool's virtual range: v[1]
 * on s2, the others on s1. v[1] is freed on s2, then a 4 MiB request on s1
 * finds no free block that holds it and must grow past the peak (8 MiB).
 * Where s2 is idle (synchronized), v[1]'s chunk goes back first and the
 * peak is 10 MiB; where s2 is held behind a gate, the chunk stays (its
 * work may still use it), the allocation does not wait for s2, and the
 * peak is 12 MiB. */
#ifndef MEMPOOL_TEST_STREAM_RECLAIM_H
#define MEMPOOL_TEST_STREAM_RECLAIM_H

#include <criterion/criterion.h>
#include <stdint.h>

#include <mempool/mempool.h>

#include "stream_gate.h"

/* held: NULL to synchronize s2 after the free, else the gate s2 waits on
 * (opened here once the allocation returned). */
static inline void
reclaim_past_a_chunk_freed_on_another_stream(mp_pool_t *p, mp_device_t *dev,
                                             mp_stream_t s1, mp_stream_t s2,
                                             gate_t *held) {
  const size_t mib = (size_t)1 << 20;
  void *v[4], *x;
  mp_stats_t st;
  for (int i = 0; i < 4; i++)
    cr_assert_eq(mp_pool_alloc(p, 2 * mib, i == 1 ? s2 : s1, &v[i]), MP_OK,
                 "%s", mp_last_error());
  for (int i = 1; i < 4; i++)
    cr_assert_eq((uintptr_t)v[i], (uintptr_t)v[i - 1] + 2 * mib,
                 "not four adjacent chunks");
  cr_assert_eq(mp_pool_get_stats(p, &st), MP_OK);
  cr_assert_eq(st.reserved_bytes, 8 * mib);
  if (held != NULL) {
    /* Work on v[1] held back: its chunk must stay mapped until it ran (a
     * GPU faults on an unmap under it; the strict fake stops there). */
    cr_assert_eq(mp_stream_launch_host(dev, s2, gate_wait, held), MP_OK);
    cr_assert_eq(mp_memset_async(dev, v[1], 1, 2 * mib, s2), MP_OK);
  }
  cr_assert_eq(mp_pool_free(p, v[1]), MP_OK);
  if (held == NULL)
    cr_assert_eq(mp_stream_synchronize(dev, s2), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 4 * mib, s1, &x), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_get_stats(p, &st), MP_OK);
  if (held != NULL) {
    pthread_mutex_lock(&held->mu);
    bool was_open = held->open;
    pthread_mutex_unlock(&held->mu);
    gate_open(held);
    cr_expect(!was_open, "the allocation waited for the busy stream");
    cr_expect_eq(st.device_free_count, 0, "a busy stream's chunk went back");
    cr_expect_eq(st.peak_reserved_bytes, 12 * mib);
  } else {
    cr_expect_eq(st.device_free_count, 1, "v[1]'s chunk went back first");
    cr_expect_eq(st.reserved_bytes, 10 * mib);
    cr_expect_eq(st.peak_reserved_bytes, 10 * mib,
                 "without the reclaim the peak is 12 MiB");
  }
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_expect_eq(mp_pool_check(p), MP_OK, "%s", mp_last_error());
  for (int i = 0; i < 4; i++)
    if (i != 1)
      cr_assert_eq(mp_pool_free(p, v[i]), MP_OK);
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
}

#endif
