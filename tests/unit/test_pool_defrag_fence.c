/* Defragmentation leaves what lies below a freeze's fence where it is
 * (pool.h, mp_pool_freeze: it works only above the fence of each segment),
 * also when the block there was allocated after the freeze into frozen
 * space that was freed, and also when the whole segment could be emptied
 * into another (evacuation), with the fake device's plain segments. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "pool_fakedev.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

Test(pool_defrag_fence, a_block_below_the_fence_is_not_evacuated) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *pool = make_pool(dev, "virtual=0,segment_bytes=2M,align=512");
  mp_handle_t *m1, *fill, *n;
  void *raw, *raw2;
  /* Segment A: two movable blocks, frozen (A's fence at its top). */
  cr_assert_eq(mp_pool_alloc_movable(pool, MiB, NULL, &m1), MP_OK);
  cr_assert_eq(mp_pool_alloc_movable(pool, MiB, NULL, &fill), MP_OK);
  cr_assert_eq(mp_pool_freeze(pool), MP_OK);
  /* Segment B: raw blocks. */
  cr_assert_eq(mp_pool_alloc(pool, MiB, NULL, &raw), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, MiB, NULL, &raw2), MP_OK);
  cr_assert_eq(stats(pool).segment_count, 2);
  uintptr_t a0 = (uintptr_t)mp_handle_ptr(m1);
  cr_assert_eq(mp_handle_free(m1), MP_OK);
  cr_assert_eq(mp_handle_free(fill), MP_OK);
  /* n reuses A's frozen space, below its fence. */
  cr_assert_eq(mp_pool_alloc_movable(pool, 768 * KiB, NULL, &n), MP_OK);
  uintptr_t before = (uintptr_t)mp_handle_ptr(n);
  cr_assert(before >= a0 && before < a0 + 2 * MiB, "n is not in segment A");
  memset((void *)before, 0x5A, 768 * KiB);
  /* Room for n in B: evacuating A would now be possible. */
  cr_assert_eq(mp_pool_free(pool, raw2), MP_OK);
  size_t moved = 1;
  cr_assert_eq(mp_pool_defragment(pool, NULL, &moved), MP_OK);
  cr_expect_eq((uintptr_t)mp_handle_ptr(n), before,
               "a block below its segment's fence moved to %p",
               mp_handle_ptr(n));
  cr_expect_eq(moved, 0);
  cr_expect_eq(((unsigned char *)mp_handle_ptr(n))[0], 0x5A);
  check(pool);
  cr_assert_eq(mp_handle_free(n), MP_OK);
  cr_assert_eq(mp_pool_free(pool, raw), MP_OK);
  fake_pool_finish(pool, dev);
}

/* Segment A's top frozen block freed joins A's free space above the fence
 * into one free block that starts below it. The part above the fence is
 * still space defragmentation uses: segment B, holding one movable block
 * that fits there, is emptied into it (and trim gives B back). */
Test(pool_defrag_fence, a_freed_top_frozen_block_still_takes_evacuated_blocks) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *pool = make_pool(dev, "virtual=0,segment_bytes=2M,align=512");
  mp_handle_t *low, *top, *x;
  void *tail;
  /* Segment A: two movable blocks, frozen; its fence is 1.5 MiB up. */
  cr_assert_eq(mp_pool_alloc_movable(pool, MiB, NULL, &low), MP_OK);
  cr_assert_eq(mp_pool_alloc_movable(pool, MiB / 2, NULL, &top), MP_OK);
  cr_assert_eq(mp_pool_freeze(pool), MP_OK);
  uintptr_t fence = (uintptr_t)mp_handle_ptr(top) + MiB / 2;
  /* A's tail taken for now, so that x goes to segment B. */
  cr_assert_eq(mp_pool_alloc(pool, MiB / 2, NULL, &tail), MP_OK);
  cr_assert_eq((uintptr_t)tail, fence);
  cr_assert_eq(mp_pool_alloc_movable(pool, MiB / 2, NULL, &x), MP_OK);
  cr_assert_eq(stats(pool).segment_count, 2);
  memset(mp_handle_ptr(x), 0x3C, MiB / 2);
  cr_assert_eq(mp_pool_free(pool, tail), MP_OK);
  cr_assert_eq(mp_handle_free(top), MP_OK);
  check(pool);
  size_t moved = 0;
  cr_assert_eq(mp_pool_defragment(pool, NULL, &moved), MP_OK, "%s",
               mp_last_error());
  check(pool);
  cr_expect_eq(moved, MiB / 2);
  cr_expect_eq((uintptr_t)mp_handle_ptr(x), fence,
               "x stayed at %p; the space above A's fence starts at %p",
               mp_handle_ptr(x), (void *)fence);
  cr_expect_eq(((unsigned char *)mp_handle_ptr(x))[MiB / 2 - 1], 0x3C);
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK);
  cr_expect_eq(stats(pool).segment_count, 1, "segment B was not emptied");
  /* Below the fence the space stays free and serves allocations. */
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, MiB / 2, NULL, &p), MP_OK);
  cr_expect_eq((uintptr_t)p, fence - MiB / 2);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_handle_free(x), MP_OK);
  cr_assert_eq(mp_handle_free(low), MP_OK);
  fake_pool_finish(pool, dev);
}
