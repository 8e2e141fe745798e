/* A snapshot's ints are PyTorch's int64 fields (memory_snapshot.cpp casts
 * each to int64_t), and the memory_viz page's unpickler
 * (torch/utils/viz/MemoryViz.js, LONG1) refuses one of more than 8 bytes
 * ("Unsupported number bigger than 8 bytes"): the whole file did not open.
 * A value of 2^63 or more was written in 9 bytes, positive: the size of
 * an oom for SIZE_MAX bytes, and the stream of a free whose stream was
 * destroyed while its block was live (its slot's handle, MP__STREAM_GONE).
 * Each is at most 8 bytes now, read back as PyTorch's cast gives it (-1).
 * The pickle is walked here by its opcodes, as snapshot.c writes them. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "../support/snapshot_devices.h"

MP_DEVICE_SUITE(pool_snapshot_int64, "host:capacity=64M");

typedef struct {
  size_t longs;   /* LONG1 opcodes */
  size_t longest; /* the most bytes one had */
  size_t minus1;  /* ints read back as -1 */
} ints_t;

/* Walks the opcodes snapshot.c writes (protocol 2) up to STOP. */
static ints_t walk(const unsigned char *p, size_t len) {
  ints_t r = {0, 0, 0};
  size_t at = 0;
  cr_assert(len >= 2 && p[0] == 0x80 && p[1] == 2, "no protocol 2 header");
  at = 2;
  while (at < len) {
    unsigned char op = p[at++];
    switch (op) {
    case '}':
    case ']':
    case '(':
    case 'u':
    case 'e':
    case 0x86: /* TUPLE2 */
    case 0x88: /* NEWTRUE */
    case 0x89: /* NEWFALSE */ break;
    case 'J': {
      cr_assert_leq(at + 4, len);
      int32_t v =
          (int32_t)((uint32_t)p[at] | (uint32_t)p[at + 1] << 8 |
                    (uint32_t)p[at + 2] << 16 | (uint32_t)p[at + 3] << 24);
      r.minus1 += v == -1;
      at += 4;
      break;
    }
    case 'X': {
      cr_assert_leq(at + 4, len);
      size_t n = (size_t)p[at] | (size_t)p[at + 1] << 8 |
                 (size_t)p[at + 2] << 16 | (size_t)p[at + 3] << 24;
      at += 4 + n;
      break;
    }
    case 0x8a: { /* LONG1 */
      cr_assert_lt(at, len);
      size_t n = p[at++];
      cr_assert_leq(at + n, len);
      r.longs++;
      r.longest = n > r.longest ? n : r.longest;
      if (n <= 8) {
        uint64_t u = 0;
        for (size_t i = 0; i < n; i++)
          u |= (uint64_t)p[at + i] << (8 * i);
        if (n > 0 && n < 8 && (p[at + n - 1] & 0x80))
          u |= ~(uint64_t)0 << (8 * n); /* sign-extended */
        r.minus1 += u == UINT64_MAX;
      }
      at += n;
      break;
    }
    case '.': cr_assert_eq(at, len, "bytes after STOP"); return r;
    default: cr_assert_fail("opcode %#x at byte %zu", op, at - 1);
    }
  }
  cr_assert_fail("no STOP");
  return r;
}

static ints_t ints_of(mp_pool_t *pool) {
  size_t len;
  unsigned char *s = snapshot_bytes(pool, &len);
  ints_t r = walk(s, len);
  free(s);
  return r;
}

Test(pool_snapshot_int64, an_oom_for_size_max_bytes) {
  mp_pool_t *pool = make_pool(dev, "max_bytes=4M,history=16");
  void *a = NULL;
  cr_assert_eq(mp_pool_alloc(pool, SIZE_MAX, NULL, &a), MP_ELIMIT);
  ints_t r = ints_of(pool);
  cr_expect_leq(r.longest, 8, "a LONG1 of %zu bytes", r.longest);
  cr_expect_eq(r.minus1, 1, "the oom's size as an int64: %zu", r.minus1);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

Test(pool_snapshot_int64, a_free_on_a_destroyed_stream) {
  mp_pool_t *pool = make_pool(dev, "history=16");
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  void *a = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 4096, s, &a), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, a), MP_OK, "%s", mp_last_error());
  ints_t r = ints_of(pool);
  cr_expect_leq(r.longest, 8, "a LONG1 of %zu bytes", r.longest);
  /* free_requested and free_completed. */
  cr_expect_eq(r.minus1, 2, "the frees' stream as an int64: %zu", r.minus1);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}
