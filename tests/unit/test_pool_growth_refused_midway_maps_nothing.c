/* test_pool_growth_refused_midway_maps_nothing.c - a growth of the virtual
 * range in pieces (map_piece) that the device refuses part-way: the
 * allocation fails and leaves the pool's reserved memory, and the device's,
 * where they were (pool.h: a call that fails changes nothing but counters
 * and the cache it gave back). Before, the pieces mapped before the refusal
 * stayed the pool's as free memory: a 40 MiB request on a device with
 * 16 MiB left failed holding all 16 MiB, which no other allocator of the
 * device could then get. */
#include <criterion/criterion.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

/* A pool on a fake device with 2 MiB granules, one live block of live
 * bytes, then a device of room bytes beyond what it holds. */
static mp_pool_t *pool_with_room(mp_device_t *dev, const char *opts,
                                 size_t live, size_t room, void **b) {
  mp_pool_t *p = make_pool(dev, opts);
  cr_assert_eq(mp_pool_alloc(p, live, NULL, b), MP_OK, "%s", mp_last_error());
  fake_of(dev)->capacity = fake_of(dev)->used + room;
  return p;
}

/* bytes asked of a pool whose device has room for less: MP_ENOMEM, and
 * reserved and the device's use as before the call. */
static void refused_midway(mp_device_t *dev, mp_pool_t *p, size_t bytes) {
  fake_dev_t *f = fake_of(dev);
  size_t reserved = stats(p).reserved_bytes, used = f->used;
  unsigned maps = f->maps;
  void *x = NULL;
  cr_expect_eq(mp_pool_alloc(p, bytes, NULL, &x), MP_ENOMEM, "%s",
               mp_last_error());
  cr_expect_null(x);
  cr_expect_gt(f->maps, maps, "some pieces were mapped before the refusal");
  cr_expect(strstr(mp_last_error(), "out of") != NULL, "%s", mp_last_error());
  cr_expect_eq(stats(p).reserved_bytes, reserved, "%zu bytes reserved",
               stats(p).reserved_bytes);
  cr_expect_eq(f->used, used, "%zu bytes held on the device", f->used);
  check(p);
}

Test(pool_growth_refused_midway, the_pieces_mapped_go_back) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  void *b;
  mp_pool_t *p = pool_with_room(dev, "map_piece=2M", 4 * MiB, 16 * MiB, &b);
  refused_midway(dev, p, 40 * MiB);
  /* The room is still there for a request it holds. */
  void *x;
  cr_expect_eq(mp_pool_alloc(p, 16 * MiB, NULL, &x), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_free(p, x), MP_OK);
  cr_expect_eq(mp_pool_free(p, b), MP_OK);
  fake_pool_finish(p, dev);
}

/* With free memory cached besides: what the failed call leaves reserved
 * is at most what was reserved before it (the ladder may give the cache
 * back too), never more. */
Test(pool_growth_refused_midway, with_a_cache_reserved_never_rises) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  void *b, *c;
  mp_pool_t *p = pool_with_room(dev, "map_piece=2M", 4 * MiB, 64 * MiB, &b);
  cr_assert_eq(mp_pool_alloc(p, 8 * MiB, NULL, &c), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(p, c), MP_OK);
  fake_dev_t *f = fake_of(dev);
  f->capacity = f->used + 10 * MiB;
  size_t reserved = stats(p).reserved_bytes, used = f->used;
  void *x = NULL;
  cr_expect_eq(mp_pool_alloc(p, 40 * MiB, NULL, &x), MP_ENOMEM, "%s",
               mp_last_error());
  cr_expect_leq(stats(p).reserved_bytes, reserved, "%zu bytes reserved",
                stats(p).reserved_bytes);
  cr_expect_leq(f->used, used, "%zu bytes held on the device", f->used);
  check(p);
  cr_expect_eq(mp_pool_free(p, b), MP_OK);
  fake_pool_finish(p, dev);
}
