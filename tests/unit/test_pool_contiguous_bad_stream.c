/* test_pool_contiguous_bad_stream.c - mp_pool_alloc_contiguous on a stream
 * that is none of the device's is MP_EINVAL whatever the sizes ask, as
 * mp_pool_alloc and mp_pool_alloc_movable answer it: bad input, not an
 * allocation that ran out, so no out-of-memory handler is called, no
 * oom_count and nothing changes. A sum of sizes that wraps was answered
 * MP_ENOMEM first (counted, the handler asked), the stream never looked
 * at; with and without arenas. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "../support/pool_helpers.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_contiguous_bad_stream, "host:capacity=64M");

/* Counts its calls in *ctx and lets the allocation fail. */
static int count_handler(mp_pool_t *pool, size_t bytes, mp_status_t status,
                         void *ctx) {
  (void)pool, (void)bytes, (void)status;
  return ++*(int *)ctx, 0;
}

static void bad_stream_is_einval(const char *opts) {
  mp_pool_t *pool = make_pool(dev, opts);
  int handler_calls = 0;
  cr_assert_eq(mp_pool_set_oom_handler(pool, count_handler, &handler_calls),
               MP_OK);
  void *keep;
  cr_assert_eq(mp_pool_alloc(pool, MiB, NULL, &keep), MP_OK, "%s",
               mp_last_error());
  mp_stats_t before = stats(pool);
  mp_stream_t bad = (mp_stream_t)(uintptr_t)0x1234;
  void *out[2] = {NULL, NULL};
  size_t wraps[2] = {SIZE_MAX, 1};
  size_t half[2] = {SIZE_MAX / 2, SIZE_MAX / 2};
  size_t over[2] = {40 * MiB, 40 * MiB};
  cr_expect_eq(mp_pool_alloc_contiguous(pool, 2, wraps, bad, out), MP_EINVAL,
               "%s: %s", opts, mp_last_error());
  cr_expect_neq(strstr(mp_last_error(), "not a live stream"), NULL, "%s: %s",
                opts, mp_last_error());
  cr_expect_eq(mp_pool_alloc_contiguous(pool, 2, half, bad, out), MP_EINVAL,
               "%s: %s", opts, mp_last_error());
  cr_expect_eq(mp_pool_alloc_contiguous(pool, 2, over, bad, out), MP_EINVAL,
               "%s: %s", opts, mp_last_error());
  cr_expect_eq(out[0], NULL);
  cr_expect_eq(out[1], NULL);
  cr_expect_eq(handler_calls, 0, "%s: the out-of-memory handler was asked",
               opts);
  mp_stats_t after = stats(pool);
  cr_expect_eq(after.oom_count, before.oom_count, "%s", opts);
  cr_expect_eq(memcmp(&before, &after, sizeof before), 0, "%s", opts);
  /* The same sums on a good stream still run out, once each. */
  cr_expect_eq(mp_pool_alloc_contiguous(pool, 2, wraps, NULL, out), MP_ENOMEM);
  cr_expect_eq(stats(pool).oom_count, before.oom_count + 1, "%s", opts);
  check(pool);
  cr_expect_eq(mp_pool_free(pool, keep), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

Test(pool_contiguous_bad_stream, is_einval_even_for_a_sum_that_wraps) {
  bad_stream_is_einval("arenas=0");
}

Test(pool_contiguous_bad_stream,
     is_einval_even_for_a_sum_that_wraps_in_arenas) {
  bad_stream_is_einval("arenas=2");
}
