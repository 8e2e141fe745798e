/* A history's segment_alloc, segment_map and segment_unmap events say the
 * stream of the request that grew the pool (segment_unmap: that its chunk
 * was mapped for), as PyTorch's trace entries do (CUDACachingAllocator.cpp:
 * record_trace(SEGMENT_ALLOC / SEGMENT_MAP, ..., p.stream()); a snapshot's
 * device_traces entry writes it as "stream"). Every one said 0. A trim's
 * segment_unmap says the chunk's stream too: PyTorch's unmap_block records
 * block->stream, the expandable segment's, whatever released it (it said
 * 0 here, and this test asserted so, until 2026-12-07:
 * test_pool_history_unmap_says_made_for_stream). */
#include <criterion/criterion.h>
#include <stdint.h>

#include "../support/history_events.h"
#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_history_segment_event_stream, "host:capacity=64M");

Test(pool_history_segment_event_stream, a_plain_segment_says_its_stream) {
  mp_stream_t s1;
  cr_assert_eq(mp_stream_create(dev, &s1), MP_OK, "%s", mp_last_error());
  mp_pool_t *pool = make_pool(dev, "virtual=0,history=64");
  void *a;
  cr_assert_eq(mp_pool_alloc(pool, 4096, s1, &a), MP_OK, "%s", mp_last_error());
  uintptr_t got[4];
  cr_assert_eq(history_events_of(pool, MP__H_SEGMENT_ALLOC, got, 4), 1);
  cr_expect_eq(got[0], (uintptr_t)s1, "segment_alloc says %#lx",
               (unsigned long)got[0]);
  cr_assert_eq(mp_pool_free(pool, a), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s1), MP_OK);
}

Test(pool_history_segment_event_stream, a_map_and_a_growths_unmap_say_its) {
  mp_stream_t s1;
  cr_assert_eq(mp_stream_create(dev, &s1), MP_OK, "%s", mp_last_error());
  mp_pool_t *pool = make_pool(dev, "virtual=1,history=256");
  void *a, *b, *d;
  cr_assert_eq(mp_pool_alloc(pool, 8 * MiB, s1, &a), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, 8 * MiB, s1, &b), MP_OK, "%s",
               mp_last_error());
  uintptr_t got[64];
  size_t maps = history_events_of(pool, MP__H_SEGMENT_MAP, got, 64);
  cr_assert_gt(maps, 0, "the test needs a virtual range");
  for (size_t i = 0; i < maps && i < 64; i++)
    cr_expect_eq(got[i], (uintptr_t)s1, "segment_map %zu says %#lx", i,
                 (unsigned long)got[i]);
  /* d's growth would lift reserved past its peak: it unmaps a's free
   * chunk first (vrange.c, the reclaim rung), for d's request on s1. */
  cr_assert_eq(mp_pool_free(pool, a), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, 12 * MiB, s1, &d), MP_OK, "%s",
               mp_last_error());
  size_t unmaps = history_events_of(pool, MP__H_SEGMENT_UNMAP, got, 64);
  cr_assert_gt(unmaps, 0, "the growth unmapped nothing");
  for (size_t i = 0; i < unmaps && i < 64; i++)
    cr_expect_eq(got[i], (uintptr_t)s1, "the growth's segment_unmap says %#lx",
                 (unsigned long)got[i]);
  /* d's chunk goes back at a trim: the stream it was mapped for, s1. */
  cr_assert_eq(mp_pool_free(pool, d), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  size_t all = history_events_of(pool, MP__H_SEGMENT_UNMAP, got, 64);
  cr_assert_gt(all, unmaps, "the trim unmapped nothing");
  for (size_t i = unmaps; i < all && i < 64; i++)
    cr_expect_eq(got[i], (uintptr_t)s1, "the trim's segment_unmap says %#lx",
                 (unsigned long)got[i]);
  cr_assert_eq(mp_pool_free(pool, b), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s1), MP_OK);
}
