/* A segment's later events say the stream it was made for, as PyTorch's
 * trace does (its segment is one stream's: CUDACachingAllocator.cpp,
 * release_block: record_trace(SEGMENT_FREE, ..., block->stream);
 * map_block/unmap_block name the expandable segment's stream): a trim's
 * segment_free of a plain segment, and a pause's segment_unmap and a
 * resume's segment_map of the virtual range's chunks. Each said 0. */
#include <criterion/criterion.h>
#include <stdint.h>

#include "../support/history_events.h"
#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_history_segment_made_for_stream, "host:capacity=64M");

Test(pool_history_segment_made_for_stream, a_trims_segment_free) {
  mp_stream_t s1;
  cr_assert_eq(mp_stream_create(dev, &s1), MP_OK, "%s", mp_last_error());
  mp_pool_t *pool = make_pool(dev, "virtual=0,history=64");
  void *a;
  cr_assert_eq(mp_pool_alloc(pool, 4096, s1, &a), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, a), MP_OK, "%s", mp_last_error());
  mp_stream_synchronize(dev, s1);
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  uintptr_t got[4];
  cr_assert_eq(history_events_of(pool, MP__H_SEGMENT_FREE, got, 4), 1,
               "the trim freed no segment");
  cr_expect_eq(got[0], (uintptr_t)s1, "segment_free says %#lx",
               (unsigned long)got[0]);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s1), MP_OK);
}

Test(pool_history_segment_made_for_stream, a_pause_and_a_resume) {
  mp_stream_t s1;
  cr_assert_eq(mp_stream_create(dev, &s1), MP_OK, "%s", mp_last_error());
  mp_pool_t *pool = make_pool(dev, "virtual=1,pausable=1,history=256");
  void *a;
  cr_assert_eq(mp_pool_alloc(pool, 8 * MiB, s1, &a), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_pause(pool, 0), MP_OK, "%s", mp_last_error());
  uintptr_t got[64];
  size_t unmaps = history_events_of(pool, MP__H_SEGMENT_UNMAP, got, 64);
  cr_assert_gt(unmaps, 0, "the pause unmapped nothing");
  for (size_t i = 0; i < unmaps && i < 64; i++)
    cr_expect_eq(got[i], (uintptr_t)s1, "the pause's segment_unmap says %#lx",
                 (unsigned long)got[i]);
  size_t maps = history_events_of(pool, MP__H_SEGMENT_MAP, got, 64);
  cr_assert_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  size_t all = history_events_of(pool, MP__H_SEGMENT_MAP, got, 64);
  cr_assert_gt(all, maps, "the resume mapped nothing");
  for (size_t i = maps; i < all && i < 64; i++)
    cr_expect_eq(got[i], (uintptr_t)s1, "the resume's segment_map says %#lx",
                 (unsigned long)got[i]);
  cr_assert_eq(mp_pool_free(pool, a), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s1), MP_OK);
}
