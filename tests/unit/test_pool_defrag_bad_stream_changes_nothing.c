/* test_pool_defrag_bad_stream_changes_nothing.c - mp_pool_defragment on a
 * stream that is no live stream of the device is MP_EINVAL and changes
 * nothing (bad input: status.h), on a pool without arenas as on one with
 * them (whose call checks the stream first): not even the retry of a
 * staging buffer an earlier defragmentation kept (defrag.c), which frees
 * it, gives its room under the cap back and counts a device free. Before,
 * a pool without arenas made that retry first and then refused the
 * stream. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "kept_staging.h"

static char not_a_stream;

/* The fake device, which knows every stream but &not_a_stream. */
static mp__backend_t picky_backend;
static int picky_stream_kind(mp_device_t *dev, mp_stream_t s) {
  (void)dev;
  return s == (mp_stream_t)&not_a_stream ? MP__STREAM_BAD : MP__STREAM_SHARED;
}

Test(pool_defrag_bad_stream_changes_nothing, with_a_kept_staging_buffer) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  picky_backend = fake_backend;
  picky_backend.stream_kind = picky_stream_kind;
  dev->ops = &picky_backend;
  fake_dev_t *f = fake_of(dev);
  mp_pool_t *p =
      make_pool(dev, "virtual=0,max_bytes=8M,segment_bytes=2M,align=512");
  mp_handle_t *big = kept_staging_buffer(p, dev);
  mp_stats_t before = stats(p);
  size_t staged = p->staged;
  unsigned frees = f->frees;
  size_t moved = 7;
  mp_status_t st = mp_pool_defragment(p, (mp_stream_t)&not_a_stream, &moved);
  cr_expect_eq(st, MP_EINVAL, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect(strstr(mp_last_error(), "not a live stream") != NULL, "%s",
            mp_last_error());
  cr_expect_eq(p->nstage_kept, 1, "the kept staging buffer was freed");
  cr_expect_eq(p->staged, staged, "the kept buffer's room changed");
  cr_expect_eq(f->frees, frees, "the device freed something");
  mp_stats_t after = stats(p);
  cr_expect_eq(after.device_free_count, before.device_free_count);
  cr_expect_eq(after.defrag_count, before.defrag_count);
  /* A good stream then frees it, as before. */
  cr_expect_eq(mp_pool_defragment(p, NULL, NULL), MP_OK, "%s", mp_last_error());
  cr_expect_eq(p->nstage_kept, 0, "the kept buffer is still kept");
  cr_assert_eq(mp_handle_free(big), MP_OK);
  fake_pool_finish(p, dev);
}
