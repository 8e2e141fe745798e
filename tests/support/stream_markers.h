/* stream_markers.h - the markers a pool used from several streams records
 * when blocks are freed, in scenarios shared by the host-device test
 * (integration/test_pool_stream_markers.c) and its strict-fake-driver /
 * GPU twin (fakecuda/test_cuda_pool_rules.c).
 *
 * A free closes its stream's epoch with a marker only where no earlier
 * marker of that stream is still unasked; later frees join the open epoch,
 * which is closed when another stream asks about one of its blocks. What
 * must hold whatever the count: a block whose stream has not done its work
 * never goes to another stream, and one whose stream is done does, with no
 * growth. */
#ifndef MEMPOOL_TEST_STREAM_MARKERS_H
#define MEMPOOL_TEST_STREAM_MARKERS_H

#include <criterion/criterion.h>
#include <stdbool.h>

#include <mempool/mempool.h>

#include "stream_gate.h"

enum { MARKERS_N = 16 };

/* How many markers the device recorded since the last call (the fake
 * driver's count of cuEventRecord), or -1 where it cannot be told. */
typedef long long (*markers_count_fn)(void);

static inline size_t markers_reserved(mp_pool_t *pool) {
  mp_stats_t st;
  cr_assert_eq(mp_pool_get_stats(pool, &st), MP_OK);
  return st.reserved_bytes;
}

/* Whether p is one of v[0..n). */
static inline bool markers_one_of(void *p, void *const *v, int n) {
  for (int i = 0; i < n; i++)
    if (v[i] == p)
      return true;
  return false;
}

/* A 1 MiB block of s2's own (*own: s2 known to the pool) and MARKERS_N
 * 1 MiB blocks on s1 (v). */
static inline void markers_blocks(mp_pool_t *pool, mp_stream_t s1,
                                  mp_stream_t s2, void **own, void **v) {
  const size_t mib = (size_t)1 << 20;
  cr_assert_eq(mp_pool_alloc(pool, mib, s2, own), MP_OK, "%s", mp_last_error());
  for (int i = 0; i < MARKERS_N; i++)
    cr_assert_eq(mp_pool_alloc(pool, mib, s1, &v[i]), MP_OK, "%s",
                 mp_last_error());
}

/* MARKERS_N 1 MiB blocks written on s1 behind the closed gate, then freed
 * on s1 one by one (s2 known to the pool: it holds a block of its own).
 * While the gate is closed none of them goes to s2, the last freed (in the
 * epoch left open) no more than the first; once s1 is synchronized, s2
 * takes them all with no growth. count (may be NULL): at most one marker
 * recorded for the MARKERS_N frees (one per free before). */
static inline void markers_frees_on_a_busy_stream(mp_pool_t *pool,
                                                  mp_device_t *dev,
                                                  gate_t *gate, mp_stream_t s1,
                                                  mp_stream_t s2,
                                                  markers_count_fn count) {
  const size_t mib = (size_t)1 << 20;
  void *own = NULL, *v[MARKERS_N], *w[MARKERS_N];
  markers_blocks(pool, s1, s2, &own, v);
  cr_assert_eq(mp_stream_launch_host(dev, s1, gate_wait, gate), MP_OK);
  for (int i = 0; i < MARKERS_N; i++)
    cr_assert_eq(mp_memset_async(dev, v[i], 0xAA, mib, s1), MP_OK);
  if (count != NULL)
    (void)count();
  for (int i = 0; i < MARKERS_N; i++)
    cr_assert_eq(mp_pool_free(pool, v[i]), MP_OK);
  long long recorded = count != NULL ? count() : -1;
  if (recorded >= 0)
    cr_expect_leq(recorded, 1, "%d frees on one stream recorded %lld markers",
                  MARKERS_N, recorded);
  /* s1 still held: the first freed and the last freed stay with it. */
  void *x = NULL, *y = NULL;
  cr_assert_eq(mp_pool_alloc(pool, mib, s2, &x), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, 2 * mib, s2, &y), MP_OK, "%s",
               mp_last_error());
  cr_expect(!markers_one_of(x, v, MARKERS_N),
            "a block s1's held work still writes went to s2");
  for (int i = 0; i < MARKERS_N; i++)
    cr_expect((char *)y + 2 * mib <= (char *)v[i] ||
                  (char *)v[i] + mib <= (char *)y,
              "a 2 MiB block for s2 overlaps block %d, which s1's held work "
              "still writes",
              i);
  cr_assert_eq(mp_pool_free(pool, x), MP_OK);
  cr_assert_eq(mp_pool_free(pool, y), MP_OK);
  gate_open(gate);
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s2), MP_OK);
  /* s1 done: its blocks serve s2, the open epoch's as well. */
  size_t reserved = markers_reserved(pool);
  for (int i = 0; i < MARKERS_N; i++)
    cr_assert_eq(mp_pool_alloc(pool, mib, s2, &w[i]), MP_OK, "%s",
                 mp_last_error());
  cr_expect_eq(markers_reserved(pool), reserved,
               "s2 grew the pool instead of taking what s1 freed");
  for (int i = 0; i < MARKERS_N; i++)
    cr_assert_eq(mp_pool_free(pool, w[i]), MP_OK);
  cr_assert_eq(mp_pool_free(pool, own), MP_OK);
}

/* Begins (begin) or ends a capture of s where the device has captures:
 * the strict fake driver's and the GPU twin's; NULL on the host device,
 * where mp_pool_graph_begin alone marks s capturing in the pool. */
typedef void (*markers_capture_fn)(mp_stream_t s, bool begin);

/* MARKERS_N 1 MiB blocks freed on s1 (s2 known to the pool) and s1
 * synchronized; then s1 allocates to a graph pool and is captured. What
 * s1 freed before is done, and nothing about s1 may be asked or recorded
 * while it captures: s2 takes it all during the capture with no growth.
 * The frees after the first joined an epoch left open, which nobody could
 * close once s1 was marked capturing: s2 grew instead (until the capture
 * ended; under a cap, out of memory, the synchronize rung being refused
 * during a capture). mp_pool_graph_begin now settles the epoch first. */
static inline void markers_frees_before_a_capture(mp_pool_t *pool,
                                                  mp_device_t *dev,
                                                  mp_stream_t s1,
                                                  mp_stream_t s2,
                                                  markers_capture_fn capture) {
  const size_t mib = (size_t)1 << 20;
  void *own = NULL, *v[MARKERS_N], *w[MARKERS_N];
  markers_blocks(pool, s1, s2, &own, v);
  for (int i = 0; i < MARKERS_N; i++)
    cr_assert_eq(mp_memset_async(dev, v[i], 0xAA, mib, s1), MP_OK);
  for (int i = 0; i < MARKERS_N; i++)
    cr_assert_eq(mp_pool_free(pool, v[i]), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  mp_pool_t *g = NULL;
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, g, s1), MP_OK, "%s", mp_last_error());
  if (capture != NULL)
    capture(s1, true);
  size_t reserved = markers_reserved(pool);
  for (int i = 0; i < MARKERS_N; i++)
    cr_assert_eq(mp_pool_alloc(pool, mib, s2, &w[i]), MP_OK, "%s",
                 mp_last_error());
  cr_expect_eq(markers_reserved(pool), reserved,
               "s2 grew the pool during s1's capture instead of taking what "
               "s1 freed and finished before it");
  for (int i = 0; i < MARKERS_N; i++)
    cr_assert_eq(mp_pool_free(pool, w[i]), MP_OK);
  if (capture != NULL)
    capture(s1, false);
  cr_assert_eq(mp_pool_graph_end(pool, s1), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, own), MP_OK);
}

#endif /* MEMPOOL_TEST_STREAM_MARKERS_H */
