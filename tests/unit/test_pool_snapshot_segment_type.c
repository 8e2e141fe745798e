/* A snapshot's segment_type is "small" for a plain segment made for a
 * request of at most segment_bytes/2, the segment such requests share, as
 * PyTorch's small pool packs requests up to 1 MiB (kSmallSize) into 2 MiB
 * segments (kSmallBuffer) and its snapshot says "small" for that pool's
 * segments (CUDACachingAllocator.cpp; torch/csrc/cuda/memory_snapshot.cpp
 * writes is_large ? "large" : "small"). A segment of its own for a larger
 * request is "large" whatever its size: a 2 MiB request's 2 MiB segment
 * was "small" (the rule was the segment's size, at most segment_bytes). */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "../support/pool_helpers.h"
#include "../support/snapshot_devices.h"
#include "../support/snapshot_fields.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_snapshot_segment_type, "host:capacity=64M");

static void expect_types(mp_pool_t *pool, size_t small, size_t large) {
  size_t len;
  char *s = (char *)snapshot_bytes(pool, &len);
  cr_expect_eq(snapshot_str_count(s, len, "small"), small);
  cr_expect_eq(snapshot_str_count(s, len, "large"), large);
  free(s);
}

Test(pool_snapshot_segment_type, small_is_the_segment_small_requests_share) {
  mp_pool_t *pool = make_pool(dev, "virtual=0");
  void *a, *b, *c, *d;
  cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, MiB, NULL, &b), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, 2 * MiB, NULL, &c), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, 5 * MiB, NULL, &d), MP_OK);
  cr_assert_eq(stats(pool).segment_count, 3, "the test needs 3 segments");
  expect_types(pool, 1, 2);
  cr_assert_eq(mp_pool_free(pool, a), MP_OK);
  cr_assert_eq(mp_pool_free(pool, b), MP_OK);
  cr_assert_eq(mp_pool_free(pool, c), MP_OK);
  cr_assert_eq(mp_pool_free(pool, d), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

/* The virtual range's runs are PyTorch's expandable segments: "large". */
Test(pool_snapshot_segment_type, a_virtual_ranges_segments_are_large) {
  mp_pool_t *pool = make_pool(dev, NULL);
  void *a;
  cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, &a), MP_OK);
  expect_types(pool, 0, 1);
  cr_assert_eq(mp_pool_free(pool, a), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}
