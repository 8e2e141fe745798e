/* An allocation past the pool's cap is MP_ELIMIT with a message naming the
 * option the cap came from: max_fraction (or mp_pool_set_max_fraction,
 * PyTorch's per-process fraction) or max_bytes, with or without arenas. */
#include <criterion/criterion.h>
#include <string.h>

#include <mempool/mempool.h>

#define MiB ((size_t)1 << 20)

static mp_device_t *dev;
static mp_pool_t *pool;

static void setup(void) {
  cr_assert_eq(mp_device_open("host:capacity=64M", &dev), MP_OK, "%s",
               mp_last_error());
}

static void teardown(void) {
  if (pool != NULL)
    cr_expect_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  pool = NULL;
  mp_device_close(dev);
}

TestSuite(pool_cap_message, .init = setup, .fini = teardown);

static void make(const char *opts) {
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_assert_eq(mp_pool_config_parse(&cfg, opts), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_create(dev, &cfg, &pool), MP_OK, "%s", mp_last_error());
}

static void expect_refusal_names(const char *option, const char *other) {
  void *p = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 40 * MiB, NULL, &p), MP_ELIMIT, "%s",
               mp_last_error());
  cr_expect_null(p);
  cr_expect(strstr(mp_last_error(), option) != NULL, "%s", mp_last_error());
  cr_expect(strstr(mp_last_error(), other) == NULL, "%s", mp_last_error());
}

Test(pool_cap_message, a_fraction_cap_names_max_fraction) {
  make("max_fraction=0.5");
  expect_refusal_names("max_fraction", "max_bytes");
}

Test(pool_cap_message, a_fraction_cap_names_max_fraction_with_arenas) {
  make("max_fraction=0.5,arenas=2");
  expect_refusal_names("max_fraction", "max_bytes");
}

Test(pool_cap_message, a_fraction_set_later_names_max_fraction) {
  make("max_bytes=48M");
  cr_assert_eq(mp_pool_set_max_fraction(pool, 0.5), MP_OK, "%s",
               mp_last_error());
  expect_refusal_names("max_fraction", "max_bytes");
}

Test(pool_cap_message, a_byte_cap_names_max_bytes) {
  make("max_bytes=32M,arenas=2");
  expect_refusal_names("max_bytes", "max_fraction");
}
