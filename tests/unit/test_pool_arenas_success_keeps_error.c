/* An allocation on the arenas' path (arenas=N, src/pool/arena.c) that
 * succeeds after its arena's own try failed (a capped pool's first
 * allocation in an arena with no share yet, mp__arena_share; a block
 * borrowed from another arena on the out-of-memory path) is a success:
 * status.h, a later success leaves the caller's last error as it was. */
#include <criterion/criterion.h>

#include "../support/pool_helpers.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_arenas_success_keeps_error, "host:capacity=64M");

/* A last error of the caller's own: a failure with a message of its own. */
static void set_marker(mp_pool_t *pool) {
  int x;
  cr_assert_neq(mp_pool_free(pool, &x), MP_OK);
  cr_assert_neq(mp_last_status(), MP_OK);
}

static void expect_marker(mp_error_state_t *was) {
  cr_expect_eq(mp_last_status(), was->status, "%s", mp_last_error());
  cr_expect_str_eq(mp_last_error(), was->message);
}

Test(pool_arenas_success_keeps_error, a_first_share_is_no_failure) {
  mp_pool_t *pool = make_pool(dev, "arenas=2,max_bytes=32M");
  set_marker(pool);
  mp_error_state_t was;
  mp_error_save(&was);
  void *p = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 4 * MiB, NULL, &p), MP_OK, "%s",
               mp_last_error());
  expect_marker(&was);
  mp_stats_t s = stats(pool);
  cr_expect_eq(s.oom_count, 0);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

Test(pool_arenas_success_keeps_error, contiguous_pieces_after_a_share) {
  mp_pool_t *pool = make_pool(dev, "arenas=2,max_bytes=32M");
  set_marker(pool);
  mp_error_state_t was;
  mp_error_save(&was);
  size_t sizes[2] = {2 * MiB, 2 * MiB};
  void *p[2] = {NULL, NULL};
  cr_assert_eq(mp_pool_alloc_contiguous(pool, 2, sizes, NULL, p), MP_OK, "%s",
               mp_last_error());
  expect_marker(&was);
  cr_expect_eq(stats(pool).oom_count, 0);
  cr_assert_eq(mp_pool_free(pool, p[0]), MP_OK);
  cr_assert_eq(mp_pool_free(pool, p[1]), MP_OK);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

static void *held;
static int calls;
static int free_held(mp_pool_t *pool, size_t bytes, mp_status_t st, void *ctx) {
  (void)bytes, (void)st, (void)ctx;
  calls++;
  if (held == NULL)
    return 0;
  cr_assert_eq(mp_pool_free(pool, held), MP_OK);
  held = NULL;
  return 1;
}

/* The pool's out-of-memory handler frees a block and the retry serves the
 * request: a success, counted as none. */
Test(pool_arenas_success_keeps_error, a_handler_that_frees_enough) {
  mp_pool_t *pool = make_pool(dev, "arenas=2,max_bytes=32M");
  cr_assert_eq(mp_pool_alloc(pool, 24 * MiB, NULL, &held), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_set_oom_handler(pool, free_held, NULL), MP_OK);
  set_marker(pool);
  mp_error_state_t was;
  mp_error_save(&was);
  calls = 0;
  void *p = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 28 * MiB, NULL, &p), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(calls, 1);
  cr_expect_null(held);
  expect_marker(&was);
  cr_expect_eq(stats(pool).oom_count, 0);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}
