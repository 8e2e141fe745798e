/* test_pool_visible_cap.c - a pool's cap is what a program sees: with
 * max_bytes or max_fraction, mp_pool_mem_info reports the cap as total and
 * what is left under it above the live blocks as free (frameworks size
 * their caches from cudaMemGetInfo, which the shim answers with it), and
 * the next allocation that fits what it says succeeds. */
#include <criterion/criterion.h>
#include <string.h>

#include <mempool/mempool.h>

#include "../support/pool_helpers.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

MP_DEVICE_SUITE(visible_cap, "host:capacity=4G");

Test(visible_cap, without_a_cap_the_device_is_the_total) {
  mp_pool_t *p = make_pool(dev, NULL);
  size_t f = 0, t = 0;
  cr_assert_eq(mp_pool_mem_info(p, &f, &t), MP_OK);
  cr_assert_eq(t, 4 * GiB);
  cr_assert_eq(f, 4 * GiB);
  void *a;
  cr_assert_eq(mp_pool_alloc(p, 100 * MiB, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  /* The idle cache is free memory to the program. */
  cr_assert_eq(mp_pool_mem_info(p, &f, &t), MP_OK);
  cr_assert_eq(f, 4 * GiB);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
}

static void cap_is_seen(const char *opts, size_t cap) {
  mp_pool_t *p = make_pool(dev, opts);
  size_t f = 0, t = 0;
  cr_assert_eq(mp_pool_mem_info(p, &f, &t), MP_OK);
  cr_assert_eq(t, cap, "total %zu, cap %zu", t, cap);
  cr_assert_eq(f, cap);
  void *a, *b;
  cr_assert_eq(mp_pool_alloc(p, 300 * MiB, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_mem_info(p, &f, NULL), MP_OK);
  cr_assert_leq(f, cap - 300 * MiB);
  cr_assert_geq(f, cap - 300 * MiB - 2 * MiB, "free %zu", f);
  /* What it says is free can be had; more cannot. */
  cr_assert_eq(mp_pool_alloc(p, f - 2 * MiB, NULL, &b), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(p, b), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, f + 4 * MiB, NULL, &b), MP_ELIMIT);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
}

Test(visible_cap, max_bytes_is_the_total_and_bounds_free) {
  cap_is_seen("max_bytes=1G", GiB);
}

Test(visible_cap, max_fraction_caps_a_share_of_the_device) {
  cap_is_seen("max_fraction=0.25", GiB);
}

Test(visible_cap, bad_fractions_and_two_caps_are_refused) {
  mp_pool_config_t c;
  mp_pool_config_init(&c);
  const char *bad[] = {"max_fraction=0",    "max_fraction=1.5",
                       "max_fraction=-1",   "max_fraction=half",
                       "max_fraction=0.5x", "max_fraction=",
                       "max_fraction= 0.5", "max_fraction=0.5 ",
                       "max_fraction=nan",  "max_fraction=0x0.8p0"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    cr_assert_eq(mp_pool_config_parse(&c, bad[i]), MP_EINVAL, "%s", bad[i]);
    cr_assert_eq(c.max_fraction, 0.0, "%s changed the config", bad[i]);
  }
  cr_assert_eq(mp_pool_config_parse(&c, "max_fraction=0.5,max_bytes=1G"),
               MP_OK);
  mp_pool_t *p = NULL;
  cr_assert_eq(mp_pool_create(dev, &c, &p), MP_EINVAL);
  cr_assert_null(p);
  cr_assert_eq(mp_pool_mem_info(NULL, NULL, NULL), MP_EINVAL);
}

/* A fraction whose cap comes out below the alignment is refused, naming
 * max_fraction, at create and at mp_pool_set_max_fraction (a pool was made
 * that could hold nothing, and its failures blamed max_bytes). */
Test(visible_cap, a_fraction_that_leaves_no_room_is_refused) {
  mp_pool_config_t c;
  mp_pool_config_init(&c);
  cr_assert_eq(mp_pool_config_parse(&c, "max_fraction=1e-300"), MP_OK);
  mp_pool_t *p = NULL;
  cr_expect_eq(mp_pool_create(dev, &c, &p), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "max_fraction") != NULL, "%s",
            mp_last_error());
  cr_expect_null(p);
  cr_assert_eq(mp_pool_create(dev, NULL, &p), MP_OK);
  size_t total_before = 0, total_after = 0;
  cr_assert_eq(mp_pool_mem_info(p, NULL, &total_before), MP_OK);
  cr_expect_eq(mp_pool_set_max_fraction(p, 1e-300), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "max_fraction") != NULL, "%s",
            mp_last_error());
  cr_assert_eq(mp_pool_mem_info(p, NULL, &total_after), MP_OK);
  cr_expect_eq(total_after, total_before, "a refused fraction changed the cap");
  void *x;
  cr_expect_eq(mp_pool_alloc(p, 512, NULL, &x), MP_OK);
  cr_expect_eq(mp_pool_free(p, x), MP_OK);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
}

/* On a device whose size is near 2^64, the whole of it as a fraction is
 * the device's size: the product rounded up to 2^64 as a double, and its
 * conversion (undefined) gave 0, refused as "below the alignment". */
Test(visible_cap, a_whole_fraction_of_the_largest_device_is_its_size) {
  mp_device_t *big = NULL;
  cr_assert_eq(mp_device_open("host:capacity=18446744073709551615", &big),
               MP_OK, "%s", mp_last_error());
  mp_pool_t *p = make_pool(big, "max_fraction=1");
  size_t t = 0;
  cr_assert_eq(mp_pool_mem_info(p, NULL, &t), MP_OK);
  cr_expect_eq(t, SIZE_MAX & ~(size_t)511, "total %zu", t);
  cr_expect_eq(mp_pool_set_max_fraction(p, 1.0), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_mem_info(p, NULL, &t), MP_OK);
  cr_expect_eq(t, SIZE_MAX & ~(size_t)511, "total %zu", t);
  void *x;
  cr_expect_eq(mp_pool_alloc(p, 1 << 20, NULL, &x), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_free(p, x), MP_OK);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  mp_device_close(big);
}
