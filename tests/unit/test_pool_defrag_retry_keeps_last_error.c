/* test_pool_defrag_retry_keeps_last_error.c - mp_pool_defragment,
 * mp_pool_freeze and mp_pool_pause first try again to free a staging
 * buffer an earlier defragmentation kept (defrag.c: the device refused its
 * free). That try may be refused again, and the call still succeeds; it
 * then leaves the thread's last error as it was (status.h: "A later
 * success does not clear it; the next failure replaces it"), as
 * mp_pool_trim does (test_pool_trim_retries_keep_last_error). Before, the
 * call answered MP_OK with the refused retry's message as the last
 * error, replacing the failure the caller was still to report. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "kept_staging.h"

/* The caller's failure, still to be reported; its message in msg. */
static void caller_failure(char *msg, size_t n) {
  cr_assert_eq(mp_pool_trim(NULL, 0), MP_EINVAL);
  snprintf(msg, n, "%s", mp_last_error());
  cr_assert_neq(msg[0], '\0');
}

/* At the fake device's next free, which refuse_frees refuses: the
 * device's own message, as a driver's refusal records one. */
static void device_says_why(void *ctx) {
  (void)ctx;
  (void)mp__fail(MP_EDRIVER, "fake free refused: the device says why");
}

/* A pool on dev (opts) that keeps a staging buffer, its next free refused
 * again with a message; the caller's last error in msg. */
static mp_handle_t *kept_and_refused(mp_device_t *dev, mp_pool_t **p,
                                     const char *opts, char *msg, size_t n) {
  *p = make_pool(dev, opts);
  mp_handle_t *big = kept_staging_buffer(*p, dev);
  caller_failure(msg, n);
  fake_of(dev)->refuse_frees = 1;
  fake_of(dev)->on_free = device_says_why;
  return big;
}

static void keeps(mp_status_t st, const char *msg, mp_device_t *dev,
                  mp_pool_t *p) {
  cr_expect_eq(st, MP_OK, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect_str_eq(mp_last_error(), msg);
  cr_expect_eq(mp_last_status(), MP_EINVAL);
  cr_expect_eq(fake_of(dev)->refuse_frees, 0,
               "the kept buffer's free was not tried");
  cr_expect_eq(p->nstage_kept, 1, "the refused buffer is not kept");
}

static void finish(mp_pool_t *p, mp_device_t *dev, mp_handle_t *big) {
  cr_expect_eq(mp_pool_trim(p, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(p->nstage_kept, 0, "the kept buffer is still kept");
  cr_assert_eq(mp_handle_free(big), MP_OK);
  fake_pool_finish(p, dev);
}

#define PLAIN "virtual=0,max_bytes=8M,segment_bytes=2M,align=512"

Test(pool_defrag_retry_keeps_last_error, defragment) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *p;
  char msg[MP__ERROR_MAX];
  mp_handle_t *big = kept_and_refused(dev, &p, PLAIN, msg, sizeof msg);
  keeps(mp_pool_defragment(p, NULL, NULL), msg, dev, p);
  finish(p, dev, big);
}

Test(pool_defrag_retry_keeps_last_error, freeze) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *p;
  char msg[MP__ERROR_MAX];
  mp_handle_t *big = kept_and_refused(dev, &p, PLAIN, msg, sizeof msg);
  keeps(mp_pool_freeze(p), msg, dev, p);
  finish(p, dev, big);
}

/* On its virtual range (the staging buffer is a plain allocation all the
 * same), so that the pause runs. */
Test(pool_defrag_retry_keeps_last_error, pause) {
  mp_device_t *dev = fake_open((size_t)1 << 30, (size_t)2 << 20);
  mp_pool_t *p;
  char msg[MP__ERROR_MAX];
  mp_handle_t *big =
      kept_and_refused(dev, &p, "max_bytes=8M,align=512", msg, sizeof msg);
  keeps(mp_pool_pause(p, 0), msg, dev, p);
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  finish(p, dev, big);
}
