/* A snapshot's segment says the stream its blocks were allocated on, as
 * PyTorch's does: its segment is one stream's, and torch.cuda.memory.
 * _snapshot() gives "stream" as that cudaStream_t's integer value
 * (CUDACachingAllocator.cpp, snapshot(): segment_info.stream =
 * head_block->stream; torch/csrc/cuda/memory_snapshot.cpp writes
 * int64_t(segmentInfo.stream)). Every segment said 0 whatever its blocks'
 * stream. Here the streams share the segments: a segment says the stream
 * of its lowest active block. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "../support/snapshot_devices.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_snapshot_segment_stream, "host:capacity=64M");

/* The values of every "stream" key of a snapshot (a BININT, or a LONG1 for
 * a value of 2^31 or more, as snapshot.c writes ints), in out[] (at most
 * max); how many. Without history there is no trace: segments' only. */
static size_t stream_values(const unsigned char *buf, size_t len, uint64_t *out,
                            size_t max) {
  static const char key[] = "X\x06\0\0\0stream";
  size_t n = 0;
  for (const unsigned char *at = buf;
       (at = memmem(at, len - (size_t)(at - buf), key, sizeof key - 1)) !=
       NULL;) {
    const unsigned char *v = at + sizeof key - 1;
    uint64_t x = 0;
    cr_assert_lt(n, max);
    if (v[0] == 'J') {
      for (int i = 0; i < 4; i++)
        x |= (uint64_t)v[1 + i] << (8 * i);
    } else {
      cr_assert_eq(v[0], 0x8a, "a stream is no int");
      cr_assert_leq(v[1], 9);
      for (int i = 0; i < v[1] && i < 8; i++)
        x |= (uint64_t)v[2 + i] << (8 * i);
    }
    out[n++] = x;
    at = v;
  }
  return n;
}

static size_t segment_streams(mp_pool_t *pool, uint64_t *out, size_t max) {
  size_t len;
  unsigned char *s = snapshot_bytes(pool, &len);
  size_t n = stream_values(s, len, out, max);
  free(s);
  return n;
}

Test(pool_snapshot_segment_stream, each_segment_says_its_blocks_stream) {
  mp_stream_t s1, s2;
  cr_assert_eq(mp_stream_create(dev, &s1), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_create(dev, &s2), MP_OK, "%s", mp_last_error());
  mp_pool_t *pool = make_pool(dev, "virtual=0");
  void *a, *b;
  cr_assert_eq(mp_pool_alloc(pool, 4096, s1, &a), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, 5 * MiB, s2, &b), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(stats(pool).segment_count, 2, "the test needs 2 segments");
  uint64_t got[4];
  cr_assert_eq(segment_streams(pool, got, 4), 2);
  /* Oldest first: a's segment, then b's. */
  cr_expect_eq(got[0], (uint64_t)(uintptr_t)s1, "a's segment says %#llx",
               (unsigned long long)got[0]);
  cr_expect_eq(got[1], (uint64_t)(uintptr_t)s2, "b's segment says %#llx",
               (unsigned long long)got[1]);
  cr_assert_eq(mp_pool_free(pool, a), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, b), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s1), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s2), MP_OK);
}

Test(pool_snapshot_segment_stream, a_shared_segment_says_its_lowest_block) {
  mp_stream_t s1, s2;
  cr_assert_eq(mp_stream_create(dev, &s1), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_create(dev, &s2), MP_OK, "%s", mp_last_error());
  mp_pool_t *pool = make_pool(dev, "virtual=0");
  void *a, *b;
  cr_assert_eq(mp_pool_alloc(pool, 4096, s1, &a), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, 4096, s2, &b), MP_OK, "%s", mp_last_error());
  cr_assert_eq(stats(pool).segment_count, 1, "the test needs 1 segment");
  void *lo = (uintptr_t)a < (uintptr_t)b ? a : b;
  mp_stream_t lo_s = lo == a ? s1 : s2, hi_s = lo == a ? s2 : s1;
  uint64_t got[4];
  cr_assert_eq(segment_streams(pool, got, 4), 1);
  cr_expect_eq(got[0], (uint64_t)(uintptr_t)lo_s, "the segment says %#llx",
               (unsigned long long)got[0]);
  /* The lower block freed: the other one's stream. */
  cr_assert_eq(mp_pool_free(pool, lo), MP_OK, "%s", mp_last_error());
  cr_assert_eq(segment_streams(pool, got, 4), 1);
  cr_expect_eq(got[0], (uint64_t)(uintptr_t)hi_s, "the segment says %#llx",
               (unsigned long long)got[0]);
  cr_assert_eq(mp_pool_free(pool, lo == a ? b : a), MP_OK, "%s",
               mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s1), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s2), MP_OK);
}
