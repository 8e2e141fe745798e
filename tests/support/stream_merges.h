/* stream_merges.h - a free next to a block whose work another stream has
 * not done yet, in one scenario shared by the host-device test
 * (integration/test_pool_stream_merges.c) and its strict-fake-driver / GPU
 * twin (fakecuda/test_cuda_pool_rules.c).
 *
 * a (1 MiB, stream s1) and b (1 MiB, stream s2) are neighbours in a pool's
 * first 2 MiB; s1 is held behind a gate, so a's free stays pending for s2.
 * b's free must leave b usable on s2 at once (stream order), not merged
 * into a block that waits for s1 too. */
#ifndef MEMPOOL_TEST_STREAM_MERGES_H
#define MEMPOOL_TEST_STREAM_MERGES_H

#include <criterion/criterion.h>

#include <mempool/mempool.h>

#include "stream_gate.h"

typedef struct merges {
  void *a, *b; /* the two neighbours, freed: a on gated s1, b on s2 */
  size_t reserved;
} merges_t;

static inline size_t merges_reserved(mp_pool_t *pool) {
  mp_stats_t st;
  cr_assert_eq(mp_pool_get_stats(pool, &st), MP_OK);
  return st.reserved_bytes;
}

/* The neighbours allocated, s1 gated, both freed. */
static inline merges_t merges_free_beside_a_gated_stream(mp_pool_t *pool,
                                                         mp_device_t *dev,
                                                         gate_t *gate,
                                                         mp_stream_t s1,
                                                         mp_stream_t s2) {
  const size_t mib = (size_t)1 << 20;
  merges_t m;
  cr_assert_eq(mp_pool_alloc(pool, mib, s1, &m.a), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, mib, s2, &m.b), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq((char *)m.b, (char *)m.a + mib, "a and b are not neighbours");
  cr_assert_eq(mp_stream_launch_host(dev, s1, gate_wait, gate), MP_OK);
  cr_assert_eq(mp_memset_async(dev, m.a, 0xAA, mib, s1), MP_OK);
  cr_assert_eq(mp_pool_free(pool, m.a), MP_OK);
  cr_assert_eq(mp_pool_free(pool, m.b), MP_OK);
  m.reserved = merges_reserved(pool);
  return m;
}

/* b comes back on s2 at once, no growth, while s1 is still held. */
static inline void merges_b_serves_its_stream_at_once(mp_pool_t *pool,
                                                      mp_device_t *dev,
                                                      gate_t *gate,
                                                      mp_stream_t s1,
                                                      mp_stream_t s2) {
  merges_t m = merges_free_beside_a_gated_stream(pool, dev, gate, s1, s2);
  void *y = NULL;
  cr_assert_eq(mp_pool_alloc(pool, (size_t)1 << 20, s2, &y), MP_OK);
  cr_expect_eq(y, m.b, "b went with a, which s1's work still holds");
  cr_expect_eq(merges_reserved(pool), m.reserved, "the pool grew");
  gate_open(gate);
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  cr_assert_eq(mp_pool_free(pool, y), MP_OK);
}

/* Once s1's work is done, the two join before the pool would grow: a
 * 2 MiB request on s2 gets a's address, no growth. */
static inline void merges_join_before_growth(mp_pool_t *pool, mp_device_t *dev,
                                             gate_t *gate, mp_stream_t s1,
                                             mp_stream_t s2) {
  merges_t m = merges_free_beside_a_gated_stream(pool, dev, gate, s1, s2);
  gate_open(gate);
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s2), MP_OK);
  void *y = NULL;
  cr_assert_eq(mp_pool_alloc(pool, (size_t)2 << 20, s2, &y), MP_OK);
  cr_expect_eq(y, m.a, "the neighbours did not join");
  cr_expect_eq(merges_reserved(pool), m.reserved, "the pool grew");
  cr_assert_eq(mp_pool_free(pool, y), MP_OK);
}

/* How many times the device was asked whether a stream or an event is done
 * since the last call (the fake driver's counts), or -1 where it cannot be
 * told. */
typedef long long (*merges_asks_fn)(void);

/* A pair kept apart counts as pending only for a request the two together
 * could hold: with a and b (1 MiB each) apart while s1 is held, requests of
 * 8 MiB on s2 grow the pool after one look at the pair (at most two asks
 * of the device each). Counted as pending for any request, a growth first
 * waited the whole 200 us: twenty sleeps, each followed by a walk over
 * every block that asks s1 about a again (on the strict fake driver 23
 * asks for the first request). asks may be NULL. */
static inline void merges_growth_beside_a_pair_does_not_wait_for_it(
    mp_pool_t *pool, mp_device_t *dev, gate_t *gate, mp_stream_t s1,
    mp_stream_t s2, merges_asks_fn asks) {
  enum { N = 4 };
  merges_t m = merges_free_beside_a_gated_stream(pool, dev, gate, s1, s2);
  void *y[N];
  for (int i = 0; i < N; i++) {
    if (asks != NULL)
      (void)asks();
    cr_assert_eq(mp_pool_alloc(pool, (size_t)8 << 20, s2, &y[i]), MP_OK, "%s",
                 mp_last_error());
    long long n = asks != NULL ? asks() : -1;
    if (n >= 0)
      cr_expect_leq(n, 2, "request %d beside the pair asked %lld times", i, n);
  }
  cr_expect_geq(merges_reserved(pool), m.reserved + ((size_t)8 << 20) * N,
                "the requests did not grow the pool");
  for (int i = 0; i < N; i++)
    cr_assert_eq(mp_pool_free(pool, y[i]), MP_OK);
  gate_open(gate);
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
}

#endif
