/* test_pool_vrange_plain_fallback_refused.c - a virtual pool near its cap
 * where a whole granule no longer fits but the request does grows by a
 * plain segment of the request's size (vrange.c, mp__vrange_grow). Where
 * the device refuses that segment (out of memory: another user holds the
 * rest of it), the allocation fails as out of device memory, the device's
 * answer: the request fits under the cap. Before, it answered MP_ELIMIT,
 * "pool max_bytes", a cap the request was within. On the synchronous fake
 * device (2 MiB granules); the other user's memory is its `used` raised. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

/* A pool capped at 3 MiB holding a live 2 MiB chunk: 1 MiB left under
 * the cap, less than a granule. */
static mp_pool_t *near_the_cap(mp_device_t **dev, void **live) {
  *dev = fake_open((size_t)256 << 20, 2 * MiB);
  mp_pool_t *p = make_pool(*dev, "max_bytes=3M,segment_bytes=2M");
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, live), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(stats(p).reserved_bytes, 2 * MiB);
  return p;
}

Test(pool_vrange_plain_fallback_refused, the_device_refusal_is_out_of_memory) {
  mp_device_t *dev;
  void *live;
  mp_pool_t *p = near_the_cap(&dev, &live);
  fake_dev_t *f = fake_of(dev);
  size_t other = f->capacity - f->used;
  f->used += other;
  void *a = NULL;
  mp_status_t st = mp_pool_alloc(p, 512 << 10, NULL, &a);
  cr_expect_eq(st, MP_ENOMEM, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect_eq(a, NULL);
  cr_expect(strstr(mp_last_error(), "max_bytes") == NULL, "%s",
            mp_last_error());
  mp_stats_t s = stats(p);
  cr_expect_eq(s.reserved_bytes, 2 * MiB);
  cr_expect_eq(s.oom_count, 1);
  check(p);
  /* With the device's memory back, the plain segment is had. */
  f->used -= other;
  cr_assert_eq(mp_pool_alloc(p, 512 << 10, NULL, &a), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(stats(p).reserved_bytes, 2 * MiB + (512 << 10));
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  cr_assert_eq(mp_pool_free(p, live), MP_OK);
  fake_pool_finish(p, dev);
}

/* Past the cap it is still the cap's answer. */
Test(pool_vrange_plain_fallback_refused, past_the_cap_is_still_the_limit) {
  mp_device_t *dev;
  void *live;
  mp_pool_t *p = near_the_cap(&dev, &live);
  void *a = NULL;
  mp_status_t st = mp_pool_alloc(p, 2 * MiB, NULL, &a);
  cr_expect_eq(st, MP_ELIMIT, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect_eq(stats(p).reserved_bytes, 2 * MiB);
  cr_assert_eq(mp_pool_free(p, live), MP_OK);
  fake_pool_finish(p, dev);
}
