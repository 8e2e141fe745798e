/* test_pool_refusal_gives_no_stale_reason.c - mp_pool_trim whose device
 * refuses to take back free memory, and mp_pool_destroy whose device
 * refuses to free a plain segment, fail with a message that ends with why
 * the device refused: the thread's last error the refusing call recorded.
 * A device call that refuses without recording one (the backend's table
 * promises no message: the fake device here answers a bare MP_EDRIVER)
 * leaves an older failure as the last error: the message gave that as the
 * device's reason ("... stays reserved (tried again at the next trim):
 * mp_pool_free: ... points inside the block ..."). It says now that the
 * device gave none. A refusal that says why still ends the message with
 * its reason. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

/* A plain pool with a wholly free 4 MiB segment, after a failure of the
 * caller's own (its message in msg). */
static mp_pool_t *free_segment_after_failure(mp_device_t *dev, char *msg,
                                             size_t n) {
  mp_pool_t *p = make_pool(dev, "virtual=0");
  void *a;
  cr_assert_eq(mp_pool_alloc(p, 4 * MiB, NULL, &a), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(p, (char *)a + 512), MP_EINVAL);
  snprintf(msg, n, "%s", mp_last_error());
  cr_assert_neq(msg[0], '\0');
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  return p;
}

/* The call's answer st: MP_EDRIVER, its message saying what (`what`) and
 * holding no older failure (stale). */
static void expect_refused(mp_status_t st, const char *what,
                           const char *stale) {
  const char *e = mp_last_error();
  cr_expect_eq(st, MP_EDRIVER, "%s: %s", mp_status_name(st), e);
  cr_expect(strstr(e, what) != NULL, "%s", e);
  cr_expect(strstr(e, stale) == NULL,
            "an older failure given as the device's reason: %s", e);
}

static void expect_trim_refused(mp_pool_t *p, const char *stale) {
  expect_refused(mp_pool_trim(p, 0),
                 "mp_pool_trim: the device refused to take back 1 piece of "
                 "free memory",
                 stale);
}

Test(pool_refusal_reason, a_refusal_without_a_reason_gives_none) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  char stale[MP__ERROR_MAX];
  mp_pool_t *p = free_segment_after_failure(dev, stale, sizeof stale);
  fake_of(dev)->refuse_frees = 1000;
  expect_trim_refused(p, stale);
  cr_expect(strstr(mp_last_error(), "device driver error (the device gave "
                                    "no reason)") != NULL,
            "%s", mp_last_error());
  fake_of(dev)->refuse_frees = 0;
  cr_expect_eq(mp_pool_trim(p, 0), MP_OK, "%s", mp_last_error());
  fake_pool_finish(p, dev);
}

/* The device's free records why it refuses. */
static mp_status_t said_free(mp_device_t *dev, void *ptr) {
  (void)dev;
  return mp__fail(MP_EDRIVER, "fake free of %p refused: the test says no", ptr);
}

static mp__backend_t said_backend;

Test(pool_refusal_reason, a_refusal_with_a_reason_gives_it) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  char stale[MP__ERROR_MAX];
  mp_pool_t *p = free_segment_after_failure(dev, stale, sizeof stale);
  said_backend = fake_backend;
  said_backend.free = said_free;
  dev->ops = &said_backend;
  expect_trim_refused(p, stale);
  cr_expect(strstr(mp_last_error(), "refused: the test says no") != NULL, "%s",
            mp_last_error());
  dev->ops = &fake_backend;
  cr_expect_eq(mp_pool_trim(p, 0), MP_OK, "%s", mp_last_error());
  fake_pool_finish(p, dev);
}

/* mp_pool_destroy: the pool stays as it was, its message the device's
 * refusal with no older failure in it. */
Test(pool_refusal_reason, a_refused_destroy_gives_no_older_reason) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  char stale[MP__ERROR_MAX];
  mp_pool_t *p = free_segment_after_failure(dev, stale, sizeof stale);
  fake_of(dev)->refuse_frees = 1;
  expect_refused(mp_pool_destroy(p),
                 "mp_pool_destroy: the device refused to free the plain "
                 "segment",
                 stale);
  cr_expect(strstr(mp_last_error(), "device driver error (the device gave "
                                    "no reason)") != NULL,
            "%s", mp_last_error());
  cr_expect_eq(stats(p).reserved_bytes, 4 * MiB, "the pool is as it was");
  fake_pool_finish(p, dev);
}
