/* refuse_records.h - pool_fakedev.h's device whose event records are
 * refused while `refusing` is set (counted in `refused`), and the caller's
 * last error the tests set before a call that must keep it (status.h: a
 * call that succeeds does not replace the caller's last error). */
#ifndef MEMPOOL_TEST_REFUSE_RECORDS_H
#define MEMPOOL_TEST_REFUSE_RECORDS_H

#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "pool_fakedev.h"

static mp__backend_t rr_backend;
static bool refusing;
static unsigned refused;

static mp_status_t rr_record(mp_device_t *dev, mp_event_t e, mp_stream_t s) {
  if (!refusing)
    return fake_event_record(dev, e, s);
  refused++;
  return mp__fail(MP_EDRIVER, "fake device: event record refused");
}

static mp_device_t *rr_open(void) {
  mp_device_t *dev = fake_open(64u << 20, 0);
  rr_backend = fake_backend;
  rr_backend.event_record = rr_record;
  dev->ops = &rr_backend;
  return dev;
}

/* The caller's own failure, as the last error: a refused free of a pointer
 * no pool made. Returns its message. */
static const char *rr_callers_error(mp_pool_t *pool) {
  static char was[512];
  static int not_a_block;
  cr_assert_neq(mp_pool_free(pool, &not_a_block), MP_OK);
  strncpy(was, mp_last_error(), sizeof was - 1);
  cr_assert_neq(was[0], '\0');
  return was;
}

static void rr_expect_kept(const char *was, const char *what) {
  cr_expect(refused > 0, "%s: no event record was refused", what);
  cr_expect_str_eq(mp_last_error(), was,
                   "%s succeeded and replaced the caller's last error", what);
}

#endif
