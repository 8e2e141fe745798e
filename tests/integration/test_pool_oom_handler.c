/* test_pool_oom_handler.c - mp_pool_set_oom_handler: the handler hears of
 * an allocation that is about to fail (size and status), runs with the pool
 * unlocked so it can free a cache of its own, and a nonzero return retries
 * once; zero lets the allocation fail with the pool's own message. */
#include <criterion/criterion.h>
#include <string.h>

#include <mempool/mempool.h>

#include "../support/pool_helpers.h"

#define MiB ((size_t)1 << 20)

static mp_device_t *dev;
static void setup(void) {
  cr_assert_eq(mp_device_open("host:capacity=64M", &dev), MP_OK, "%s",
               mp_last_error());
}
static void teardown(void) {
  mp_device_close(dev);
}
TestSuite(oom_handler, .init = setup, .fini = teardown);

typedef struct engine {
  void *cache; /* a block the engine can let go of */
  int calls;
  size_t bytes;
  mp_status_t status;
  int answer;
} engine_t;

static int drop_cache(mp_pool_t *pool, size_t bytes, mp_status_t status,
                      void *ctx) {
  engine_t *e = ctx;
  e->calls++;
  e->bytes = bytes;
  e->status = status;
  if (e->cache != NULL) {
    cr_assert_eq(mp_pool_free(pool, e->cache), MP_OK, "%s", mp_last_error());
    e->cache = NULL;
  }
  return e->answer;
}

Test(oom_handler, frees_a_cache_and_the_allocation_retries) {
  mp_pool_t *p = make_pool(dev, NULL);
  engine_t e = {.answer = 1};
  cr_assert_eq(mp_pool_alloc(p, 40 * MiB, NULL, &e.cache), MP_OK);
  cr_assert_eq(mp_pool_set_oom_handler(p, drop_cache, &e), MP_OK);
  void *x;
  cr_assert_eq(mp_pool_alloc(p, 48 * MiB, NULL, &x), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(e.calls, 1);
  cr_expect_eq(e.bytes, 48 * MiB);
  cr_expect_eq(e.status, MP_ENOMEM);
  cr_expect_null(e.cache);
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  check(p);
  mp_pool_destroy(p);
}

Test(oom_handler, zero_lets_it_fail_with_the_pools_message) {
  mp_pool_t *p = make_pool(dev, "max_bytes=16M");
  engine_t e = {.answer = 0};
  cr_assert_eq(mp_pool_set_oom_handler(p, drop_cache, &e), MP_OK);
  void *x;
  mp_handle_t *h;
  cr_expect_eq(mp_pool_alloc(p, 32 * MiB, NULL, &x), MP_ELIMIT);
  cr_expect(strstr(mp_last_error(), "max_bytes"), "%s", mp_last_error());
  cr_expect_eq(mp_pool_alloc_movable(p, 32 * MiB, NULL, &h), MP_ELIMIT);
  cr_expect_eq(e.calls, 2);
  cr_expect_eq(e.status, MP_ELIMIT);
  /* Removed: no call. */
  cr_assert_eq(mp_pool_set_oom_handler(p, NULL, NULL), MP_OK);
  cr_expect_eq(mp_pool_alloc(p, 32 * MiB, NULL, &x), MP_ELIMIT);
  cr_expect_eq(e.calls, 2);
  cr_expect_eq(mp_pool_set_oom_handler(NULL, drop_cache, &e), MP_EINVAL);
  check(p);
  mp_pool_destroy(p);
}

Test(oom_handler, not_called_for_bad_arguments_or_successes) {
  mp_pool_t *p = make_pool(dev, NULL);
  engine_t e = {.answer = 1};
  cr_assert_eq(mp_pool_set_oom_handler(p, drop_cache, &e), MP_OK);
  void *x;
  cr_assert_eq(mp_pool_alloc(p, MiB, NULL, &x), MP_OK);
  cr_expect_eq(mp_pool_free(p, (char *)x + 512), MP_EINVAL);
  cr_expect_eq(e.calls, 0);
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  mp_pool_destroy(p);
}
