/* test_pool_plain_segment_refused.c - plain growth asks the device for a
 * whole segment (segment_bytes for a small request, the request rounded up
 * to 2 MiB for a large one). When the device has less free than that but
 * enough for the request itself (another process or pool holds the rest),
 * the growth asks again for what the request needs, in whole units of the
 * device's allocation alignment, as the virtual range's growth maps the
 * exact need (test_pool_vrange_step_refused.c). Before, the allocation
 * failed as out of memory at every rung of the ladder, each growth asking
 * the same segment again. On the synchronous fake device, without virtual
 * memory; the other user's memory is its `used` raised. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

/* A plain pool whose segments are 16 MiB, on a 256 MiB device of which
 * another user holds all but `left` bytes (returned in *other). */
static mp_pool_t *crowded_pool(mp_device_t **dev, size_t left, size_t *other) {
  *dev = fake_open((size_t)256 << 20, 0);
  mp_pool_t *p = make_pool(*dev, "segment_bytes=16M");
  fake_dev_t *f = fake_of(*dev);
  *other = f->capacity - f->used - left;
  f->used += *other;
  return p;
}

/* size asked with `left` bytes free on the device: served, in a segment
 * of `seg` bytes, one device allocation made. */
static void served_from(size_t size, size_t left, size_t seg) {
  mp_device_t *dev;
  size_t other;
  mp_pool_t *p = crowded_pool(&dev, left, &other);
  void *a;
  cr_assert_eq(mp_pool_alloc(p, size, NULL, &a), MP_OK, "%s: %s",
               mp_status_name(mp_last_status()), mp_last_error());
  memset(a, 0x5a, size);
  mp_stats_t s = stats(p);
  cr_expect_eq(s.reserved_bytes, seg, "reserved %zu", s.reserved_bytes);
  cr_expect_eq(s.segment_count, 1);
  cr_expect_eq(s.device_alloc_count, 1);
  cr_expect_eq(s.oom_count, 0);
  check(p);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  fake_of(dev)->used -= other;
  fake_pool_finish(p, dev);
}

Test(pool_plain_segment_refused, a_small_request_gets_a_segment_of_its_size) {
  /* 16 MiB refused, 3 MiB free: 2 MiB asked. */
  served_from(2 * MiB, 3 * MiB, 2 * MiB);
}

Test(pool_plain_segment_refused, rounded_to_the_device_alignment) {
  /* 1 MiB and 100 bytes: whole 4 KiB units. */
  served_from(MiB + 100, 3 * MiB, MiB + 4096);
}

Test(pool_plain_segment_refused, a_large_request_gets_its_own_size) {
  /* 9 MiB rounds up to 10 MiB, refused; 9.5 MiB free. */
  served_from(9 * MiB, 9 * MiB + MiB / 2, 9 * MiB);
}

/* What the device cannot hold even at the request's size is still out of
 * device memory, nothing held afterwards. */
Test(pool_plain_segment_refused, too_little_for_the_request_is_still_refused) {
  mp_device_t *dev;
  size_t other;
  mp_pool_t *p = crowded_pool(&dev, MiB, &other);
  void *a = NULL;
  cr_expect_eq(mp_pool_alloc(p, 2 * MiB, NULL, &a), MP_ENOMEM, "%s",
               mp_last_error());
  cr_expect_eq(a, NULL);
  mp_stats_t s = stats(p);
  cr_expect_eq(s.reserved_bytes, 0);
  cr_expect_eq(s.segment_count, 0);
  cr_expect_eq(s.device_alloc_count, 0);
  cr_expect_eq(s.oom_count, 1);
  cr_expect_eq(fake_of(dev)->used, other);
  fake_of(dev)->used -= other;
  fake_pool_finish(p, dev);
}

/* Once the device has room again, a small request after one served at its
 * own size gets a whole segment, which the next small ones share. */
Test(pool_plain_segment_refused, later_growth_asks_whole_segments_again) {
  mp_device_t *dev;
  size_t other;
  mp_pool_t *p = crowded_pool(&dev, 3 * MiB, &other);
  void *a, *b, *c;
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &a), MP_OK, "%s",
               mp_last_error());
  fake_of(dev)->used -= other;
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &b), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &c), MP_OK, "%s",
               mp_last_error());
  mp_stats_t s = stats(p);
  cr_expect_eq(s.reserved_bytes, 18 * MiB);
  cr_expect_eq(s.segment_count, 2);
  cr_expect_eq(s.device_alloc_count, 2);
  check(p);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  cr_assert_eq(mp_pool_free(p, b), MP_OK);
  cr_assert_eq(mp_pool_free(p, c), MP_OK);
  fake_pool_finish(p, dev);
}

/* On the host device, whose refusal records its reason: the allocation
 * the retry serves leaves the caller's last error as it was (status.h: a
 * success does not replace it), with arenas too. */
static void host_retry_keeps_last_error(const char *opts) {
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host:capacity=20M,vmm=0", &dev), MP_OK, "%s",
               mp_last_error());
  mp_pool_t *p = make_pool(dev, opts);
  void *other, *live, *a;
  cr_assert_eq(mp_device_alloc(dev, 14 * MiB, &other), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_alloc(p, 1000, NULL, &live), MP_OK, "%s: %s", opts,
               mp_last_error());
  cr_assert_eq(mp_pool_free(p, (char *)live + 512), MP_EINVAL);
  char msg[MP__ERROR_MAX];
  snprintf(msg, sizeof msg, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &a), MP_OK, "%s: %s", opts,
               mp_last_error());
  cr_expect_str_eq(mp_last_error(), msg, "%s", opts);
  cr_expect_eq(mp_last_status(), MP_EINVAL, "%s", opts);
  size_t r = stats(p).reserved_bytes;
  cr_expect(r > 2 * MiB && r < 3 * MiB, "%s: reserved %zu", opts, r);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  cr_assert_eq(mp_pool_free(p, live), MP_OK);
  cr_expect_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_device_free(dev, other), MP_OK);
  mp_device_close(dev);
}

Test(pool_plain_segment_refused, served_by_the_retry_keeps_the_last_error) {
  host_retry_keeps_last_error("segment_bytes=16M");
  host_retry_keeps_last_error("segment_bytes=16M,arenas=2");
}
