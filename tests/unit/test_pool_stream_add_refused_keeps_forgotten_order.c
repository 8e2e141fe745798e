/* A call that names a new stream, refused where the pool's stream table
 * cannot grow (out of host memory), changes nothing (status.h), the order
 * of the forgotten slots included: the next add looks at the first few of
 * them (stream.c, mp__slot_new). The add turned the list (the first eight
 * to its end) before the table refused, so that a refused call moved
 * which slots the next one tries. Fifteen destroyed streams, each named
 * by a live block, hold the table's sixteen slots with the live
 * stream's: none of them is reusable, and a new stream needs the table to
 * grow. White-box: it reads the forgotten list. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "dead_streams.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

Test(pool_stream_add_refused_keeps_forgotten_order, turns_nothing) {
  mp_device_t *dev = fake_open(64u << 20, 0);
  mp_pool_t *pool = make_pool(dev, NULL);
  enum { NDEAD = 15 };
  void *held[NDEAD];
  dead_streams_hold(dev, pool, held, NDEAD);
  mp_stream_t s1, s2;
  cr_assert_eq(mp_stream_create(dev, &s1), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_create(dev, &s2), MP_OK, "%s", mp_last_error());
  void *a = NULL, *b = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 4096, s1, &a), MP_OK, "%s", mp_last_error());
  mp__pool_lock(pool);
  cr_assert_eq(pool->nstreams, pool->streams_cap, "the table is not full");
  cr_assert_eq(pool->ngone, NDEAD);
  uint32_t was[NDEAD];
  memcpy(was, pool->gone, sizeof was);
  mp__pool_unlock(pool);

  mp__fault_host_every(true);
  mp_status_t st = mp_pool_alloc(pool, 4096, s2, &b);
  mp__fault_host_every(false);
  cr_assert_eq(st, MP_ENOMEM, "%s", mp_last_error());
  mp__pool_lock(pool);
  cr_expect_eq(pool->ngone, NDEAD);
  for (int k = 0; k < NDEAD; k++)
    cr_expect_eq(pool->gone[k], was[k],
                 "the refused add moved the forgotten list: slot %u at %d, "
                 "was %u",
                 pool->gone[k], k, was[k]);
  cr_expect(!mp__stream_known(pool, s2));
  mp__pool_unlock(pool);

  /* With host memory, the same add goes through. */
  cr_assert_eq(mp_pool_alloc(pool, 4096, s2, &b), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, b), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, a), MP_OK, "%s", mp_last_error());
  check(pool);
  dead_streams_free(dev, pool, held, NDEAD, s1, s2);
  fake_pool_finish(pool, dev);
}
