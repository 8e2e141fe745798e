/* test_pool_ladder_keeps_last_error.c - an allocation the out-of-memory
 * ladder serves leaves the thread's last error as it was (status.h: "A
 * later success does not clear it; the next failure replaces it"), though
 * its rungs met failures on the way: the first growth the device refused,
 * then a give-back of the trim rung the device refused, before a growth
 * that fits. Before, mp_pool_alloc answered MP_OK and the last error was
 * "the out-of-memory path: the device refused to take back ...",
 * replacing the failure the caller was about to report. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

/* Three 4 MiB plain segments on a 16 MiB device, the first and the last
 * freed: 8 MiB free in two segments, 4 MiB left on the device. */
static mp_pool_t *two_free_segments(mp_device_t *dev, void **live) {
  mp_pool_t *p = make_pool(dev, "virtual=0");
  void *a, *c;
  cr_assert_eq(mp_pool_alloc(p, 4 * MiB, NULL, &a), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_alloc(p, 4 * MiB, NULL, live), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_alloc(p, 4 * MiB, NULL, &c), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(p, a), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(p, c), MP_OK, "%s", mp_last_error());
  cr_assert_eq(fake_of(dev)->used, 12 * MiB);
  return p;
}

/* The caller's failure, still to be reported: a free of a pointer inside
 * a block. */
static void caller_failure(mp_pool_t *p, void *live, char *msg, size_t n) {
  cr_assert_eq(mp_pool_free(p, (char *)live + 512), MP_EINVAL);
  snprintf(msg, n, "%s", mp_last_error());
  cr_assert_neq(msg[0], '\0');
}

/* The device refuses the first and third frees: the trim rung's first
 * pass frees one segment, past the other it refused, and its last pass
 * finds that one refused again. */
static unsigned frees_seen;
static void refuse_first_and_third(void *ctx) {
  fake_dev_t *f = ctx;
  if (++frees_seen == 1 || frees_seen == 3)
    f->refuse_frees = 1;
  f->on_free = refuse_first_and_third;
}

Test(pool_ladder_last_error, a_refused_give_back_before_a_growth_that_fits) {
  mp_device_t *dev = fake_open(16 * MiB, 0);
  void *b, *d;
  mp_pool_t *p = two_free_segments(dev, &b);
  char before[MP_ERROR_MESSAGE_MAX];
  caller_failure(p, b, before, sizeof before);
  /* 8 MiB: no free block holds it, the device has 4 MiB left; the trim
   * rung frees one free segment (the other refused), which makes room. */
  fake_of(dev)->on_free = refuse_first_and_third;
  fake_of(dev)->on_free_ctx = fake_of(dev);
  cr_assert_eq(mp_pool_alloc(p, 8 * MiB, NULL, &d), MP_OK, "%s",
               mp_last_error());
  fake_of(dev)->on_free = NULL;
  cr_expect_eq(frees_seen, 3, "the trim rung asked three times");
  cr_expect_eq(fake_of(dev)->frees, 1);
  cr_expect_eq(fake_of(dev)->used, 16 * MiB, "b, the refused segment, d");
  cr_expect_str_eq(mp_last_error(), before);
  cr_expect_eq(mp_last_status(), MP_EINVAL);
  check(p);
  cr_expect_eq(mp_pool_free(p, d), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_free(p, b), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
  fake_close(dev);
}

Test(pool_ladder_last_error, a_failed_allocation_still_says_why) {
  mp_device_t *dev = fake_open(16 * MiB, 0);
  void *b, *d = NULL;
  mp_pool_t *p = two_free_segments(dev, &b);
  char before[MP_ERROR_MESSAGE_MAX];
  caller_failure(p, b, before, sizeof before);
  /* 16 MiB cannot fit beside the live block: the failure replaces the
   * caller's last error, as any failure does. */
  cr_assert_eq(mp_pool_alloc(p, 16 * MiB, NULL, &d), MP_ENOMEM);
  cr_expect_null(d);
  cr_expect_str_neq(mp_last_error(), before);
  cr_expect_eq(mp_last_status(), MP_ENOMEM);
  check(p);
  cr_expect_eq(mp_pool_free(p, b), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
  fake_close(dev);
}
