/* A snapshot's segment with no active block says the stream it was made
 * for, as PyTorch's does: its segment is one stream's from its allocation
 * on (CUDACachingAllocator.cpp, alloc_block: the head block is made on
 * p.stream(); snapshot(): segment_info.stream = head_block->stream), so a
 * wholly free segment still says it. It said 0. Here: the stream the pool
 * keeps with the segment or its head's chunk, however long ago it was made.
 * Until 2026-12-07 it came from the newest segment_alloc or segment_map
 * event at its address in the history's ring: 0 once the ring had dropped
 * that event (the cases past_the_ring failed), and 0 without history (this
 * test asserted that 0 then). */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "../support/snapshot_devices.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_snapshot_free_segment_stream, "host:capacity=64M");

/* The "stream" of the snapshot's first segment (its dict's first stream
 * key: segments come before device_traces), a BININT or a LONG1. */
static uint64_t first_segment_stream(mp_pool_t *pool) {
  static const char key[] = "X\x06\0\0\0stream";
  size_t len;
  unsigned char *s = snapshot_bytes(pool, &len);
  const unsigned char *at = memmem(s, len, key, sizeof key - 1);
  cr_assert_not_null(at, "no stream key");
  const unsigned char *v = at + sizeof key - 1;
  uint64_t x = 0;
  if (v[0] == 'J') {
    for (int i = 0; i < 4; i++)
      x |= (uint64_t)v[1 + i] << (8 * i);
  } else {
    cr_assert_eq(v[0], 0x8a, "a stream is no int");
    for (int i = 0; i < v[1] && i < 8; i++)
      x |= (uint64_t)v[2 + i] << (8 * i);
  }
  free(s);
  return x;
}

/* A pool of opts whose one segment, made for s1 and free again, has seen
 * `pairs` alloc/free pairs of the same size since (enough pushes its
 * making out of a ring of 4 events). */
static void free_segment_says(const char *opts, int pairs) {
  mp_stream_t s1;
  cr_assert_eq(mp_stream_create(dev, &s1), MP_OK, "%s", mp_last_error());
  mp_pool_t *pool = make_pool(dev, opts);
  void *a;
  cr_assert_eq(mp_pool_alloc(pool, 4 * MiB, s1, &a), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(first_segment_stream(pool), (uint64_t)(uintptr_t)s1);
  cr_assert_eq(mp_pool_free(pool, a), MP_OK, "%s", mp_last_error());
  for (int k = 0; k < pairs; k++) {
    cr_assert_eq(mp_pool_alloc(pool, 4 * MiB, s1, &a), MP_OK, "%s",
                 mp_last_error());
    cr_assert_eq(mp_pool_free(pool, a), MP_OK, "%s", mp_last_error());
  }
  cr_assert_eq(stats(pool).segment_count, 1, "the test needs its segment");
  uint64_t got = first_segment_stream(pool);
  uint64_t want = (uint64_t)(uintptr_t)s1;
  cr_expect_eq(got, want, "%s: the free segment says %#llx, not %#llx", opts,
               (unsigned long long)got, (unsigned long long)want);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s1), MP_OK);
}

Test(pool_snapshot_free_segment_stream, a_plain_one_says_its_alloc_stream) {
  free_segment_says("virtual=0,history=16", 0);
}

Test(pool_snapshot_free_segment_stream, a_mapped_run_says_its_map_stream) {
  free_segment_says("virtual=1,history=16", 0);
}

Test(pool_snapshot_free_segment_stream, a_plain_one_past_the_ring) {
  free_segment_says("virtual=0,history=4", 8);
}

Test(pool_snapshot_free_segment_stream, a_mapped_run_past_the_ring) {
  free_segment_says("virtual=1,history=4", 8);
}

Test(pool_snapshot_free_segment_stream, without_history_it_says_it_too) {
  free_segment_says("virtual=0", 0);
  free_segment_says("virtual=1", 0);
}
