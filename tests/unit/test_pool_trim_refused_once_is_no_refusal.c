/* test_pool_trim_refused_once_is_no_refusal.c - mp_pool_trim whose device
 * refuses a piece once and takes it at a later pass of the same trim, in a
 * pool that also holds free memory no trim can give back (a segment or
 * chunk a live block shares): the trim is MP_OK, as nothing the device
 * refused stays. Before, any refusal during the trim with free memory left
 * at its end was MP_EDRIVER, "the device refused to take back free memory,
 * so 2.00 MiB free stays reserved": the 2 MiB were the live block's
 * segment, which the device was never asked for. A refusal that does stay
 * says how many pieces the device kept (pool.h, mp_pool_trim). */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "flaky_unmap.h"

#define MiB ((size_t)1 << 20)

/* A plain pool with one segment a small live block shares and two wholly
 * free 4 MiB segments, trimmed to 0 with the device refusing its next
 * `refused` frees: the trim answers want and leaves held bytes on the
 * device, and where it failed, its message counts the two pieces refused
 * and the next trim gives them back. */
static void trim_plain(unsigned refused, mp_status_t want, size_t held) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *p = make_pool(dev, "virtual=0");
  void *live, *a, *b;
  cr_assert_eq(mp_pool_alloc(p, 1000, NULL, &live), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_alloc(p, 4 * MiB, NULL, &a), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_alloc(p, 4 * MiB, NULL, &b), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  cr_assert_eq(mp_pool_free(p, b), MP_OK);
  cr_assert_eq(stats(p).segment_count, 3);
  cr_assert_eq(fake_of(dev)->used, 10 * MiB);
  fake_of(dev)->refuse_frees = refused;
  mp_status_t st = mp_pool_trim(p, 0);
  cr_expect(fake_of(dev)->refuse_frees < refused, "the device was asked");
  fake_of(dev)->refuse_frees = 0;
  cr_expect_eq(st, want, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect_eq(fake_of(dev)->used, held, "%zu bytes still held",
               fake_of(dev)->used);
  cr_expect_eq(stats(p).reserved_bytes, held);
  check(p);
  if (want != MP_OK) {
    cr_expect(strstr(mp_last_error(),
                     "mp_pool_trim: the device refused to "
                     "take back 2 pieces of free memory") != NULL,
              "%s", mp_last_error());
    cr_expect_eq(mp_pool_trim(p, 0), MP_OK, "%s", mp_last_error());
    cr_expect_eq(fake_of(dev)->used, 2 * MiB);
  }
  cr_assert_eq(mp_pool_free(p, live), MP_OK);
  cr_expect_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
  fake_close(dev);
}

Test(pool_trim_refused_once, a_plain_free_refused_then_taken_is_ok) {
  trim_plain(1, MP_OK, 2 * MiB);
}

Test(pool_trim_refused_once, a_refusal_that_stays_says_how_many_pieces) {
  trim_plain(1000, MP_EDRIVER, 10 * MiB);
}

/* The virtual range: three free 2 MiB chunks and one a live block shares;
 * the first unmap the trim asks for is refused, and asked again it goes. */
Test(pool_trim_refused_once, a_chunk_unmap_refused_then_taken_is_ok) {
  mp_device_t *dev = flaky_open(0);
  mp_pool_t *p = make_pool(dev, "segment_bytes=2M");
  void *b[3], *live;
  for (size_t i = 0; i < 3; i++)
    cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &b[i]), MP_OK, "%s",
                 mp_last_error());
  cr_assert_eq(mp_pool_alloc(p, 1000, NULL, &live), MP_OK, "%s",
               mp_last_error());
  for (size_t i = 0; i < 3; i++)
    cr_assert_eq(mp_pool_free(p, b[i]), MP_OK);
  size_t held = fake_of(dev)->used;
  cr_assert_gt(held, 6 * MiB, "the live block's memory is mapped too");
  unmap_calls = 0;
  unmap_fail_at = 1;
  mp_status_t st = mp_pool_trim(p, 0);
  unmap_fail_at = 0;
  cr_expect_geq(unmap_calls, 2, "the refused unmap was asked again");
  cr_expect_eq(st, MP_OK, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect_eq(fake_of(dev)->used, held - 6 * MiB, "%zu bytes still mapped",
               fake_of(dev)->used);
  check(p);
  cr_assert_eq(mp_pool_free(p, live), MP_OK);
  cr_expect_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
  fake_close(dev);
}
