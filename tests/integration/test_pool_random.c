/* Randomized operation sequences on the host device: hundreds of thousands of
 * allocs, frees, contiguous allocs, record_stream and trims, with every
 * block's ends tagged and verified before it is freed, and mp_pool_check
 * plus the stats compared with what the test itself counts between phases.
 * run_device: the same against the device's own count, with three streams,
 * frees on other streams, cap changes, requests no device holds and a
 * device that starts refusing part-way: after every operation the memory
 * the device says is in use is exactly what the pool says it reserves. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../bench/core/xorshift.h"
#include <mempool/device.h>
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

/* The device of spec and a pool on it with opts (*cfg: its config). */
static mp_pool_t *open_pool(const char *spec, const char *opts,
                            mp_device_t **dev, mp_pool_config_t *cfg) {
  cr_assert_eq(mp_device_open(spec, dev), MP_OK, "%s", mp_last_error());
  mp_pool_config_init(cfg);
  cr_assert_eq(mp_pool_config_parse(cfg, opts), MP_OK);
  mp_pool_t *pool;
  cr_assert_eq(mp_pool_create(*dev, cfg, &pool), MP_OK, "%s", mp_last_error());
  return pool;
}

static void run(const char *spec, const char *opts, uint64_t seed, int ops) {
  mp_device_t *dev;
  mp_pool_config_t cfg;
  mp_pool_t *pool = open_pool(spec, opts, &dev, &cfg);
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

/* The device's memory in use, as the device counts it. */
static size_t device_used(mp_device_t *dev) {
  size_t f = 0, t = 0;
  cr_assert_eq(mp_device_mem_info(dev, &f, &t), MP_OK);
  return t - f;
}

/* Random requests up to 64 MiB on three streams of a device of 512 MiB,
 * freed plainly, on another stream or after a record_stream, with trims,
 * cap changes (below what is reserved too) and, one in 500, a request no
 * device holds. After every operation the device's used bytes equal
 * reserved_bytes; mp_pool_check every 64. */
static void run_device(const char *spec, const char *opts, uint64_t seed,
                       int ops) {
  mp_device_t *dev;
  mp_pool_config_t cfg;
  mp_pool_t *pool = open_pool(spec, opts, &dev, &cfg);
  mp_stream_t st[3] = {NULL, NULL, NULL};
  cr_assert_eq(mp_stream_create(dev, &st[1]), MP_OK);
  cr_assert_eq(mp_stream_create(dev, &st[2]), MP_OK);
  enum { CAP = 512 };
  live_t *lv = calloc(CAP, sizeof *lv);
  size_t n = 0;
  uint64_t next_tag = seed * 7919u;
  rng_state = seed | 1;
  for (int op = 0; op < ops; op++) {
    cur_op = op;
    uint64_t r = rnd() % 1000;
    mp_stats_t s;
    if (r < 480 && n < CAP) {
      unsigned shift = (unsigned)(rnd() % 26);
      live_t l = {NULL, 1 + (size_t)(rnd() % ((uint64_t)1 << (shift + 1))),
                  ++next_tag};
      void *p;
      if (mp_pool_alloc(pool, l.bytes, st[rnd() % 3], &p) == MP_OK) {
        l.p = p;
        tag(&l);
        lv[n++] = l;
      }
    } else if (r < 482) {
      size_t huge[4] = {SIZE_MAX, SIZE_MAX - 4096, (size_t)1 << 62,
                        ((size_t)1 << 40) + 1};
      void *p = NULL;
      cr_assert_neq(mp_pool_alloc(pool, huge[rnd() % 4], st[rnd() % 3], &p),
                    MP_OK, "op %d", op);
    } else if (r < 500 && n > 0) {
      cr_assert_eq(
          mp_pool_record_stream(pool, lv[rnd() % n].p, st[1 + rnd() % 2]),
          MP_OK);
    } else if (r < 510) {
      cr_assert_eq(mp_pool_trim(pool, (size_t)(rnd() % (96u << 20))), MP_OK,
                   "op %d: %s", op, mp_last_error());
    } else if (r < 515) {
      double fr[5] = {0.05, 0.2, 0.4, 0.7, 1.0};
      cr_assert_eq(mp_pool_set_max_fraction(pool, fr[rnd() % 5]), MP_OK);
    } else if (n > 0) {
      size_t i = rnd() % n;
      verify(&lv[i]);
      mp_status_t fs = rnd() % 3 == 0
                           ? mp_pool_free_async(pool, lv[i].p, st[rnd() % 3])
                           : mp_pool_free(pool, lv[i].p);
      cr_assert_eq(fs, MP_OK, "op %d: %s", op, mp_last_error());
      lv[i] = lv[--n];
    }
    mp_pool_get_stats(pool, &s);
    cr_assert_eq(device_used(dev), s.reserved_bytes,
                 "op %d: the device has %zu bytes in use, the pool reserved "
                 "%zu",
                 op, device_used(dev), s.reserved_bytes);
    if (op % 64 == 0 || op == ops - 1) {
      cr_assert_eq(mp_pool_check(pool), MP_OK, "op %d: %s", op,
                   mp_last_error());
      cr_assert_eq(s.live_blocks, n);
    }
  }
  for (size_t i = 0; i < n; i++) {
    verify(&lv[i]);
    cr_assert_eq(mp_pool_free(pool, lv[i].p), MP_OK);
  }
  for (int k = 0; k < 3; k++)
    cr_assert_eq(mp_stream_synchronize(dev, st[k]), MP_OK);
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  mp_stats_t s;
  mp_pool_get_stats(pool, &s);
  cr_assert_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(s.reserved_bytes, 0);
  cr_expect_eq(s.segment_count, 0);
  cr_expect_eq(device_used(dev), 0);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  cr_assert_eq(device_used(dev), 0);
  mp_stream_destroy(dev, st[1]);
  mp_stream_destroy(dev, st[2]);
  mp_device_close(dev);
  free(lv);
}

/* The device runs: a device spec, pool options and a seed each, grouped
 * by what they cover. */
static const struct device_case {
  const char *spec, *opts;
  int ops;
} device_cases[] = {
    {"host:capacity=512M", "virtual=1", 20000},
    {"host:capacity=512M", "map_piece=2M", 15000},
    {"host:capacity=512M", "max_split=4M,map_piece=4M", 15000},
    {"host:capacity=512M,granularity=64K", "max_split=1M", 15000},
    {"host:capacity=512M", "release_threshold=8M,stream_waits=1", 15000},
    {"host:capacity=512M", "max_bytes=160M", 15000},
    {"host:capacity=512M,vmm=0", "virtual=0", 15000},
    {"host:capacity=128M", "virtual=1", 15000},
    {"host:capacity=512M,fail_after=40", "virtual=1", 8000},
    {"host:capacity=512M,fail_after=60", "map_piece=2M", 8000},
    {"host:capacity=512M,fail_after=30,vmm=0", "virtual=0", 8000},
};

static void run_device_cases(size_t from, size_t to) {
  for (size_t i = from; i < to; i++)
    run_device(device_cases[i].spec, device_cases[i].opts, 11 + i,
               device_cases[i].ops);
}

Test(pool_random, device_counts_match_the_virtual_range) {
  run_device_cases(0, 1);
}

Test(pool_random, device_counts_match_pieces_and_split_limits) {
  run_device_cases(1, 4);
}

Test(pool_random, device_counts_match_release_threshold_and_caps) {
  run_device_cases(4, 6);
}

Test(pool_random, device_counts_match_plain_segments) {
  run_device_cases(6, 8);
}

Test(pool_random, device_counts_match_when_the_device_refuses) {
  run_device_cases(8, 11);
}
