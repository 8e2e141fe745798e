/* test_pool_destroy_lost_segment_no_stale_reason.c - mp_pool_destroy frees
 * its first plain segment (mp__plain_release_first), and the release has
 * begun: where the device then refuses to free another plain segment
 * without recording why (a bare MP_EDRIVER), the pool is destroyed all the
 * same and its message says the device gave no reason. Before, it gave
 * the thread's last error, an older failure of the caller's
 * ("mp_pool_free: ... points inside the block ..."), as the device's
 * reason (grow.c mp__segment_release_all). A refusal that says why still
 * ends the message with its reason. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

/* The next ok_frees frees succeed; those after are refused, with
 * said_why's message where it is set, else bare. */
static unsigned ok_frees;
static const char *said_why;
static mp__backend_t late_backend;

static mp_status_t late_free(mp_device_t *dev, void *ptr) {
  if (ok_frees > 0) {
    ok_frees--;
    return fake_free(dev, ptr);
  }
  if (said_why != NULL)
    return mp__fail(MP_EDRIVER, "%s", said_why);
  return MP_EDRIVER;
}

/* A plain pool with two wholly free 4 MiB segments, after a failure of the
 * caller's own (its message in stale); its device refuses every free
 * after the first. */
static mp_pool_t *two_free_segments(mp_device_t *dev, char *stale, size_t n) {
  mp_pool_t *p = make_pool(dev, "virtual=0");
  void *v[2];
  for (int i = 0; i < 2; i++)
    cr_assert_eq(mp_pool_alloc(p, 4 * MiB, NULL, &v[i]), MP_OK, "%s",
                 mp_last_error());
  cr_assert_eq(stats(p).segment_count, 2);
  cr_assert_eq(mp_pool_free(p, v[1]), MP_OK);
  cr_assert_eq(mp_pool_free(p, (char *)v[0] + 512), MP_EINVAL);
  snprintf(stale, n, "%s", mp_last_error());
  cr_assert_neq(stale[0], '\0');
  cr_assert_eq(mp_pool_free(p, v[0]), MP_OK);
  check(p);
  late_backend = fake_backend;
  late_backend.free = late_free;
  dev->ops = &late_backend;
  ok_frees = 1;
  return p;
}

/* mp_pool_destroy(p) fails with MP_EDRIVER once the release had begun,
 * its message holding `reason` and no older failure (stale). */
static void expect_lost(mp_pool_t *p, const char *reason, const char *stale) {
  mp_status_t st = mp_pool_destroy(p);
  const char *e = mp_last_error();
  cr_expect_eq(st, MP_EDRIVER, "%s: %s", mp_status_name(st), e);
  cr_expect(strstr(e, "mp_pool_destroy: the device refused to free the "
                      "plain segment") != NULL,
            "%s", e);
  cr_expect(strstr(e, "once the release had begun") != NULL, "%s", e);
  cr_expect(strstr(e, reason) != NULL, "%s", e);
  cr_expect(strstr(e, stale) == NULL,
            "an older failure given as the device's reason: %s", e);
  cr_expect_eq(ok_frees, 0, "the first segment was not freed");
}

Test(pool_destroy_lost_segment, a_refusal_without_a_reason_gives_none) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  char stale[MP__ERROR_MAX];
  mp_pool_t *p = two_free_segments(dev, stale, sizeof stale);
  said_why = NULL;
  expect_lost(p, "device driver error (the device gave no reason)", stale);
  fake_close(dev);
}

Test(pool_destroy_lost_segment, a_refusal_with_a_reason_gives_it) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  char stale[MP__ERROR_MAX];
  mp_pool_t *p = two_free_segments(dev, stale, sizeof stale);
  said_why = "fake free refused: the test says no";
  expect_lost(p, said_why, stale);
  fake_close(dev);
}
