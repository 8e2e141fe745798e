/* A pending free block (active_pending_free) that merged into a free block
 * below it says the request of the allocation whose free left it pending,
 * as PyTorch's would: its block waiting for events is never merged
 * (free_block runs once they are done) and keeps its own requested_size
 * (CUDACachingAllocator.cpp, snapshot(): block_info.requested_size =
 * block->requested_size; the segment's requested_size sums its active
 * blocks'). The merged block has its lower neighbour's address, and the
 * snapshot said that neighbour's older request, from the last alloc event
 * of the address. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "../support/gated_streams.h"
#include "../support/pool_helpers.h"
#include "../support/snapshot_devices.h"
#include "../support/snapshot_fields.h"

#define KiB ((size_t)1 << 10)

MP_DEVICE_SUITE(pool_snapshot_pending_merged_requested, "host:capacity=64M");

Test(pool_snapshot_pending_merged_requested, says_the_pending_frees_request) {
  /* s1 and s2, each held back by its gate. */
  mp_stream_t st[2];
  gate_t g[2];
  gated_streams_open(dev, st, g, 2);
  mp_stream_t s1 = st[0], s2 = st[1];
  mp_pool_t *pool = make_pool(dev, "history=100,virtual=0");
  /* l below p, x above: requests that differ. */
  const size_t l_req = 256 * KiB - 5000, p_req = 256 * KiB - 1000;
  void *l, *p, *x;
  cr_assert_eq(mp_pool_alloc(pool, l_req, s1, &l), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, p_req, s1, &p), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, 256 * KiB, s1, &x), MP_OK, "%s",
               mp_last_error());
  cr_assert_lt((char *)l, (char *)p, "the test needs l below p");
  cr_assert_eq(stats(pool).segment_count, 1, "the test needs one segment");
  /* l freed on s1 alone: reusable on s1 at once (inactive). */
  cr_assert_eq(mp_pool_free(pool, l), MP_OK, "%s", mp_last_error());
  size_t len, n;
  char *s = (char *)snapshot_bytes(pool, &len);
  cr_assert_eq(snapshot_str_count(s, len, "active_pending_free"), 0);
  free(s);
  /* p used on busy s2 too, then freed: whichever stream asks waits. It
   * merges down into l. */
  cr_assert_eq(mp_pool_record_stream(pool, p, s2), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(pool, p), MP_OK, "%s", mp_last_error());
  s = (char *)snapshot_bytes(pool, &len);
  cr_assert_eq(snapshot_str_count(s, len, "active_pending_free"), 1);
  /* Merged: one free block below x, the segment's top the other. */
  cr_assert_eq(stats(pool).free_blocks, 2, "the test needs p merged into l");
  /* Blocks and segments: x's request and p's, each counted twice (its
   * block's, and its segment's sum); l's is no active block's. */
  size_t got = snapshot_sum(s, len, "requested_size", &n);
  cr_expect_eq(got, 2 * (256 * KiB + p_req),
               "requested_size sums to %zu (l's request would give %zu)", got,
               2 * (256 * KiB + l_req));
  free(s);

  gated_streams_open_gates(g, 2);
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, x), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  gated_streams_close(dev, st, g, 2);
}
