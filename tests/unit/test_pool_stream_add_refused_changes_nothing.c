/* A call that names a new stream is refused where the pool's stream table
 * cannot take its slot (out of host memory): MP_ENOMEM, and nothing
 * changes (status.h). The second live stream's add closed the open epochs
 * of the streams already there (stream.c, mp__stream_add: with two
 * streams, every free closes its epoch at once) before the table refused
 * it: the refused call had moved the first stream's epoch on. Seven
 * destroyed streams, each named by a live block, hold the table's first
 * eight slots with the live stream's. */
#include <criterion/criterion.h>

#include "../support/pool_helpers.h"
#include "dead_streams.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

Test(pool_stream_add_refused, changes_nothing) {
  mp_device_t *dev = fake_open(64u << 20, 0);
  mp_pool_t *pool = make_pool(dev, NULL);
  enum { NDEAD = 7 };
  void *held[NDEAD];
  dead_streams_hold(dev, pool, held, NDEAD);
  mp_stream_t s1, s2;
  cr_assert_eq(mp_stream_create(dev, &s1), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_create(dev, &s2), MP_OK, "%s", mp_last_error());
  /* Two frees on s1, its first marker pending (the device busy): the
   * second free leaves its epoch open. */
  fake_of(dev)->events_busy = true;
  void *a = NULL, *a2 = NULL, *b = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 4096, s1, &a), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, 4096, s1, &a2), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(pool, a), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, a2), MP_OK, "%s", mp_last_error());
  mp__pool_lock(pool);
  cr_assert_eq(pool->nstreams, pool->streams_cap, "the table is not full");
  cr_assert_eq(pool->nstreams - pool->ngone, 1);
  uint32_t i1 = UINT32_MAX;
  cr_assert_eq(mp__stream_lookup(pool, s1, &i1), MP_OK);
  mp__strm_t was = pool->streams[i1];
  mp__pool_unlock(pool);
  cr_assert(was.dirty, "the first stream's epoch is not open");
  mp__fault_host_every(true);
  mp_status_t st = mp_pool_alloc(pool, 4096, s2, &b);
  mp__fault_host_every(false);
  cr_assert_eq(st, MP_ENOMEM, "%s", mp_last_error());
  mp__pool_lock(pool);
  const mp__strm_t *now = &pool->streams[i1];
  cr_expect_eq(now->epoch, was.epoch,
               "the refused call moved the first stream's epoch on");
  cr_expect_eq(now->dirty, was.dirty);
  cr_expect_eq(now->nmarks, was.nmarks);
  cr_expect(!mp__stream_known(pool, s2));
  mp__pool_unlock(pool);
  fake_of(dev)->events_busy = false;
  check(pool);
  dead_streams_free(dev, pool, held, NDEAD, s1, s2);
  fake_pool_finish(pool, dev);
}
