/* test_pool_size_limits.c - sizes and options at the edges of what a pool
 * can serve: a max_split that is not a multiple of the granule still serves
 * every request below the device's capacity, an alignment above what the
 * device can guarantee is refused at create, a size whose rounding
 * would wrap fails without leaving memory reserved, and a pool of two
 * streams under max_split does not grow past the free memory it holds. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include <mempool/mempool.h>

#include "../support/pool_helpers.h"

#define MiB ((size_t)1 << 20)

static void odd_max_split_serves(const char *spec, const char *opts) {
  mp_device_t *dev = NULL;
  cr_assert_eq(mp_device_open(spec, &dev), MP_OK, "%s", mp_last_error());
  mp_pool_t *p = make_pool(dev, opts);
  void *x[4];
  for (int i = 0; i < 4; i++) {
    cr_expect_eq(mp_pool_alloc(p, 4500000, NULL, &x[i]), MP_OK,
                 "%s %s alloc %d: %s", spec, opts, i, mp_last_error());
    check(p);
  }
  mp_stats_t s = stats(p);
  /* Four blocks of 4.3 MiB need at most 4 * 6 MiB whatever the rounding. */
  cr_expect_leq(s.reserved_bytes, 24 * MiB, "%s %s: %zu reserved", spec, opts,
                s.reserved_bytes);
  cr_expect_leq(s.device_alloc_count, 8, "%s %s", spec, opts);
  for (int i = 0; i < 4; i++)
    cr_expect_eq(mp_pool_free(p, x[i]), MP_OK);
  check(p);
  mp_pool_destroy(p);
  mp_device_close(dev);
}

Test(pool_size_limits, max_split_off_the_granule_still_serves_below_it) {
  const char *opts[] = {"max_split=5M", "max_split=3M", "max_split=7M",
                        "max_split=5M,virtual=0"};
  for (size_t i = 0; i < sizeof opts / sizeof *opts; i++) {
    odd_max_split_serves("host:capacity=1G", opts[i]);
    odd_max_split_serves("host:capacity=1G,vmm=0", opts[i]);
  }
}

static void align_refused_or_honoured(const char *spec, const char *opts) {
  mp_device_t *dev = NULL;
  cr_assert_eq(mp_device_open(spec, &dev), MP_OK, "%s", mp_last_error());
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_assert_eq(mp_pool_config_parse(&cfg, opts), MP_OK, "%s", mp_last_error());
  mp_pool_t *p = NULL;
  mp_status_t st = mp_pool_create(dev, &cfg, &p);
  if (st != MP_OK) {
    cr_expect_eq(st, MP_EINVAL, "%s %s: %s", spec, opts, mp_status_name(st));
    cr_expect(strstr(mp_last_error(), "align"), "%s", mp_last_error());
    cr_expect_null(p);
  } else {
    void *x[3];
    size_t sz[3] = {1000, 3 * MiB, 100};
    for (int i = 0; i < 3; i++) {
      cr_assert_eq(mp_pool_alloc(p, sz[i], NULL, &x[i]), MP_OK, "%s",
                   mp_last_error());
      cr_expect_eq((uintptr_t)x[i] % cfg.align, 0, "%s %s: %p", spec, opts,
                   x[i]);
      check(p);
    }
    for (int i = 0; i < 3; i++)
      cr_expect_eq(mp_pool_free(p, x[i]), MP_OK);
    check(p);
    mp_pool_destroy(p);
  }
  mp_device_close(dev);
}

Test(pool_size_limits, align_above_the_device_guarantee_is_refused_or_kept) {
  align_refused_or_honoured("host:capacity=1G", "align=4M");
  align_refused_or_honoured("host:capacity=1G,granularity=4K", "align=64K");
  align_refused_or_honoured("host:capacity=4G,vmm=0", "align=1G");
  align_refused_or_honoured("host:capacity=1G", "align=1M");
}

Test(pool_size_limits, rounding_that_wraps_fails_and_reserves_nothing) {
  mp_device_t *dev = NULL;
  cr_assert_eq(mp_device_open("host:capacity=1G", &dev), MP_OK);
  const char *opts[] = {"max_bytes=16E", "max_bytes=16E,flags=0",
                        "max_bytes=16E,align=4096"};
  for (size_t i = 0; i < sizeof opts / sizeof *opts; i++) {
    mp_pool_config_t cfg;
    mp_pool_config_init(&cfg);
    cfg.max_bytes = SIZE_MAX;
    if (strstr(opts[i], "flags=0"))
      cfg.flags = 0;
    if (strstr(opts[i], "align"))
      cfg.align = 4096;
    mp_pool_t *p = NULL;
    cr_assert_eq(mp_pool_create(dev, &cfg, &p), MP_OK, "%s", mp_last_error());
    size_t sizes[] = {SIZE_MAX, SIZE_MAX - 511, SIZE_MAX - (2 * MiB) + 1,
                      SIZE_MAX / 2 + 1};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
      void *x = (void *)1;
      mp_status_t st = mp_pool_alloc(p, sizes[k], NULL, &x);
      cr_expect(st == MP_ENOMEM || st == MP_ELIMIT, "%s size %zu: %s", opts[i],
                sizes[k], mp_status_name(st));
      mp_handle_t *h;
      st = mp_pool_alloc_movable(p, sizes[k], NULL, &h);
      cr_expect(st == MP_ENOMEM || st == MP_ELIMIT, "%s movable %zu: %s",
                opts[i], sizes[k], mp_status_name(st));
      mp_stats_t s = stats(p);
      cr_expect_eq(s.reserved_bytes, 0, "%s size %zu left %zu reserved",
                   opts[i], sizes[k], s.reserved_bytes);
      cr_expect_eq(s.device_alloc_count, s.device_free_count, "%s", opts[i]);
      check(p);
    }
    mp_pool_destroy(p);
  }
  mp_device_close(dev);
}

/* A serving loop under max_split on two streams: a few small blocks stay
 * live on a second stream (a captured graph's, say) above the weights, and
 * the default stream's steps come and go, some above the split limit.
 * What a step frees merges into one free block above the limit at the top
 * of the range; small requests must be served from it (or it reclaimed)
 * rather than the range growing past it, however late the streams run.
 * Fails on main: peak reserved 12 676 MiB for 730 MiB live. */
Test(pool_size_limits, two_streams_under_max_split_reuse_their_free_top) {
  mp_device_t *dev = NULL;
  cr_assert_eq(mp_device_open("host:capacity=64G", &dev), MP_OK);
  mp_pool_t *p = make_pool(dev, "max_split=64M");
  mp_stream_t s1;
  cr_assert_eq(mp_stream_create(dev, &s1), MP_OK);
  void *weights, *kv, *kept[4];
  cr_assert_eq(mp_pool_alloc(p, 384 * MiB, NULL, &weights), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 256 * MiB, NULL, &kv), MP_OK);
  for (int i = 0; i < 4; i++)
    cr_assert_eq(mp_pool_alloc(p, (size_t)(2 + 2 * i) * MiB, s1, &kept[i]),
                 MP_OK);
  uint64_t rng = 1;
  for (int step = 0; step < 120; step++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    size_t tokens = 1 + (size_t)(rng >> 33) % 512, h = 2048 * tokens;
    void *prev[3] = {0}, *cur[3], *logits;
    for (int l = 0; l < 16; l++) {
      size_t sz[3] = {3 * h, h, 4 * h};
      for (int k = 0; k < 3; k++)
        cr_assert_eq(mp_pool_alloc(p, sz[k], NULL, &cur[k]), MP_OK, "%s",
                     mp_last_error());
      for (int k = 0; k < 3; k++) {
        cr_assert_eq(mp_pool_free(p, prev[k]), MP_OK); /* NULL: MP_OK */
        prev[k] = cur[k];
      }
    }
    cr_assert_eq(mp_pool_alloc(p, tokens * 128000, NULL, &logits), MP_OK);
    for (int k = 0; k < 3; k++)
      cr_assert_eq(mp_pool_free(p, prev[k]), MP_OK);
    cr_assert_eq(mp_pool_free(p, logits), MP_OK);
  }
  mp_stats_t s = stats(p);
  cr_expect_leq(s.peak_reserved_bytes, s.peak_requested_bytes * 3 / 2,
                "peak reserved %zu MiB for %zu MiB live",
                s.peak_reserved_bytes / MiB, s.peak_requested_bytes / MiB);
  check(p);
  for (int i = 0; i < 4; i++)
    cr_assert_eq(mp_pool_free(p, kept[i]), MP_OK);
  cr_assert_eq(mp_pool_free(p, kv), MP_OK);
  cr_assert_eq(mp_pool_free(p, weights), MP_OK);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s1), MP_OK);
  mp_device_close(dev);
}
