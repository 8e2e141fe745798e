/* A movable block that defragmentations on several streams moved: each
 * move's copy is a use of the block only until that copy is done (pool.h,
 * mp_pool_defragment: "Copies are ordered on s"). Moved on four streams,
 * the block's record named more streams than it holds (MP__MAX_DEPS), so
 * after its free it waited for a device synchronize, which the pool makes
 * only under pressure: with every stream synchronized, an allocation on
 * another stream grew the pool instead of reusing it. */
#include <criterion/criterion.h>

#include "../support/pool_helpers.h"

#define MiB   ((size_t)1 << 20)
#define MOVES 4

MP_DEVICE_SUITE(pool_defrag_streams, "host:capacity=256M");

Test(pool_defrag_streams, a_block_moved_on_many_streams_is_reused_after_them) {
  mp_pool_t *pool = make_pool(dev, "virtual=0,segment_bytes=8M");
  mp_stream_t s[MOVES + 2];
  for (int i = 0; i < MOVES + 2; i++)
    cr_assert_eq(mp_stream_create(dev, &s[i]), MP_OK, "%s", mp_last_error());
  void *fill[MOVES];
  for (int i = 0; i < MOVES; i++)
    cr_assert_eq(mp_pool_alloc(pool, MiB, s[0], &fill[i]), MP_OK, "%s",
                 mp_last_error());
  mp_handle_t *b;
  cr_assert_eq(mp_pool_alloc_movable(pool, MiB, s[0], &b), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(stats(pool).segment_count, 1);
  uintptr_t base = (uintptr_t)fill[0];
  /* Each round frees the block below b and moves b down on a stream of
   * its own. */
  for (int k = 0; k < MOVES; k++) {
    uintptr_t was = (uintptr_t)mp_handle_ptr(b);
    cr_assert_eq(mp_pool_free(pool, fill[MOVES - 1 - k]), MP_OK);
    size_t moved = 0;
    cr_assert_eq(mp_pool_defragment(pool, s[k + 1], &moved), MP_OK, "%s",
                 mp_last_error());
    cr_assert_eq(moved, MiB, "round %d moved %zu bytes", k, moved);
    cr_assert_eq((uintptr_t)mp_handle_ptr(b), was - MiB);
  }
  cr_assert_eq((uintptr_t)mp_handle_ptr(b), base);
  cr_assert_eq(mp_handle_free(b), MP_OK, "%s", mp_last_error());
  for (int i = 0; i <= MOVES; i++)
    cr_assert_eq(mp_stream_synchronize(dev, s[i]), MP_OK);
  check(pool);
  size_t reserved = stats(pool).reserved_bytes;
  /* The whole segment, b's bytes with the rest: on a stream that used
   * none of it. */
  void *all;
  cr_assert_eq(mp_pool_alloc(pool, 8 * MiB, s[MOVES + 1], &all), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq((uintptr_t)all, base,
               "the segment was not reused: %p, not %p (reserved %zu -> %zu)",
               all, (void *)base, reserved, stats(pool).reserved_bytes);
  cr_expect_eq(stats(pool).reserved_bytes, reserved);
  check(pool);
  cr_assert_eq(mp_pool_free(pool, all), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  for (int i = 0; i < MOVES + 2; i++)
    cr_assert_eq(mp_stream_destroy(dev, s[i]), MP_OK);
}
