/* test_pool_release_threshold_keeps_last_error.c - a free that succeeds
 * leaves the thread's last error as it was (status.h: "A later success
 * does not clear it; the next failure replaces it"), also when the
 * release_threshold give-back it runs meets a refusal of the device. The
 * refusal stays the pool's to retry (the next trim, a later free), and is
 * no failure of the free. Before, mp_pool_free answered MP_OK and the
 * last error was "release_threshold: the device refused to take back ...",
 * replacing the failure the caller was about to report. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

Test(pool_release_threshold_last_error, a_refused_give_back_in_a_free) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *p = make_pool(dev, "virtual=0,release_threshold=1M");
  void *a, *b;
  cr_assert_eq(mp_pool_alloc(p, 4 * MiB, NULL, &a), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_alloc(p, 4 * MiB, NULL, &b), MP_OK, "%s",
               mp_last_error());
  /* The give-back looks before the freed block joins the free memory:
   * a's free leaves 4 MiB free, over the threshold, for the next one. */
  cr_assert_eq(mp_pool_free(p, a), MP_OK, "%s", mp_last_error());
  cr_assert_eq(fake_of(dev)->used, 8 * MiB);
  /* The caller's failure, still to be reported. */
  cr_assert_eq(mp_pool_free(p, (char *)b + 512), MP_EINVAL);
  char before[MP_ERROR_MESSAGE_MAX];
  snprintf(before, sizeof before, "%s", mp_last_error());
  cr_assert_neq(before[0], '\0');
  /* b's free gives a's segment back; the device refuses. */
  fake_of(dev)->refuse_frees = 1;
  cr_expect_eq(mp_pool_free(p, b), MP_OK, "%s", mp_last_error());
  cr_expect_eq(fake_of(dev)->refuse_frees, 0, "the give-back was tried");
  cr_expect_eq(fake_of(dev)->used, 8 * MiB, "refused: a's segment stays");
  cr_expect_str_eq(mp_last_error(), before);
  cr_expect_eq(mp_last_status(), MP_EINVAL);
  check(p);
  /* Nothing lost: a trim gives both segments back. */
  cr_expect_eq(mp_pool_trim(p, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(fake_of(dev)->used, 0);
  cr_expect_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
  fake_close(dev);
}
