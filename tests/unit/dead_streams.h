/* dead_streams.h - streams destroyed while a live block of the pool names
 * each: their slots are forgotten and none is reusable until the blocks
 * are freed (stream.c, mp__slot_reusable). */
#ifndef MEMPOOL_TEST_DEAD_STREAMS_H
#define MEMPOOL_TEST_DEAD_STREAMS_H

#include <criterion/criterion.h>

#include "../support/pool_helpers.h"

/* n streams made, each given a 4 KiB block of pool (held[i]), destroyed. */
static inline void dead_streams_hold(mp_device_t *dev, mp_pool_t *pool,
                                     void **held, int n) {
  for (int i = 0; i < n; i++) {
    mp_stream_t d;
    cr_assert_eq(mp_stream_create(dev, &d), MP_OK, "%s", mp_last_error());
    cr_assert_eq(mp_pool_alloc(pool, 4096, d, &held[i]), MP_OK, "%s",
                 mp_last_error());
    cr_assert_eq(mp_stream_destroy(dev, d), MP_OK, "%s", mp_last_error());
  }
}

/* The blocks freed, then s1 and s2 destroyed. */
static inline void dead_streams_free(mp_device_t *dev, mp_pool_t *pool,
                                     void **held, int n, mp_stream_t s1,
                                     mp_stream_t s2) {
  for (int i = 0; i < n; i++)
    cr_assert_eq(mp_pool_free(pool, held[i]), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s1), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s2), MP_OK, "%s", mp_last_error());
}

#endif
