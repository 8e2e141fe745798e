/* Every segment_unmap event of the virtual range says the stream its chunk
 * was mapped for, as PyTorch's does: unmap_block records block->stream
 * (CUDACachingAllocator.cpp: record_trace(SEGMENT_UNMAP, ..., block->stream,
 * ...)), and every block of an expandable segment is that segment's
 * stream's, whoever's release unmaps it. A trim's said 0, and a growth's
 * the stream of the request that grew the pool, though another stream's
 * chunk went. */
#include <criterion/criterion.h>
#include <stdint.h>

#include "../support/history_events.h"
#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_history_unmap_says_made_for_stream, "host:capacity=64M");

static void *alloc_on(mp_pool_t *pool, size_t size, mp_stream_t s) {
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, size, s, &p), MP_OK, "%s", mp_last_error());
  return p;
}

Test(pool_history_unmap_says_made_for_stream, a_trims_unmap) {
  mp_stream_t s1;
  cr_assert_eq(mp_stream_create(dev, &s1), MP_OK, "%s", mp_last_error());
  mp_pool_t *pool = make_pool(dev, "virtual=1,history=256");
  cr_assert_eq(mp_pool_free(pool, alloc_on(pool, 8 * MiB, s1)), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  history_events_say(pool, MP__H_SEGMENT_UNMAP, 0, (uintptr_t)s1,
                     "the trim's segment_unmap");
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s1), MP_OK);
}

Test(pool_history_unmap_says_made_for_stream, another_streams_growth) {
  mp_stream_t s1, s2;
  cr_assert_eq(mp_stream_create(dev, &s1), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_create(dev, &s2), MP_OK, "%s", mp_last_error());
  mp_pool_t *pool = make_pool(dev, "virtual=1,history=256");
  void *a = alloc_on(pool, 8 * MiB, s1), *b = alloc_on(pool, 8 * MiB, s2);
  /* d's growth on s2 would lift reserved past its peak: it unmaps a's
   * free chunk, mapped for s1, first (vrange.c, the reclaim rung). */
  cr_assert_eq(mp_pool_free(pool, a), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK, "%s", mp_last_error());
  void *d = alloc_on(pool, 12 * MiB, s2);
  history_events_say(pool, MP__H_SEGMENT_UNMAP, 0, (uintptr_t)s1,
                     "the growth's segment_unmap");
  cr_assert_eq(mp_pool_free(pool, b), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, d), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s1), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s2), MP_OK);
}
