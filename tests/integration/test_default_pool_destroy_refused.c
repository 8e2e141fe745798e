/* test_default_pool_destroy_refused.c - the default pool lives until the
 * process exits (mempool.h): mp_pool_destroy of it is refused (MP_EBUSY,
 * nothing destroyed), and mp_malloc goes on serving from it. Before, the
 * destroy went and the next mp_malloc used the freed pool (it hung in the
 * pool's lock). Each Criterion test runs in its own process. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include <mempool/mempool.h>

static mp_pool_t *the_default(void) {
  setenv("MEMPOOL_DEVICE", "host", 1);
  unsetenv("MEMPOOL_CONF");
  mp_pool_t *p = mp_default_pool();
  cr_assert_not_null(p, "%s", mp_last_error());
  return p;
}

static void expect_kept(mp_pool_t *p, void *live) {
  cr_expect(strstr(mp_last_error(), "mp_pool_destroy: a default pool") !=
                    NULL &&
                strstr(mp_last_error(), "nothing was destroyed") != NULL,
            "%s", mp_last_error());
  cr_expect_eq(((unsigned char *)live)[4095], 9, "the live block changed");
  cr_expect_eq(mp_default_pool(), p);
  void *q = NULL;
  cr_expect_eq(mp_malloc(&q, 1 << 20), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_free(q), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_free(live), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_check(p), MP_OK, "%s", mp_last_error());
}

Test(default_pool_destroy, is_refused_and_the_pool_serves_on) {
  mp_pool_t *p = the_default();
  void *live = NULL;
  cr_assert_eq(mp_malloc(&live, 4096), MP_OK, "%s", mp_last_error());
  memset(live, 9, 4096);
  cr_expect_eq(mp_pool_destroy(p), MP_EBUSY);
  expect_kept(p, live);
}

Test(default_pool_destroy, ex_says_nothing_was_destroyed) {
  mp_pool_t *p = the_default();
  void *live = NULL;
  cr_assert_eq(mp_malloc(&live, 4096), MP_OK, "%s", mp_last_error());
  memset(live, 9, 4096);
  int destroyed = -1;
  cr_expect_eq(mp_pool_destroy_ex(p, &destroyed), MP_EBUSY);
  cr_expect_eq(destroyed, 0);
  expect_kept(p, live);
}
