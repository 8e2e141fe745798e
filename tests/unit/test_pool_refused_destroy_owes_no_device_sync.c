/* test_pool_refused_destroy_owes_no_device_sync.c - a destroy that waited
 * for the pool's streams, and was refused after (the device refused its
 * first free: the pool as it was), leaves nothing owed: its wait covered
 * every stream, a destroyed one's last marker too. The wait takes that
 * marker and marks the slot owed until a synchronize that waited for it
 * completes (stream.c, mp__streams_take_gone_marks); the destroy's wait is
 * such a synchronize. Counted owed, the pool's next synchronize would be
 * a device one, which a capture running in another thread refuses
 * (MP_EBUSY) or is invalidated by. */
#include <criterion/criterion.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

Test(pool_refused_destroy, owes_no_device_sync_for_a_destroyed_stream) {
  mp_device_t *dev = fake_open((size_t)64 << 20, 0);
  mp_pool_t *p = make_pool(dev, "virtual=0");
  mp_stream_t a, b;
  cr_assert_eq(mp_stream_create(dev, &a), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_create(dev, &b), MP_OK, "%s", mp_last_error());
  void *x, *y;
  cr_assert_eq(mp_pool_alloc(p, MiB, a, &x), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(p, MiB, b, &y), MP_OK, "%s", mp_last_error());
  /* The marker of x's free stays unfinished to every query: only a wait
   * finds a's work done. */
  fake_of(dev)->events_busy = true;
  cr_assert_eq(mp_pool_free(p, x), MP_OK, "%s", mp_last_error());
  /* a goes with a marker of its last free: its slot is forgotten. */
  cr_assert_eq(mp_stream_destroy(dev, a), MP_OK, "%s", mp_last_error());
  mp__pool_lock(p);
  bool gone_with_mark = false;
  for (uint32_t i = 0; i < p->nstreams; i++)
    gone_with_mark |= p->streams[i].gone && p->streams[i].nmarks > 0;
  bool owed_before = mp__streams_owe_device(p);
  mp__pool_unlock(p);
  cr_assert(gone_with_mark, "the destroyed stream's slot kept its marker");
  cr_assert_not(owed_before);
  cr_assert_eq(mp_pool_free(p, y), MP_OK, "%s", mp_last_error());
  /* The destroy waits for every stream, then the device refuses. */
  fake_of(dev)->refuse_frees = 1;
  cr_assert_eq(mp_pool_destroy(p), MP_EDRIVER);
  cr_assert_eq(fake_of(dev)->refuse_frees, 0, "the first free was refused");
  mp__pool_lock(p);
  bool owed = mp__streams_owe_device(p);
  mp__pool_unlock(p);
  cr_expect_not(owed, "the destroy's wait covered the destroyed stream");
  check(p);
  cr_expect_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_stream_destroy(dev, b), MP_OK, "%s", mp_last_error());
  fake_close(dev);
}
