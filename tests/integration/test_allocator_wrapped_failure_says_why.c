/* test_allocator_wrapped_failure_says_why.c - a wrapped allocator
 * (mp_allocator_wrap) whose operation fails without a message of its own
 * (a bare `return MP_ENOMEM;`, as a caller's table usually does): the
 * mp_allocator_* call still records the failure, so that mp_last_status()
 * is the status it returned and mp_last_error() names the allocator,
 * rather than describing an older, unrelated failure (or none) - what
 * mpbench's replay report quotes after a failed allocation. A message the
 * operation did record (mp_error_restore) is kept. */
#include <criterion/criterion.h>
#include <string.h>

#include <mempool/allocator.h>
#include <mempool/mempool.h>

static mp_status_t bare_alloc(void *self, size_t bytes, mp_stream_t s,
                              void **out) {
  (void)self, (void)bytes, (void)s, (void)out;
  return MP_ENOMEM;
}
static mp_status_t bare_free(void *self, void *ptr) {
  (void)self, (void)ptr;
  return MP_EBUSY;
}
static mp_status_t bare_record(void *self, void *ptr, mp_stream_t s) {
  (void)self, (void)ptr, (void)s;
  return MP_EDRIVER;
}
static mp_status_t bare_stats(void *self, mp_stats_t *out) {
  (void)self, (void)out;
  return MP_EIO;
}
static mp_status_t bare_release(void *self) {
  (void)self;
  return MP_ELIMIT;
}
static mp_status_t bare_destroy(void *self) {
  (void)self;
  return MP_EIO;
}

static const mp_allocator_ops_t bare_ops = {
    "bare",     bare_alloc,   bare_free,   bare_record,
    bare_stats, bare_release, bare_destroy};

/* An older failure of this thread, unrelated to the allocator. */
static void stale_failure(void) {
  cr_assert_eq(mp_allocator_free(NULL, NULL), MP_EINVAL);
  cr_assert_eq(mp_last_status(), MP_EINVAL);
}

static void expect_said(const char *what, mp_status_t got, mp_status_t want) {
  cr_expect_eq(got, want, "%s returned %s", what, mp_status_name(got));
  cr_expect_eq(mp_last_status(), want, "%s: mp_last_status() is %s (%s)", what,
               mp_status_name(mp_last_status()), mp_last_error());
  cr_expect_neq(strstr(mp_last_error(), "'wrapped-bare'"), NULL,
                "%s: message does not name the allocator: %s", what,
                mp_last_error());
  cr_expect_neq(strstr(mp_last_error(), what), NULL,
                "%s: message does not name the call: %s", what,
                mp_last_error());
}

Test(allocator_wrapped_failure, each_call_records_the_status_it_returns) {
  mp_allocator_t *a;
  cr_assert_eq(mp_allocator_wrap(&bare_ops, NULL, "wrapped-bare", &a), MP_OK);
  void *p = NULL;
  mp_stats_t st;

  stale_failure();
  expect_said("mp_allocator_alloc", mp_allocator_alloc(a, 64, NULL, &p),
              MP_ENOMEM);
  stale_failure();
  expect_said("mp_allocator_free", mp_allocator_free(a, (void *)0x1000),
              MP_EBUSY);
  stale_failure();
  expect_said("mp_allocator_record_stream",
              mp_allocator_record_stream(a, (void *)0x1000, NULL), MP_EDRIVER);
  stale_failure();
  expect_said("mp_allocator_get_stats", mp_allocator_get_stats(a, &st), MP_EIO);
  stale_failure();
  expect_said("mp_allocator_release", mp_allocator_release(a), MP_ELIMIT);
  /* Any failure of a wrapped destroy but MP_EBUSY ends the allocator; the
   * message is written before it goes. */
  stale_failure();
  expect_said("mp_allocator_destroy", mp_allocator_destroy(a), MP_EIO);
}

/* An operation that records its own reason keeps it. */
static mp_status_t said_alloc(void *self, size_t bytes, mp_stream_t s,
                              void **out) {
  (void)self, (void)bytes, (void)s, (void)out;
  mp_error_state_t e;
  mp_error_save(&e);
  e.status = MP_ELIMIT;
  e.driver_error = 0;
  snprintf(e.message, sizeof e.message, "toy: quota of 3 blocks reached");
  mp_error_restore(&e);
  return MP_ELIMIT;
}

Test(allocator_wrapped_failure, an_operations_own_message_is_kept) {
  mp_allocator_ops_t ops = {.alloc = said_alloc, .free = bare_free};
  mp_allocator_t *a;
  cr_assert_eq(mp_allocator_wrap(&ops, NULL, "wrapped-said", &a), MP_OK);
  stale_failure();
  void *p = NULL;
  cr_expect_eq(mp_allocator_alloc(a, 64, NULL, &p), MP_ELIMIT);
  cr_expect_eq(mp_last_status(), MP_ELIMIT);
  cr_expect_str_eq(mp_last_error(), "toy: quota of 3 blocks reached");
  cr_expect_eq(mp_allocator_destroy(a), MP_OK);
}
