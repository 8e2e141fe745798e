/* A synchronize of the pool waits for its streams by an event on each, and
 * falls back to a device synchronize where the device refuses to record
 * one (stream.c, mp__streams_sync_events): mp__pool_sync (an allocation
 * waiting for a pending block, a trim, defragmentation's
 * mp__pool_sync_alloc) and mp_pool_destroy then succeed. The refused
 * record replaced the caller's last error, though the call succeeded
 * (status.h). */
#include "pool/pool_internal.h"
#include "refuse_records.h"

/* A pool with a block freed on a stream of its own, the stream's epoch
 * open (a synchronize has an event to record on it), the caller's last
 * error set (*was) and the device refusing records from now on. */
static mp_pool_t *used(mp_device_t **dev, mp_stream_t *s, const char **was) {
  *dev = rr_open();
  mp_pool_t *pool = make_pool(*dev, NULL);
  cr_assert_eq(mp_stream_create(*dev, s), MP_OK, "%s", mp_last_error());
  void *a = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 4096, *s, &a), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, a), MP_OK, "%s", mp_last_error());
  *was = rr_callers_error(pool);
  refusing = true;
  return pool;
}

Test(pool_sync_refused_marker, the_pools_sync_keeps_last_error) {
  mp_device_t *dev;
  mp_stream_t s;
  const char *was;
  mp_pool_t *pool = used(&dev, &s, &was);
  mp__pool_lock(pool);
  mp_status_t st = mp__pool_sync(pool);
  mp__pool_unlock(pool);
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  rr_expect_kept(was, "mp__pool_sync");
  refusing = false;
  check(pool);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  fake_pool_finish(pool, dev);
}

Test(pool_sync_refused_marker, destroy_keeps_last_error) {
  mp_device_t *dev;
  mp_stream_t s;
  const char *was;
  mp_pool_t *pool = used(&dev, &s, &was);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  rr_expect_kept(was, "mp_pool_destroy");
  refusing = false;
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  cr_expect_eq(fake_of(dev)->used, 0);
  fake_close(dev);
}
