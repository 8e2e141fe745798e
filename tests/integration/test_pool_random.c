/* Randomized operation sequences on the host device: hundreds of thousands of
 * allocs, frees, contiguous allocs, record_stream and trims, with every
 * block's ends tagged and verified before it is freed, and mp_pool_check
 * plus the stats compared with what the test itself counts between phases. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../bench/core/xorshift.h"
#include <mempool/mempool.h>

typedef struct live {
  uint64_t *p;
  size_t bytes;
  uint64_t tag;
} live_t;

static uint64_t rng_state;
static uint64_t rnd(void) {
  return xorshift64(&rng_state);
}

/* Log-uniform 1 B .. 4 MiB, so that small and large requests both matter. */
static size_t rnd_size(void) {
  unsigned shift = (unsigned)(rnd() % 22);
  return 1 + (size_t)(rnd() % ((uint64_t)1 << (shift + 1)));
}

static void tag(live_t *l) {
  size_t words = l->bytes / 8;
  if (words < 2) {
    memset(l->p, (int)(l->tag & 0xff), l->bytes);
    return;
  }
  l->p[0] = l->tag;
  l->p[words - 1] = ~l->tag;
}

static int cur_op;
static void verify(const live_t *l) {
  size_t words = l->bytes / 8;
  if (words < 2) {
    for (size_t i = 0; i < l->bytes; i++)
      cr_assert_eq(((unsigned char *)l->p)[i], l->tag & 0xff);
    return;
  }
  cr_assert_eq(l->p[0], l->tag,
               "op %d: head of block %p (%zu bytes) overwritten: %llx", cur_op,
               (void *)l->p, l->bytes, (unsigned long long)l->p[0]);
  cr_assert_eq(l->p[words - 1], ~l->tag, "tail of block %p overwritten",
               (void *)l->p);
}

static void run(const char *spec, const char *opts, uint64_t seed, int ops) {
  mp_device_t *dev;
  cr_assert_eq(mp_device_open(spec, &dev), MP_OK, "%s", mp_last_error());
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_assert_eq(mp_pool_config_parse(&cfg, opts), MP_OK);
  mp_pool_t *pool;
  cr_assert_eq(mp_pool_create(dev, &cfg, &pool), MP_OK, "%s", mp_last_error());
  mp_stream_t st[2] = {NULL, NULL};
  cr_assert_eq(mp_stream_create(dev, &st[1]), MP_OK);
  enum { CAP = 2048 };
  live_t *lv = calloc(CAP, sizeof *lv);
  size_t n = 0, requested = 0;
  uint64_t next_tag = seed * 1000003u;
  rng_state = seed | 1;
  for (int op = 0; op < ops; op++) {
    cur_op = op;
    uint64_t r = rnd() % 100;
    if ((r < 52 && n < CAP - 4) || n == 0) {
      live_t l = {NULL, rnd_size(), ++next_tag};
      void *p;
      mp_status_t s = mp_pool_alloc(pool, l.bytes, st[rnd() & 1], &p);
      cr_assert_eq(s, MP_OK, "op %d: %s", op, mp_last_error());
      cr_assert_eq((uintptr_t)p % cfg.align, 0);
      l.p = p;
      tag(&l);
      lv[n++] = l;
      requested += l.bytes;
    } else if (r < 54 && n < CAP - 4) {
      size_t sizes[3] = {rnd_size(), rnd_size(), rnd_size()};
      void *out[3];
      mp_status_t s = mp_pool_alloc_contiguous(pool, 3, sizes, NULL, out);
      cr_assert_eq(s, MP_OK, "op %d: %s", op, mp_last_error());
      for (int k = 0; k < 3; k++) {
        live_t l = {out[k], sizes[k], ++next_tag};
        tag(&l);
        lv[n++] = l;
        requested += sizes[k];
      }
    } else if (r < 56) {
      live_t *l = &lv[rnd() % n];
      cr_assert_eq(mp_pool_record_stream(pool, l->p, st[rnd() & 1]), MP_OK);
    } else if (r == 56 && op % 7 == 0) {
      cr_assert_eq(mp_pool_trim(pool, (size_t)(rnd() % (64u << 20))), MP_OK);
    } else {
      size_t i = rnd() % n;
      verify(&lv[i]);
      cr_assert_eq(mp_pool_free(pool, lv[i].p), MP_OK, "op %d: %s", op,
                   mp_last_error());
      requested -= lv[i].bytes;
      lv[i] = lv[--n];
    }
    if (op % 25000 == 0 || op == ops - 1) {
      cr_assert_eq(mp_pool_check(pool), MP_OK, "op %d: %s", op,
                   mp_last_error());
      mp_stats_t s;
      mp_pool_get_stats(pool, &s);
      cr_assert_eq(s.requested_bytes, requested);
      cr_assert_eq(s.live_blocks, n);
      cr_assert_leq(s.allocated_bytes, s.reserved_bytes);
      for (size_t i = 0; i < n; i++)
        verify(&lv[i]);
    }
  }
  for (size_t i = 0; i < n; i++) {
    verify(&lv[i]);
    cr_assert_eq(mp_pool_free(pool, lv[i].p), MP_OK);
  }
  mp_stats_t s;
  mp_pool_get_stats(pool, &s);
  cr_expect_eq(s.allocated_bytes, 0);
  cr_expect_eq(s.free_blocks <= s.segment_count + 2 * n + 8, true);
  cr_assert_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_stream_destroy(dev, st[1]);
  mp_device_close(dev);
  free(lv);
}

Test(pool_random, virtual_segments_keep_contents_and_invariants) {
  run("host", "virtual=1", 1, 300000);
}

Test(pool_random, plain_segments_keep_contents_and_invariants) {
  run("host:vmm=0", "virtual=0", 2, 150000);
}

Test(pool_random, max_split_and_large_align_keep_invariants) {
  run("host:vmm=0", "virtual=0,max_split=1M,align=4096,segment_bytes=4M", 3,
      60000);
}

Test(pool_random, max_split_is_harmless_on_virtual_ranges) {
  run("host", "max_split=1M,segment_bytes=4M", 4, 60000);
}
