/* test_pool_trim_success_keeps_last_error.c - mp_pool_trim whose device
 * refuses a piece once and takes it at a later pass of the same trim
 * succeeds (test_pool_trim_refused_once_is_no_refusal.c), and leaves the
 * thread's last error as it was (status.h: "A later success does not clear
 * it; the next failure replaces it"). Before, the trim answered MP_OK and
 * the last error was the device's refusal ("fake vm_unmap #1 fails"),
 * replacing the failure the caller was still to report. Plain segments
 * and the virtual range. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "flaky_unmap.h"

#define MiB ((size_t)1 << 20)

/* The caller's failure, still to be reported: a free of a pointer inside
 * a block. Its message in msg. */
static void caller_failure(mp_pool_t *p, void *live, char *msg, size_t n) {
  cr_assert_eq(mp_pool_free(p, (char *)live + 512), MP_EINVAL);
  snprintf(msg, n, "%s", mp_last_error());
  cr_assert_neq(msg[0], '\0');
}

/* n free blocks of size bytes in p and a small live block after them
 * (returned), then the caller's failure (its message in msg). */
static void *free_beside_live(mp_pool_t *p, size_t n, size_t size, char *msg,
                              size_t msg_n) {
  void *b[4], *live;
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(mp_pool_alloc(p, size, NULL, &b[i]), MP_OK, "%s",
                 mp_last_error());
  cr_assert_eq(mp_pool_alloc(p, 1000, NULL, &live), MP_OK, "%s",
               mp_last_error());
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(mp_pool_free(p, b[i]), MP_OK);
  caller_failure(p, live, msg, msg_n);
  return live;
}

/* Trims p to 0, expecting success, `gone` bytes given back, and the
 * caller's failure still the last error. */
static void trim_keeps(mp_pool_t *p, mp_device_t *dev, const char *msg,
                       size_t gone) {
  size_t held = fake_of(dev)->used;
  mp_status_t st = mp_pool_trim(p, 0);
  cr_expect_eq(st, MP_OK, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect_eq(fake_of(dev)->used, held - gone, "%zu bytes still held",
               fake_of(dev)->used);
  cr_expect_str_eq(mp_last_error(), msg);
  cr_expect_eq(mp_last_status(), MP_EINVAL);
  check(p);
}

/* The fake device's free, refusing its next `refuse_said` calls with a
 * message of its own. */
static unsigned refuse_said;

static mp_status_t said_free(mp_device_t *dev, void *ptr) {
  if (refuse_said > 0) {
    refuse_said--;
    return mp__fail(MP_EDRIVER, "fake free of %p refused", ptr);
  }
  return fake_free(dev, ptr);
}

static mp__backend_t said_backend;

Test(pool_trim_success_keeps_last_error, plain_segments) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  said_backend = fake_backend;
  said_backend.free = said_free;
  dev->ops = &said_backend;
  mp_pool_t *p = make_pool(dev, "virtual=0");
  char msg[MP__ERROR_MAX];
  void *live = free_beside_live(p, 2, 4 * MiB, msg, sizeof msg);
  refuse_said = 1;
  trim_keeps(p, dev, msg, 8 * MiB);
  cr_expect_eq(refuse_said, 0, "the device refused once");
  cr_assert_eq(mp_pool_free(p, live), MP_OK);
  fake_pool_finish(p, dev);
}

Test(pool_trim_success_keeps_last_error, virtual_range) {
  mp_device_t *dev = flaky_open(0);
  mp_pool_t *p = make_pool(dev, "segment_bytes=2M");
  char msg[MP__ERROR_MAX];
  void *live = free_beside_live(p, 3, 2 * MiB, msg, sizeof msg);
  unmap_calls = 0;
  unmap_fail_at = 1;
  trim_keeps(p, dev, msg, 6 * MiB);
  unmap_fail_at = 0;
  cr_expect_geq(unmap_calls, 2, "the refused unmap was asked again");
  cr_assert_eq(mp_pool_free(p, live), MP_OK);
  cr_expect_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
  fake_close(dev);
}
