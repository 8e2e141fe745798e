/* stream_reuse.h - one scenario shared by the host-device test and its
 * strict-fake-driver / GPU twin: blocks freed on a stream the application
 * has synchronized go to another stream at once. */
#ifndef MEMPOOL_TEST_STREAM_REUSE_H
#define MEMPOOL_TEST_STREAM_REUSE_H

#include <criterion/criterion.h>
#include <stdbool.h>

#include <mempool/mempool.h>

/* Eight 1 MiB blocks allocated and freed on s1, s1 synchronized, then
 * eight taken on s2: the same blocks, with no growth. */
static inline void synced_blocks_go_to_another_stream(mp_pool_t *pool,
                                                      mp_device_t *dev,
                                                      mp_stream_t s1,
                                                      mp_stream_t s2) {
  enum { N = 8 };
  const size_t mib = (size_t)1 << 20;
  void *v[N], *w[N];
  for (int i = 0; i < N; i++)
    cr_assert_eq(mp_pool_alloc(pool, mib, s1, &v[i]), MP_OK);
  for (int i = 0; i < N; i++)
    cr_assert_eq(mp_pool_free(pool, v[i]), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  mp_stats_t before, after;
  cr_assert_eq(mp_pool_get_stats(pool, &before), MP_OK);
  for (int i = 0; i < N; i++)
    cr_assert_eq(mp_pool_alloc(pool, mib, s2, &w[i]), MP_OK);
  cr_assert_eq(mp_pool_get_stats(pool, &after), MP_OK);
  cr_expect_eq(after.device_alloc_count, before.device_alloc_count,
               "grew instead of reusing s1's blocks");
  cr_expect_eq(after.reserved_bytes, before.reserved_bytes);
  for (int i = 0; i < N; i++) {
    bool found = false;
    for (int j = 0; j < N; j++)
      found = found || w[i] == v[j];
    cr_expect(found, "block %d is not one s1 freed", i);
  }
  for (int i = 0; i < N; i++)
    cr_assert_eq(mp_pool_free(pool, w[i]), MP_OK);
}

#endif
