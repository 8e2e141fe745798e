/* test_pool_pause_refused_keeps_staging_buffer.c - a pause refused (a child
 * pool live, plain segments that cannot keep their addresses) changes
 * nothing (status.h): not even the retry of a staging buffer an earlier
 * defragmentation kept (defrag.c), which frees it, gives its room under the
 * cap back and counts a device free. Before, mp__pause_one (pause.c) made
 * that retry before its check. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "kept_staging.h"

/* Pauses p, which the pause refuses with want, and checks that the kept
 * staging buffer is still kept and nothing was freed. */
static void expect_refused_keeping(mp_pool_t *p, mp_device_t *dev,
                                   mp_status_t want) {
  fake_dev_t *f = fake_of(dev);
  mp_stats_t before = stats(p);
  size_t staged = p->staged;
  unsigned frees = f->frees;
  mp_status_t st = mp_pool_pause(p, 0);
  cr_expect_eq(st, want, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect_eq(p->nstage_kept, 1, "the kept staging buffer was freed");
  cr_expect_eq(p->staged, staged, "the kept buffer's room changed");
  cr_expect_eq(f->frees, frees, "the device freed something");
  cr_expect_eq(stats(p).device_free_count, before.device_free_count);
}

static mp_pool_t *pool_keeping_staging(mp_device_t **dev, mp_handle_t **big) {
  *dev = fake_open((size_t)1 << 30, 0);
  mp_pool_t *p =
      make_pool(*dev, "virtual=0,max_bytes=8M,segment_bytes=2M,align=512");
  *big = kept_staging_buffer(p, *dev);
  return p;
}

Test(pool_pause_refused_keeps_staging_buffer, a_child_pool_live) {
  mp_device_t *dev;
  mp_handle_t *big;
  mp_pool_t *p = pool_keeping_staging(&dev, &big);
  mp_pool_t *child = NULL;
  cr_assert_eq(mp_pool_create_child(p, 4096, &child), MP_OK, "%s",
               mp_last_error());
  expect_refused_keeping(p, dev, MP_EBUSY);
  cr_expect(strstr(mp_last_error(), "child") != NULL, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(child), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_handle_free(big), MP_OK);
  fake_pool_finish(p, dev);
}

Test(pool_pause_refused_keeps_staging_buffer, plain_segments) {
  mp_device_t *dev;
  mp_handle_t *big;
  mp_pool_t *p = pool_keeping_staging(&dev, &big);
  expect_refused_keeping(p, dev, MP_ENOTSUP);
  cr_assert_eq(mp_handle_free(big), MP_OK);
  fake_pool_finish(p, dev);
}

/* Refused after its first checks, for lack of host memory (fault.c: the
 * k-th host allocation fails, k = 0, 1, ... until the pause goes through:
 * the events for the streams), on a virtual range: the staging buffer
 * stays kept until the pause that goes through. Before, mp__pause_one
 * retried its free once the first checks passed, and a pause refused later
 * had freed it. */
Test(pool_pause_refused_keeps_staging_buffer, refused_later_for_host_memory) {
  mp_device_t *dev = fake_open((size_t)1 << 30, (size_t)2 << 20);
  mp_pool_t *p = make_pool(dev, "max_bytes=8M,align=512");
  mp_handle_t *big = kept_staging_buffer(p, dev);
  fake_dev_t *f = fake_of(dev);
  int failed = 0;
  mp_status_t st = MP_ENOMEM;
  for (long k = 0; k < 1000; k++) {
    unsigned frees = f->frees;
    mp__fault_host_after(k);
    st = mp_pool_pause(p, 0);
    mp__fault_host_after(-1);
    if (st == MP_OK)
      break;
    failed++;
    cr_assert_eq(st, MP_ENOMEM, "k=%ld: %s", k, mp_last_error());
    cr_assert_eq(p->nstage_kept, 1,
                 "k=%ld: a refused pause freed the kept staging buffer", k);
    cr_assert_eq(f->frees, frees, "k=%ld: the device freed something", k);
  }
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  cr_expect_geq(failed, 1, "no host allocation failed the pause");
  cr_expect_eq(p->nstage_kept, 0, "the pause that went through kept it");
  cr_assert_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_handle_free(big), MP_OK);
  fake_pool_finish(p, dev);
}
