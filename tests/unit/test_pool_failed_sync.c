/* A synchronize whose wait fails (a pause or trim called where the device
 * refuses to wait, such as a host function on a stream) must forget no
 * stream's work: the events it took from a destroyed stream are gone with
 * the failed wait, so the next synchronize covers that stream by a device
 * synchronize, not by taking its work for done. */
#include <criterion/criterion.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

/* The fake device, with every event still pending (its queries say
 * MP_EBUSY) and the next event wait failing while fail_waits. */
static bool fail_waits;
static unsigned waits_failed;
static mp__backend_t slow_backend;

static mp_status_t slow_query(mp_device_t *dev, mp_event_t e) {
  (void)dev;
  (void)e;
  return MP_EBUSY;
}

static mp_status_t slow_event_sync(mp_device_t *dev, mp_event_t e) {
  (void)dev;
  (void)e;
  if (!fail_waits)
    return MP_OK;
  waits_failed++;
  return mp__fail(MP_EDRIVER, "fake: no wait here");
}

static mp_device_t *slow_open(size_t granule) {
  slow_backend = fake_backend;
  slow_backend.event_query = slow_query;
  slow_backend.event_synchronize = slow_event_sync;
  mp_device_t *dev = fake_open((size_t)1 << 30, granule);
  dev->ops = &slow_backend;
  fail_waits = false;
  waits_failed = 0;
  return dev;
}

/* A pool whose only free block was freed on stream s, then s destroyed
 * with that work still pending (its closing marker incomplete). */
static mp_pool_t *freed_on_a_destroyed_stream(mp_device_t *dev) {
  mp_pool_t *p = make_pool(dev, NULL);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  void *x;
  cr_assert_eq(mp_pool_alloc(p, MiB, s, &x), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(p, x), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
  return p;
}

Test(pool_failed_sync, a_failed_trim_keeps_a_destroyed_streams_work_owed) {
  mp_device_t *dev = slow_open(0);
  mp_pool_t *p = freed_on_a_destroyed_stream(dev);
  size_t reserved = stats(p).reserved_bytes;
  cr_assert_gt(reserved, 0);
  fail_waits = true;
  cr_assert_eq(mp_pool_trim(p, 0), MP_EDRIVER, "%s", mp_last_error());
  cr_assert_eq(waits_failed, 1, "the test needs the wait to fail");
  cr_expect_eq(stats(p).reserved_bytes, reserved);
  fail_waits = false;
  unsigned syncs = fake_of(dev)->syncs;
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(fake_of(dev)->syncs, syncs + 1,
               "the destroyed stream's work was taken for done unwaited");
  cr_expect_eq(stats(p).reserved_bytes, 0);
  check(p);
  cr_assert_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
  fake_close(dev);
}

Test(pool_failed_sync, a_failed_pause_keeps_a_destroyed_streams_work_owed) {
  mp_device_t *dev = slow_open(2 * MiB); /* pause needs virtual memory */
  mp_pool_t *p = freed_on_a_destroyed_stream(dev);
  cr_assert_not_null(p->vseg, "the test needs a virtual pool");
  size_t reserved = stats(p).reserved_bytes;
  fail_waits = true;
  cr_assert_eq(mp_pool_pause(p, 0), MP_EDRIVER, "%s", mp_last_error());
  cr_assert_eq(waits_failed, 1, "the test needs the wait to fail");
  cr_expect_eq(stats(p).reserved_bytes, reserved, "the pool is not paused");
  fail_waits = false;
  unsigned syncs = fake_of(dev)->syncs;
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(fake_of(dev)->syncs, syncs + 1,
               "the destroyed stream's work was taken for done unwaited");
  check(p);
  cr_assert_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
  fake_close(dev);
}
