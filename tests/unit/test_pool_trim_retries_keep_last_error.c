/* test_pool_trim_retries_keep_last_error.c - mp_pool_trim tries again what
 * the device refused before and the pool still holds: a staging buffer
 * defragmentation kept (defrag.c) and a stray mapping (vrange.c). Those
 * tries may be refused again, and the trim still succeeds; it then leaves
 * the thread's last error as it was (status.h: "A later success does not
 * clear it; the next failure replaces it"). Before, the trim answered
 * MP_OK with the refused retry's message as the last error ("fake free
 * refused: ...", "... is still mapped: fake vm_unmap #N fails"), replacing the
 * failure the caller was still to report. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "flaky_unmap.h"
#include "kept_staging.h"

#define MiB ((size_t)1 << 20)

/* The caller's failure, still to be reported; its message in msg. */
static void caller_failure(char *msg, size_t n) {
  cr_assert_eq(mp_pool_trim(NULL, 0), MP_EINVAL);
  snprintf(msg, n, "%s", mp_last_error());
  cr_assert_neq(msg[0], '\0');
}

/* mp_pool_trim(p, 0) succeeds and leaves msg the last error. */
static void trim_keeps(mp_pool_t *p, const char *msg) {
  mp_status_t st = mp_pool_trim(p, 0);
  cr_expect_eq(st, MP_OK, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect_str_eq(mp_last_error(), msg);
  cr_expect_eq(mp_last_status(), MP_EINVAL);
  check(p);
}

/* At the fake device's next free, which refuse_frees refuses: the
 * device's own message, as a driver's refusal records one. */
static void device_says_why(void *ctx) {
  (void)ctx;
  (void)mp__fail(MP_EDRIVER, "fake free refused: the device says why");
}

/* A slide (a 1 MiB movable block 4 KiB up) whose staging buffer's free
 * the device refuses: the pool keeps the buffer, and the trim's try to
 * free it is refused again. */
Test(pool_trim_retries_keep_last_error, a_kept_staging_buffer) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  fake_dev_t *f = fake_of(dev);
  mp_pool_t *p =
      make_pool(dev, "virtual=0,max_bytes=8M,segment_bytes=2M,align=512");
  mp_handle_t *big = kept_staging_buffer(p, dev);
  char msg[MP__ERROR_MAX];
  caller_failure(msg, sizeof msg);
  f->refuse_frees = 1;
  f->on_free = device_says_why;
  trim_keeps(p, msg);
  cr_expect_eq(f->refuse_frees, 0, "the kept buffer's free was not tried");
  cr_expect_eq(mp_pool_trim(p, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(p->nstage_kept, 0, "the kept buffer is still kept");
  cr_assert_eq(mp_handle_free(big), MP_OK);
  fake_pool_finish(p, dev);
}

/* A growth's map refused to the peer, then its unmap: a stray, nothing
 * free beside it. The trim's try to unmap it is refused again. */
Test(pool_trim_retries_keep_last_error, a_stray_mapping) {
  mp_device_t *dev = flaky_open(0), *peer = flaky_peer_open();
  mp_pool_t *p = make_pool(dev, NULL);
  cr_assert_eq(mp_pool_set_access(p, peer), MP_OK, "%s", mp_last_error());
  void *v, *x;
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &v), MP_OK);
  access_fail_at = access_calls + 1;
  unmap_fail_at = unmap_calls + 1;
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &x), MP_EDRIVER);
  cr_assert_eq(p->nstrays, 1, "no stray");
  cr_assert_eq(stats(p).free_bytes, 0);
  char msg[MP__ERROR_MAX];
  caller_failure(msg, sizeof msg);
  unmap_fail_at = unmap_calls + 1;
  trim_keeps(p, msg);
  cr_expect_eq(unmap_calls, unmap_fail_at, "the stray's unmap was not tried");
  cr_expect_eq(mp_pool_trim(p, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(p->nstrays, 0, "the stray is still mapped");
  cr_assert_eq(mp_pool_free(p, v), MP_OK);
  fake_pool_finish(p, dev);
  fake_close(peer);
}
