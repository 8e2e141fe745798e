/* A snapshot's pending free block (active_pending_free: freed, not yet
 * reusable) says what was requested when it was allocated, as PyTorch's
 * block keeps its requested_size until its events are done
 * (CUDACachingAllocator.cpp, snapshot(): block_info.requested_size =
 * block->requested_size for every block; the segment's requested_size
 * sums its active blocks'). It said 0. The pool keeps no request for a
 * free block (merges), so it comes from the block's alloc event in the
 * history, which the pool keeps while its ring holds it. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "../support/pool_helpers.h"
#include "../support/snapshot_devices.h"
#include "../support/snapshot_fields.h"
#include "../support/stream_gate.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_snapshot_pending_requested, "host:capacity=64M");

Test(pool_snapshot_pending_requested, says_what_its_alloc_requested) {
  /* s1 and s2, each held back by its gate. */
  mp_stream_t st[2];
  gate_t g[2];
  for (int i = 0; i < 2; i++) {
    gate_init(&g[i]);
    cr_assert_eq(mp_stream_create(dev, &st[i]), MP_OK);
    cr_assert_eq(mp_stream_launch_host(dev, st[i], gate_wait, &g[i]), MP_OK);
  }
  mp_stream_t s1 = st[0], s2 = st[1];
  mp_pool_t *pool = make_pool(dev, "history=100");
  /* a's request is no multiple of the block's size. */
  const size_t a_req = MiB - 1000;
  void *a, *x;
  cr_assert_eq(mp_pool_alloc(pool, a_req, s1, &a), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, MiB, s1, &x), MP_OK, "%s", mp_last_error());
  /* a used on busy s2 too, then freed: whichever stream asks waits. */
  cr_assert_eq(mp_pool_record_stream(pool, a, s2), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(pool, a), MP_OK, "%s", mp_last_error());
  size_t len, n;
  char *s = (char *)snapshot_bytes(pool, &len);
  cr_assert_eq(snapshot_str_count(s, len, "active_pending_free"), 1);
  /* Blocks and segments: x's request and a's, each counted twice (its
   * block's, and its segment's sum). */
  size_t got = snapshot_sum(s, len, "requested_size", &n);
  cr_expect_eq(got, 2 * (MiB + a_req), "requested_size sums to %zu", got);
  free(s);

  gate_open(&g[0]);
  gate_open(&g[1]);
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  s = (char *)snapshot_bytes(pool, &len);
  cr_expect_eq(snapshot_str_count(s, len, "active_pending_free"), 0);
  /* Reusable now: inactive, no request. */
  cr_expect_eq(snapshot_sum(s, len, "requested_size", &n), 2 * MiB);
  free(s);
  cr_assert_eq(mp_pool_free(pool, x), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(mp_stream_destroy(dev, st[i]), MP_OK);
    gate_destroy(&g[i]);
  }
}
