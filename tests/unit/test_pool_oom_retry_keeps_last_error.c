/* test_pool_oom_retry_keeps_last_error.c - an allocation that fails, whose
 * out-of-memory handler then frees enough for its retry, succeeds: status.h,
 * a success leaves the caller's last error as it was. Before, the failure's
 * message ("pool max_bytes: asked ...", written before the handler ran)
 * stayed the last error of an allocation that returned MP_OK (helper-292's
 * finding, 2026-12-07). A retry that fails still says its own failure. */
#include <criterion/criterion.h>

#include "../support/pool_helpers.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_oom_retry_last_error, "host:capacity=64M");

static struct {
  mp_pool_t *pool;
  void *victim;
  int calls;
} h;

/* Frees the victim once; asks for the retry only if it freed something. */
static int free_victim(mp_pool_t *pool, size_t bytes, mp_status_t st,
                       void *ctx) {
  (void)bytes;
  (void)st;
  (void)ctx;
  h.calls++;
  if (h.victim == NULL)
    return 0;
  cr_assert_eq(mp_pool_free(pool, h.victim), MP_OK, "%s", mp_last_error());
  h.victim = NULL;
  return 1;
}

/* A last error of the caller's own. */
static void set_marker(mp_pool_t *pool, mp_error_state_t *was) {
  int x;
  cr_assert_neq(mp_pool_free(pool, &x), MP_OK);
  mp_error_save(was);
}

static void served_by_the_retry(const char *spec) {
  mp_pool_t *pool = make_pool(dev, spec);
  cr_assert_eq(mp_pool_set_oom_handler(pool, free_victim, NULL), MP_OK);
  h.calls = 0;
  cr_assert_eq(mp_pool_alloc(pool, 24 * MiB, NULL, &h.victim), MP_OK, "%s",
               mp_last_error());
  mp_error_state_t was;
  set_marker(pool, &was);
  void *p = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 16 * MiB, NULL, &p), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(h.calls, 1, "the handler ran once");
  cr_expect_eq(mp_last_status(), was.status, "%s", mp_last_error());
  cr_expect_str_eq(mp_last_error(), was.message);
  cr_expect_eq(stats(pool).oom_count, 0);
  /* A retry that fails says its failure. */
  void *q = NULL;
  cr_assert_neq(mp_pool_alloc(pool, 24 * MiB, NULL, &q), MP_OK);
  cr_expect_eq(h.calls, 2);
  cr_expect_str_neq(mp_last_error(), was.message);
  cr_expect_null(q);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

Test(pool_oom_retry_last_error, a_plain_pool) {
  served_by_the_retry("max_bytes=32M");
}

Test(pool_oom_retry_last_error, a_solo_arena) {
  served_by_the_retry("arenas=2,arenas_auto=1,max_bytes=32M");
}
