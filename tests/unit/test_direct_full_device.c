/* test_direct_full_device.c - mp_direct_alloc finding the device full: it
 * ends the session and retries once. A session the device refused part of
 * (pool_fakedev.h's refuse_frees) still gave the rest back, so the retry
 * must happen: it used to be skipped whenever the session reported any
 * failure, and the allocation was MP_ENOMEM with room on the device. */
#include <criterion/criterion.h>

#include <mempool/mempool.h>

#include "pool_fakedev.h"

/* A direct allocator on a new fake device of 64 MiB. */
static mp_direct_t *direct_on_fake(mp_device_t **dev) {
  *dev = fake_open((size_t)64 << 20, 0);
  mp_direct_t *d;
  cr_assert_eq(mp_direct_create(*dev, &d), MP_OK);
  return d;
}

Test(direct_full_device, a_session_refused_in_part_still_lets_the_alloc_retry) {
  mp_device_t *dev;
  mp_direct_t *d = direct_on_fake(&dev);
  fake_dev_t *f = fake_of(dev);
  void *p[3];
  size_t sizes[3] = {(size_t)16 << 20, (size_t)16 << 20, (size_t)32 << 20};
  for (int i = 0; i < 3; i++)
    cr_assert_eq(mp_direct_alloc(d, sizes[i], NULL, &p[i]), MP_OK);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(mp_direct_free(d, p[i]), MP_OK);
  /* The session's first free is refused: 48 MiB go back, 16 MiB stay. */
  f->refuse_frees = 1;
  void *q = NULL;
  cr_assert_eq(mp_direct_alloc(d, (size_t)40 << 20, NULL, &q), MP_OK,
               "48 MiB were given back: %s", mp_last_error());
  mp_stats_t s;
  cr_assert_eq(mp_direct_get_stats(d, &s), MP_OK);
  cr_expect_eq(s.oom_count, 0);
  cr_expect_eq(s.free_blocks, 1, "the refused block stays deferred");
  cr_expect_eq(s.reserved_bytes, f->used);
  cr_assert_eq(mp_direct_free(d, q), MP_OK);
  cr_assert_eq(mp_direct_destroy(d), MP_OK);
  cr_expect_eq(f->used, 0);
  fake_close(dev);
}

/* The fake device with a message on its refusals, and a synchronization
 * that fails (as one from a host function, or a driver error, does). */
static mp_status_t say_full(mp_device_t *dev, size_t bytes, void **out) {
  mp_status_t st = fake_alloc(dev, bytes, out);
  return st == MP_ENOMEM ? mp__fail(st, "fake: out of memory") : st;
}
static mp_status_t refuse_sync(mp_device_t *dev) {
  (void)dev;
  return mp__fail(MP_EDRIVER, "fake: synchronize refused");
}

/* A session that cannot end releases nothing: the allocation is MP_ENOMEM
 * and mp_last_error() explains the MP_ENOMEM. It said what the session's
 * synchronization said, so the status and the message disagreed. */
Test(direct_full_device, an_oom_whose_session_cannot_end_explains_the_oom) {
  mp_device_t *dev;
  mp_direct_t *d = direct_on_fake(&dev);
  mp__backend_t ops = fake_backend;
  ops.alloc = say_full;
  dev->ops = &ops;
  void *p, *q = NULL;
  cr_assert_eq(mp_direct_alloc(d, (size_t)40 << 20, NULL, &p), MP_OK);
  cr_assert_eq(mp_direct_free(d, p), MP_OK);
  ops.synchronize = refuse_sync;
  cr_assert_eq(mp_direct_alloc(d, (size_t)40 << 20, NULL, &q), MP_ENOMEM);
  cr_expect_eq(mp_last_status(), MP_ENOMEM);
  cr_expect_neq(strstr(mp_last_error(), "out of memory"), NULL, "%s",
                mp_last_error());
  mp_stats_t s;
  cr_assert_eq(mp_direct_get_stats(d, &s), MP_OK);
  cr_expect_eq(s.oom_count, 1);
  cr_expect_eq(s.free_blocks, 1, "the deferred block stays");
  ops.synchronize = fake_backend.synchronize;
  cr_assert_eq(mp_direct_destroy(d), MP_OK);
  fake_close(dev);
}
