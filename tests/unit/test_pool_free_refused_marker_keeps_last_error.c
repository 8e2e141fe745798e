/* A free that closes its streams' epochs with marker events (a block used
 * on two streams) succeeds where the device refuses the record: the epoch
 * stays open for a later close or a synchronize (stream.c,
 * mp__stream_close). The refusal then replaced the caller's last error,
 * though the free succeeded (status.h). */
#include "pool/pool_internal.h"
#include "refuse_records.h"

Test(pool_free_refused_marker, keeps_last_error) {
  mp_device_t *dev = rr_open();
  mp_pool_t *pool = make_pool(dev, NULL);
  mp_stream_t s1, s2;
  cr_assert_eq(mp_stream_create(dev, &s1), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_create(dev, &s2), MP_OK, "%s", mp_last_error());
  void *a = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 4096, s1, &a), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_record_stream(pool, a, s2), MP_OK, "%s",
               mp_last_error());
  const char *was = rr_callers_error(pool);
  refusing = true;
  cr_assert_eq(mp_pool_free(pool, a), MP_OK, "%s", mp_last_error());
  rr_expect_kept(was, "mp_pool_free");
  refusing = false;
  check(pool);
  cr_assert_eq(mp_stream_destroy(dev, s1), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s2), MP_OK, "%s", mp_last_error());
  fake_pool_finish(pool, dev);
}
