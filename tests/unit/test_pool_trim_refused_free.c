/* test_pool_trim_refused_free.c - mp_pool_trim when the device refuses to
 * free one wholly free plain segment (pool_fakedev.h's refuse_frees): that
 * segment stays the pool's, and the trim goes on with the other free
 * segments. Before, the first refusal ended the trim: one refused free
 * kept every free segment reserved. A trim that leaves memory reserved
 * because the device refused it says so (the device's status): before, it
 * returned MP_OK, as if everything had gone back. */
#include <string.h>

#include <criterion/criterion.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

/* A plain pool on a fake device with three plain segments of 4 MiB, each
 * wholly free. */
static mp_pool_t *three_free_segments(mp_device_t *dev) {
  mp_pool_t *pool = make_pool(dev, NULL);
  void *p[3];
  for (int i = 0; i < 3; i++)
    cr_assert_eq(mp_pool_alloc(pool, 4 * MiB, NULL, &p[i]), MP_OK, "%s",
                 mp_last_error());
  for (int i = 0; i < 3; i++)
    cr_assert_eq(mp_pool_free(pool, p[i]), MP_OK);
  cr_assert_eq(stats(pool).segment_count, 3);
  cr_assert_eq(fake_of(dev)->used, 12 * MiB);
  return pool;
}

/* Trims to 0 with the device refusing the next `refused` frees, then
 * expects `left` bytes in as many 4 MiB segments still the pool's and on
 * the device, and `given` segments given back; the trim's status is
 * MP_OK when nothing is left, else the device's refusal, saying so. */
static void trim_refused(mp_device_t *dev, mp_pool_t *pool, unsigned refused,
                         size_t left, uint64_t given) {
  fake_dev_t *f = fake_of(dev);
  f->refuse_frees = refused;
  mp_status_t st = mp_pool_trim(pool, 0);
  f->refuse_frees = 0;
  if (left == 0) {
    cr_expect_eq(st, MP_OK, "%s", mp_last_error());
  } else {
    cr_expect_eq(st, MP_EDRIVER, "the trim said %s", mp_status_name(st));
    cr_expect(strstr(mp_last_error(), "mp_pool_trim: the device refused") !=
                  NULL,
              "%s", mp_last_error());
  }
  mp_stats_t s = stats(pool);
  cr_expect_eq(s.reserved_bytes, left, "%zu bytes still reserved",
               s.reserved_bytes);
  cr_expect_eq(s.segment_count, left / (4 * MiB));
  cr_expect_eq(s.device_free_count, given);
  cr_expect_eq(f->used, left, "%zu bytes still held on the device", f->used);
  check(pool);
}

/* The device refuses the first free it is asked for, and only that one:
 * the other two go, and the refused one is asked again later in the same
 * trim. */
Test(pool_trim_refused_free, one_refused_free_does_not_keep_the_others) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *pool = three_free_segments(dev);
  trim_refused(dev, pool, 1, 0, 3);
  cr_expect_eq(mp_pool_destroy(pool), MP_OK);
  fake_close(dev);
}

/* Every free refused: the trim ends, and nothing is lost or counted as
 * given back; a later trim the device allows gives everything back. */
Test(pool_trim_refused_free, a_segment_always_refused_stays_the_pools) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *pool = three_free_segments(dev);
  trim_refused(dev, pool, 1000, 12 * MiB, 0);
  trim_refused(dev, pool, 0, 0, 3);
  cr_expect_eq(mp_pool_destroy(pool), MP_OK);
  fake_close(dev);
}
