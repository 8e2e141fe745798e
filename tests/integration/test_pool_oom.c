/* The out-of-memory ladder on the host device, driven by its capacity and
 * fail_after options: cached memory is given back and retried before
 * failing, max_bytes is MP_ELIMIT, and a failure says what it saw. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include <mempool/mempool.h>

#define MiB ((size_t)1 << 20)

static mp_device_t *open_dev(const char *spec) {
  mp_device_t *dev = NULL;
  cr_assert_eq(mp_device_open(spec, &dev), MP_OK, "%s", mp_last_error());
  return dev;
}

static void
cached_segments_are_released_to_fit_a_larger_request(const char *spec) {
  mp_device_t *dev = open_dev(spec);
  mp_pool_t *p = make_pool(dev, NULL);
  /* Fill the 64 MiB device with 16 MiB blocks, then free them: the cache
   * holds everything. */
  void *v[4];
  for (int i = 0; i < 4; i++)
    cr_assert_eq(mp_pool_alloc(p, 16 * MiB, NULL, &v[i]), MP_OK, "%s",
                 mp_last_error());
  cr_assert_eq(mp_pool_free(p, v[0]), MP_OK);
  cr_assert_eq(mp_pool_free(p, v[2]), MP_OK);
  /* 32 MiB is free but in two pieces (plain) or one piece (virtual):
   * either way a 24 MiB request succeeds or the ladder trims and retries. */
  mp_pool_free(p, v[1]);
  mp_pool_free(p, v[3]);
  void *big;
  cr_assert_eq(mp_pool_alloc(p, 60 * MiB, NULL, &big), MP_OK, "%s",
               mp_last_error());
  mp_stats_t s = stats(p);
  cr_expect_eq(s.oom_count, 0);
  cr_expect_leq(s.reserved_bytes, 64 * MiB);
  if (strstr(spec, "vmm=0")) /* plain segments had to go back first */
    cr_expect_eq(s.alloc_retry_count, 1);
  cr_expect_eq(mp_pool_check(p), MP_OK, "%s", mp_last_error());
  mp_pool_free(p, big);
  mp_pool_destroy(p);
  mp_device_close(dev);
}

Test(pool_oom, cached_segments_are_released_to_fit_a_larger_request_plain) {
  cached_segments_are_released_to_fit_a_larger_request(
      "host:capacity=64M,vmm=0");
}

Test(pool_oom, cached_segments_are_released_to_fit_a_larger_request_virtual) {
  cached_segments_are_released_to_fit_a_larger_request("host:capacity=64M");
}

Test(pool_oom, device_exhaustion_is_enomem_with_a_message) {
  mp_device_t *dev = open_dev("host:capacity=32M");
  mp_pool_t *p = make_pool(dev, NULL);
  void *a, *b;
  cr_assert_eq(mp_pool_alloc(p, 20 * MiB, NULL, &a), MP_OK);
  mp_stats_t before = stats(p);
  b = (void *)0x1;
  cr_expect_eq(mp_pool_alloc(p, 20 * MiB, NULL, &b), MP_ENOMEM);
  const char *msg = mp_last_error();
  cr_expect(strstr(msg, "asked 20.00 MiB"), "%s", msg);
  cr_expect(strstr(msg, "reserved"), "%s", msg);
  cr_expect(strstr(msg, "allocated 20.00 MiB"), "%s", msg);
  cr_expect(strstr(msg, "largest free block"), "%s", msg);
  mp_stats_t after = stats(p);
  cr_expect_eq(after.oom_count, before.oom_count + 1);
  cr_expect_eq(after.allocated_bytes, before.allocated_bytes);
  cr_expect_eq(after.live_blocks, 1);
  cr_expect_eq(mp_pool_check(p), MP_OK, "%s", mp_last_error());
  /* What fits still works. */
  cr_expect_eq(mp_pool_alloc(p, 8 * MiB, NULL, &b), MP_OK, "%s",
               mp_last_error());
  mp_pool_destroy(p);
  mp_device_close(dev);
}

Test(pool_oom, max_bytes_is_elimit) {
  mp_device_t *dev = open_dev("host");
  mp_pool_t *p = make_pool(dev, "max_bytes=8M");
  void *a, *b;
  cr_assert_eq(mp_pool_alloc(p, 6 * MiB, NULL, &a), MP_OK);
  cr_expect_eq(mp_pool_alloc(p, 4 * MiB, NULL, &b), MP_ELIMIT);
  cr_expect(strstr(mp_last_error(), "max_bytes"), "%s", mp_last_error());
  cr_expect_eq(mp_pool_alloc(p, 64 * MiB, NULL, &b), MP_ELIMIT);
  mp_stats_t s = stats(p);
  cr_expect_eq(s.oom_count, 2);
  cr_expect_leq(s.reserved_bytes, 8 * MiB);
  mp_pool_free(p, a);
  cr_expect_eq(mp_pool_alloc(p, 8 * MiB, NULL, &b), MP_OK, "%s",
               mp_last_error());
  mp_pool_destroy(p);
  mp_device_close(dev);
}

Test(pool_oom, failing_device_allocations_end_in_enomem_and_recover) {
  /* The 3rd device allocation and all later ones fail. */
  mp_device_t *dev = open_dev("host:vmm=0,fail_after=3");
  mp_pool_t *p = make_pool(dev, NULL);
  void *a, *b, *c;
  cr_assert_eq(mp_pool_alloc(p, 4 * MiB, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 4 * MiB, NULL, &b), MP_OK);
  cr_expect_eq(mp_pool_alloc(p, 4 * MiB, NULL, &c), MP_ENOMEM);
  cr_expect_eq(stats(p).oom_count, 1);
  /* A free makes the cache serve again without the device. */
  mp_pool_free(p, a);
  cr_expect_eq(mp_pool_alloc(p, 4 * MiB, NULL, &c), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(c, a);
  cr_expect_eq(mp_pool_check(p), MP_OK, "%s", mp_last_error());
  mp_pool_destroy(p);
  mp_device_close(dev);
}

Test(pool_oom, absurd_size_is_refused_without_touching_the_cache) {
  mp_device_t *dev = open_dev("host");
  mp_pool_t *p = make_pool(dev, NULL);
  void *a;
  cr_assert_eq(mp_pool_alloc(p, MiB, NULL, &a), MP_OK);
  mp_pool_free(p, a);
  mp_stats_t before = stats(p);
  cr_expect_eq(mp_pool_alloc(p, SIZE_MAX, NULL, &a), MP_ENOMEM);
  cr_expect_eq(mp_pool_alloc(p, (size_t)1 << 62, NULL, &a), MP_ENOMEM);
  mp_stats_t after = stats(p);
  cr_expect_eq(after.reserved_bytes, before.reserved_bytes);
  cr_expect_eq(after.oom_count, before.oom_count + 2);
  mp_pool_destroy(p);
  mp_device_close(dev);
}
