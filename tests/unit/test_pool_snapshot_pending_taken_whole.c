/* A pending free block (active_pending_free) that was handed out whole,
 * bigger than its request rounded (a request above max_split takes a
 * block up to max(size/8, 2 MiB) bigger: mp__whole_ok), is written whole,
 * as PyTorch's is: its block taken whole keeps its size (an oversize
 * request takes a block up to kLargeBuffer bigger: get_free_block), and
 * snapshot() writes block_info.size = block->size, requested_size =
 * block->requested_size (CUDACachingAllocator.cpp). It was written as its
 * request rounded, the rest of the block an inactive block: memory that
 * no request could take yet, shown as free. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "../support/gated_streams.h"
#include "../support/pool_helpers.h"
#include "../support/snapshot_devices.h"
#include "../support/snapshot_fields.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_snapshot_pending_taken_whole, "host:capacity=64M");

Test(pool_snapshot_pending_taken_whole, is_written_whole) {
  /* s1 and s2, each held back by its gate. */
  mp_stream_t st[2];
  gate_t g[2];
  gated_streams_open(dev, st, g, 2);
  mp_stream_t s1 = st[0], s2 = st[1];
  mp_pool_t *pool = make_pool(dev, "history=100,virtual=0,max_split=4M");
  /* Above max_split: its segment (rounded up to 2 MiB) is taken whole. */
  const size_t p_req = 5 * MiB - 1000;
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, p_req, s1, &p), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(stats(pool).allocated_bytes, 6 * MiB,
               "the test needs a block taken whole");
  /* Used on busy s2 too, then freed: whichever stream asks waits. */
  cr_assert_eq(mp_pool_record_stream(pool, p, s2), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(pool, p), MP_OK, "%s", mp_last_error());
  size_t len, n;
  char *s = (char *)snapshot_bytes(pool, &len);
  cr_assert_eq(snapshot_str_count(s, len, "active_pending_free"), 1);
  cr_expect_eq(snapshot_str_count(s, len, "inactive"), 0,
               "the block's rest is written as an inactive block");
  size_t active = snapshot_sum(s, len, "active_size", &n);
  cr_expect_eq(active, 6 * MiB, "the segment's active_size is %zu", active);
  /* Block and segment: p's request each. */
  size_t req = snapshot_sum(s, len, "requested_size", &n);
  cr_expect_eq(req, 2 * p_req, "requested_size sums to %zu", req);
  free(s);

  gated_streams_open_gates(g, 2);
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  gated_streams_close(dev, st, g, 2);
}
