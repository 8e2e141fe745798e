/* A pending free block (active_pending_free) that merged into a free
 * neighbour is written as PyTorch's blocks would be. PyTorch merges a
 * block only once its events are done (free_block), so its pending block
 * is the freed allocation's alone, at its own address, of its own size
 * (its request rounded as the pool rounds), with its own requested_size,
 * and a segment's active_size and requested_size count it alone
 * (CUDACachingAllocator.cpp, snapshot(): block_info.requested_size =
 * block->requested_size; the segment's sums its active blocks'). Here:
 * - merged up into the free block above, the pending block ran to that
 *   block's top: active_size counted the reusable bytes above it;
 * - merged down into the free block below, it was one block at the lower
 *   neighbour's address, active in whole: active_size counted the
 *   neighbour's reusable bytes, no block was at the address the trace's
 *   free names, and it said the neighbour's older request (the last alloc
 *   event of that address). */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>

#include "../support/gated_streams.h"
#include "../support/pool_helpers.h"
#include "../support/snapshot_devices.h"
#include "../support/snapshot_fields.h"

#define KiB ((size_t)1 << 10)

MP_DEVICE_SUITE(pool_snapshot_pending_merged, "host:capacity=64M");

/* Three blocks upwards on one segment, b[0] < b[1] < b[2], of requests
 * req[0..2] on st[0], b[2] live throughout; st[0] and st[1] each held
 * back by its gate. */
typedef struct scene {
  mp_stream_t st[2];
  gate_t g[2];
  mp_pool_t *pool;
  void *b[3];
} scene_t;

static void scene_open(scene_t *sc, const size_t req[3]) {
  gated_streams_open(dev, sc->st, sc->g, 2);
  sc->pool = make_pool(dev, "history=100,virtual=0");
  for (int i = 0; i < 3; i++)
    cr_assert_eq(mp_pool_alloc(sc->pool, req[i], sc->st[0], &sc->b[i]), MP_OK,
                 "%s", mp_last_error());
  cr_assert(sc->b[0] < sc->b[1] && sc->b[1] < sc->b[2],
            "the test needs the blocks upwards");
  cr_assert_eq(stats(sc->pool).segment_count, 1, "the test needs one segment");
}

/* b[k] freed on its one stream (reusable on it at once: inactive). */
static void scene_free_reusable(scene_t *sc, int k) {
  cr_assert_eq(mp_pool_free(sc->pool, sc->b[k]), MP_OK, "%s", mp_last_error());
}

/* b[k] used on busy st[1] too, then freed: pending, whichever stream asks
 * waits; it merges into the free neighbour. */
static void scene_free_pending(scene_t *sc, int k) {
  cr_assert_eq(mp_pool_record_stream(sc->pool, sc->b[k], sc->st[1]), MP_OK,
               "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(sc->pool, sc->b[k]), MP_OK, "%s", mp_last_error());
  cr_assert_eq(stats(sc->pool).free_blocks, 2,
               "the test needs the pending block merged");
}

static void scene_close(scene_t *sc) {
  gated_streams_open_gates(sc->g, 2);
  cr_assert_eq(mp_pool_trim(sc->pool, 0), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(sc->pool, sc->b[2]), MP_OK, "%s", mp_last_error());
  check(sc->pool);
  cr_assert_eq(mp_pool_destroy(sc->pool), MP_OK, "%s", mp_last_error());
  gated_streams_close(dev, sc->st, sc->g, 2);
}

/* Whether a block of the snapshot s starts at a. */
static bool block_at(const unsigned char *s, size_t len, const void *a) {
  uint64_t v[16];
  size_t n = snapshot_int_values(s, len, "address", v, 16);
  for (size_t i = 0; i < n; i++)
    if (v[i] == (uint64_t)(uintptr_t)a)
      return true;
  return false;
}

/* The one segment's active_size. */
static size_t active_size(const unsigned char *s, size_t len) {
  uint64_t v[16];
  cr_assert_eq(snapshot_int_values(s, len, "active_size", v, 16), 1);
  return (size_t)v[0];
}

static const size_t even[3] = {256 * KiB, 256 * KiB, 256 * KiB};

/* b[reusable] freed reusable, then b[pending], its neighbour, freed while
 * its work is pending, which merges it into that free block: the snapshot
 * shows the pending free and the reusable bytes apart, each a block at its
 * own address (and the segment's top inactive too). The segment's active
 * bytes: the pending block's, up to b[pending + 1], and b[2]'s. */
static void expect_apart(size_t reusable, size_t pending) {
  scene_t sc;
  scene_open(&sc, even);
  scene_free_reusable(&sc, reusable);
  scene_free_pending(&sc, pending);
  size_t len;
  unsigned char *s = snapshot_bytes(sc.pool, &len);
  cr_expect_eq(snapshot_str_count((char *)s, len, "active_pending_free"), 1);
  cr_expect_eq(snapshot_str_count((char *)s, len, "inactive"), 2);
  cr_expect(block_at(s, len, sc.b[pending]), "no block at the pending free's");
  cr_expect(block_at(s, len, sc.b[reusable]),
            "no block at the reusable bytes'");
  size_t want = (size_t)((char *)sc.b[pending + 1] - (char *)sc.b[pending]) +
                stats(sc.pool).allocated_bytes;
  cr_expect_eq(active_size(s, len), want, "active_size %zu, not %zu",
               active_size(s, len), want);
  free(s);
  scene_close(&sc);
}

Test(pool_snapshot_pending_merged, up_the_reusable_bytes_above_are_apart) {
  expect_apart(1, 0); /* b[0] merges up into b[1]'s free block */
}

Test(pool_snapshot_pending_merged, down_the_reusable_bytes_below_are_apart) {
  expect_apart(0, 1); /* b[1] merges down into b[0]'s free block */
}

Test(pool_snapshot_pending_merged, down_says_the_pending_frees_request) {
  /* Requests that differ: b[0]'s (l_req) below the pending one's. */
  const size_t l_req = 256 * KiB - 5000, p_req = 256 * KiB - 1000;
  const size_t req[3] = {l_req, p_req, 256 * KiB};
  scene_t sc;
  scene_open(&sc, req);
  scene_free_reusable(&sc, 0);
  size_t len, n;
  char *s = (char *)snapshot_bytes(sc.pool, &len);
  cr_assert_eq(snapshot_str_count(s, len, "active_pending_free"), 0);
  free(s);
  scene_free_pending(&sc, 1);
  s = (char *)snapshot_bytes(sc.pool, &len);
  cr_assert_eq(snapshot_str_count(s, len, "active_pending_free"), 1);
  /* Blocks and segments: b[2]'s request and the pending one's, each
   * counted twice (its block's, and its segment's sum); b[0]'s is no
   * active block's. */
  size_t got = snapshot_sum(s, len, "requested_size", &n);
  cr_expect_eq(got, 2 * (256 * KiB + p_req),
               "requested_size sums to %zu (b[0]'s request would give %zu)",
               got, 2 * (256 * KiB + l_req));
  free(s);
  scene_close(&sc);
}
