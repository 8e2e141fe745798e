/* test_direct_more_than_the_device.c - an allocation of more than the
 * device has in all is MP_ENOMEM at once, said so, and ends no session:
 * nothing freed could make it fit. It used to end the session like any
 * other full-device failure (on CUDA a device synchronization and a free
 * of every deferred block) and only then fail, so an absurd size changed
 * the allocator's state. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include <mempool/mempool.h>

#include "../support/device_helpers.h"

/* A direct allocator on a 64 MiB host device (*dev). */
static mp_direct_t *direct_on_64m(mp_device_t **dev) {
  *dev = open_dev("host:capacity=64M");
  mp_direct_t *d = NULL;
  cr_assert_eq(mp_direct_create(*dev, &d), MP_OK, "%s", mp_last_error());
  return d;
}

static mp_stats_t stats(mp_direct_t *d) {
  mp_stats_t s;
  cr_assert_eq(mp_direct_get_stats(d, &s), MP_OK, "%s", mp_last_error());
  return s;
}

static void done(mp_direct_t *d, mp_device_t *dev) {
  cr_expect_eq(mp_direct_destroy(d), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

/* One block of 1 MiB freed, its session not ended; then bytes asked. */
static void too_big_keeps_the_session(size_t bytes) {
  mp_device_t *dev;
  mp_direct_t *d = direct_on_64m(&dev);
  void *a = NULL;
  cr_assert_eq(mp_direct_alloc(d, 1 << 20, NULL, &a), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_direct_free(d, a), MP_OK, "%s", mp_last_error());
  void *p = (void *)0x1;
  cr_assert_eq(mp_direct_alloc(d, bytes, NULL, &p), MP_ENOMEM);
  cr_assert_eq(p, (void *)0x1, "out untouched on failure");
  cr_expect(strstr(mp_last_error(), "more than device") != NULL,
            "the message says why: %s", mp_last_error());
  mp_stats_t s = stats(d);
  cr_expect_eq(s.free_blocks, 1, "the freed block stays deferred");
  cr_expect_eq(s.free_bytes, 1u << 20);
  cr_expect_eq(s.device_free_count, 0, "no session ended");
  cr_expect_eq(s.alloc_retry_count, 0, "nothing tried again");
  cr_expect_eq(s.oom_count, 1);
  cr_expect_eq(s.alloc_count, 1);
  /* The session is still the caller's to end. */
  cr_assert_eq(mp_direct_free_session(d), MP_OK, "%s", mp_last_error());
  s = stats(d);
  cr_expect_eq(s.free_blocks, 0);
  cr_expect_eq(s.device_free_count, 1);
  done(d, dev);
}

Test(direct_more_than_the_device, twice_its_size_ends_no_session) {
  too_big_keeps_the_session((size_t)128 << 20);
}

Test(direct_more_than_the_device, size_max_ends_no_session) {
  too_big_keeps_the_session(SIZE_MAX);
}

/* Within the device's size the full device still ends the session and
 * tries again: only what can never fit is refused at once. */
Test(direct_more_than_the_device, a_fit_after_the_session_still_retries) {
  mp_device_t *dev;
  mp_direct_t *d = direct_on_64m(&dev);
  void *a = NULL, *b = NULL;
  cr_assert_eq(mp_direct_alloc(d, 40u << 20, NULL, &a), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_direct_free(d, a), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_direct_alloc(d, 40u << 20, NULL, &b), MP_OK, "%s",
               mp_last_error());
  mp_stats_t s = stats(d);
  cr_expect_eq(s.device_free_count, 1);
  cr_expect_eq(s.alloc_retry_count, 1);
  cr_expect_eq(s.oom_count, 0);
  done(d, dev);
}
