/* Growth in the virtual range maps a step (segment_bytes, or reserved/128
 * up to 16 MiB) where the request lacks less. When the device has less
 * free than the step but enough for what the request lacks (another
 * process or pool holds the rest), the growth maps that exact need
 * instead of failing the allocation as out of memory. On the synchronous
 * fake device; the other user's memory is its `used` raised. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

/* A pool whose growth step is 16 MiB on a 256 MiB fake device. */
static mp_pool_t *step_pool(mp_device_t **dev, const char *more) {
  char opts[128];
  snprintf(opts, sizeof opts, "segment_bytes=16M%s", more);
  *dev = fake_open((size_t)256 << 20, 2 * MiB);
  return make_pool(*dev, opts);
}

/* Leaves `left` bytes of the device free for the pool; returns what
 * another user now holds. */
static size_t others_take(mp_device_t *dev, size_t left) {
  fake_dev_t *f = fake_of(dev);
  size_t other = f->capacity - f->used - left;
  f->used += other;
  return other;
}

static void others_give_back(mp_device_t *dev, size_t other) {
  fake_of(dev)->used -= other;
}

/* The top: 2 MiB asked, a 16 MiB step refused, 3 MiB are free. */
static void at_the_top(const char *more, unsigned maps) {
  mp_device_t *dev;
  mp_pool_t *p = step_pool(&dev, more);
  size_t other = others_take(dev, 3 * MiB);
  void *a;
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &a), MP_OK, "%s",
               mp_last_error());
  memset(a, 0x5a, 2 * MiB);
  mp_stats_t s = stats(p);
  cr_expect_eq(s.reserved_bytes, 2 * MiB);
  cr_expect_eq(s.segment_count, 1);
  cr_expect_eq(s.device_alloc_count, 1);
  cr_expect_eq(s.oom_count, 0);
  cr_expect_eq(fake_of(dev)->maps, maps);
  check(p);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  others_give_back(dev, other);
  fake_pool_finish(p, dev);
}

Test(pool_vrange_step_refused, the_top_maps_the_exact_need) {
  at_the_top("", 1);
}

Test(pool_vrange_step_refused, the_top_maps_the_exact_need_in_pieces) {
  /* 4 MiB pieces: the first (of the 16 MiB step) is refused too. */
  at_the_top(",map_piece=4M", 1);
}

/* Pieces of the step mapped before the refusal that already hold the
 * request: the growth ends there, successful, with what it mapped (its
 * caller, not the out-of-memory ladder, finds the block). */
Test(pool_vrange_step_refused, pieces_that_hold_the_request_are_enough) {
  mp_device_t *dev;
  mp_pool_t *p = step_pool(&dev, ",map_piece=2M");
  size_t other = others_take(dev, 6 * MiB);
  mp__pool_lock(p);
  mp__block_t *fresh = NULL;
  mp_status_t st = mp__segment_grow(p, 4 * MiB, UINT32_MAX, &fresh);
  mp__pool_unlock(p);
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  cr_assert_neq(fresh, NULL);
  cr_expect_eq(fresh->size, 6 * MiB);
  mp_stats_t s = stats(p);
  cr_expect_eq(s.reserved_bytes, 6 * MiB);
  cr_expect_eq(s.free_bytes, 6 * MiB);
  cr_expect_eq(s.segment_count, 3);
  cr_expect_eq(s.device_alloc_count, 3);
  check(p);
  void *a;
  cr_assert_eq(mp_pool_alloc(p, 4 * MiB, NULL, &a), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(fake_of(dev)->maps, 3);
  memset(a, 0x5a, 4 * MiB);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  others_give_back(dev, other);
  fake_pool_finish(p, dev);
}

/* In a hole, against the free block above it (the placement maps down
 * from the hole's end): the exact need goes there too, joining that block.
 * Layout, 16 MiB chunks: [X live] [hole] [Z free 8 MiB | W live 8 MiB]. */
Test(pool_vrange_step_refused, a_hole_maps_the_exact_need_below_its_free_top) {
  mp_device_t *dev;
  mp_pool_t *p = step_pool(&dev, "");
  enum { X, Y, Z, W, N };
  const size_t size[N] = {16 * MiB, 16 * MiB, 8 * MiB, 8 * MiB};
  void *b[N];
  for (int i = 0; i < N; i++) {
    cr_assert_eq(mp_pool_alloc(p, size[i], NULL, &b[i]), MP_OK);
    if (i > 0)
      cr_assert_eq((char *)b[i], (char *)b[i - 1] + size[i - 1]);
  }
  void *x = b[X], *y = b[Y], *z = b[Z], *w = b[W];
  cr_assert_eq(stats(p).reserved_bytes, 48 * MiB);
  cr_assert_eq(mp_pool_free(p, y), MP_OK);
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK);
  cr_assert_eq(stats(p).reserved_bytes, 32 * MiB);
  cr_assert_eq(mp_pool_free(p, z), MP_OK);
  check(p);
  size_t other = others_take(dev, 4 * MiB);
  unsigned maps = fake_of(dev)->maps;
  void *a;
  cr_assert_eq(mp_pool_alloc(p, 10 * MiB, NULL, &a), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(a, (char *)z - 2 * MiB, "placed at %p, Z at %p", a, z);
  memset(a, 0x5a, 10 * MiB);
  mp_stats_t s = stats(p);
  cr_expect_eq(s.reserved_bytes, 34 * MiB);
  cr_expect_eq(s.segment_count, 3);
  cr_expect_eq(s.oom_count, 0);
  cr_expect_eq(fake_of(dev)->maps, maps + 1);
  check(p);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  cr_assert_eq(mp_pool_free(p, w), MP_OK);
  others_give_back(dev, other);
  fake_pool_finish(p, dev);
}
