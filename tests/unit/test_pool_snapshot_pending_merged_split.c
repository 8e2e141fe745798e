/* A pending free block (active_pending_free) that merged into a free block
 * below it is written as PyTorch's blocks would be: that free block's
 * bytes inactive, then the pending block from the address its free named.
 * PyTorch merges a block only once its events are done (free_block), so its
 * pending block is the freed allocation's alone, at its own address, and
 * a segment's active_size counts it alone (CUDACachingAllocator.cpp,
 * snapshot()). Here it was one block at the lower neighbour's address,
 * active in whole: active_size counted the neighbour's reusable bytes, and
 * no block was at the address the trace's free names. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../support/gated_streams.h"
#include "../support/pool_helpers.h"
#include "../support/snapshot_devices.h"
#include "../support/snapshot_fields.h"

#define KiB ((size_t)1 << 10)

MP_DEVICE_SUITE(pool_snapshot_pending_merged_split, "host:capacity=64M");

Test(pool_snapshot_pending_merged_split, the_reusable_bytes_below_are_apart) {
  mp_stream_t st[2];
  gate_t g[2];
  gated_streams_open(dev, st, g, 2);
  mp_pool_t *pool = make_pool(dev, "history=100,virtual=0");
  void *l, *p, *x;
  cr_assert_eq(mp_pool_alloc(pool, 256 * KiB, st[0], &l), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, 256 * KiB, st[0], &p), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, 256 * KiB, st[0], &x), MP_OK, "%s",
               mp_last_error());
  cr_assert(l < p && p < x, "the test needs l, p, x upwards");
  cr_assert_eq(mp_pool_free(pool, l), MP_OK, "%s", mp_last_error());
  /* p used on busy s2 too, then freed: pending; it merges down into l. */
  cr_assert_eq(mp_pool_record_stream(pool, p, st[1]), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(pool, p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(stats(pool).free_blocks, 2, "the test needs p merged into l");
  size_t len;
  unsigned char *s = snapshot_bytes(pool, &len);
  cr_expect_eq(snapshot_str_count((char *)s, len, "active_pending_free"), 1);
  /* l's bytes, and the segment's top. */
  cr_expect_eq(snapshot_str_count((char *)s, len, "inactive"), 2);
  uint64_t v[16];
  size_t n = snapshot_int_values(s, len, "address", v, 16);
  bool at_p = false;
  for (size_t i = 0; i < n; i++)
    at_p |= v[i] == (uint64_t)(uintptr_t)p;
  cr_expect(at_p, "no block at p's address");
  /* The segment's active bytes: p's (up to x) and x's. */
  cr_assert_eq(snapshot_int_values(s, len, "active_size", v, 16), 1);
  size_t want = (size_t)((char *)x - (char *)p) + stats(pool).allocated_bytes;
  cr_expect_eq(v[0], want, "active_size %llu, not %zu",
               (unsigned long long)v[0], want);
  free(s);

  gated_streams_open_gates(g, 2);
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, x), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  gated_streams_close(dev, st, g, 2);
}
