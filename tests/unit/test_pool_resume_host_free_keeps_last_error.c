/* test_pool_resume_host_free_keeps_last_error.c - a resume that maps the
 * pool again and copies its kept content back succeeds even where the
 * device then refuses to free the page-locked host copy (pause.c,
 * mp__resume_finish: the pool runs, nothing of it is lost); it then leaves
 * the thread's last error as it was (status.h: "A later success does not
 * clear it; the next failure replaces it"). Before, mp_pool_resume
 * answered MP_OK with the refused free's message as the last error,
 * replacing the failure the caller was still to report. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "flaky_unmap.h"

#define MiB ((size_t)1 << 20)

/* A host free the device refuses, with its message: the memory is not
 * freed (the pool keeps it and frees it at its destroy). */
static mp_status_t refused_host_free(mp_device_t *dev, void *ptr) {
  (void)dev;
  (void)ptr;
  return mp__fail(MP_EDRIVER, "fake host_free refused: the device says why");
}

Test(pool_resume_host_free_keeps_last_error, a_kept_content_resume) {
  mp_device_t *dev = flaky_open(0);
  mp_pool_t *p = make_pool(dev, NULL);
  void *v;
  cr_assert_eq(mp_pool_alloc(p, MiB, NULL, &v), MP_OK);
  memset(v, 0x5a, MiB);
  cr_assert_eq(mp_pool_pause(p, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  flaky_backend.host_free = refused_host_free;
  /* The caller's failure, still to be reported. */
  cr_assert_eq(mp_pool_trim(NULL, 0), MP_EINVAL);
  char msg[512];
  snprintf(msg, sizeof msg, "%s", mp_last_error());
  mp_status_t st = mp_pool_resume(p);
  flaky_backend.host_free = flaky_host_free;
  cr_expect_eq(st, MP_OK, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect_str_eq(mp_last_error(), msg);
  cr_expect_eq(mp_last_status(), MP_EINVAL);
  const unsigned char *c = v;
  size_t at = 0;
  while (at < MiB && c[at] == 0x5a)
    at++;
  cr_expect_eq(at, MiB, "the content differs from byte %zu", at);
  cr_assert_eq(mp_pool_free(p, v), MP_OK);
  fake_pool_finish(p, dev);
}
