/* The pool's virtual range on the host device (2 MiB granule): trim gives
 * back free chunks in the middle of the range, growth refills the hole next
 * to a free block, growth past the peak first gives back free chunks that
 * idle streams freed (a busy stream's stay), and under max_split a mixed
 * workload stays within 1.3x its peak live bytes. Public API only. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mempool/mempool.h>

#include "../../bench/core/xorshift.h"
#include "../support/pool_helpers.h"
#include "../support/stream_reclaim.h"

#define MiB ((size_t)1 << 20)

Test(pool_vm_holes, trim_returns_a_middle_chunk_and_growth_refills_it) {
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host", &dev), MP_OK, "%s", mp_last_error());
  mp_pool_t *p = make_pool(dev, NULL);
  void *v[4];
  for (int i = 0; i < 4; i++)
    cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &v[i]), MP_OK);
  cr_assert_eq(stats(p).reserved_bytes, 8 * MiB);
  cr_assert_eq(mp_pool_free(p, v[1]), MP_OK);
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK);
  mp_stats_t s = stats(p);
  cr_expect_eq(s.reserved_bytes, 6 * MiB, "the middle chunk went back");
  cr_expect_eq(s.device_free_count, 1);
  check(p);
  cr_assert_eq(mp_pool_free(p, v[2]), MP_OK);
  void *x;
  cr_assert_eq(mp_pool_alloc(p, 4 * MiB, NULL, &x), MP_OK);
  cr_expect_eq(x, v[1], "mapped into the hole below the free block");
  cr_expect_eq(stats(p).reserved_bytes, 8 * MiB);
  /* The memory is real: write all of it. */
  memset(x, 0x5A, 4 * MiB);
  check(p);
  mp_pool_free(p, x);
  mp_pool_free(p, v[0]);
  mp_pool_free(p, v[3]);
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK);
  cr_expect_eq(stats(p).reserved_bytes, 0);
  check(p);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  mp_device_close(dev);
}

/* support/stream_reclaim.h, on the host device (its twin on the strict
 * fake CUDA driver and a GPU: fakecuda/test_cuda_pool_rules.c). */
static void reclaim_on_host(gate_t *held) {
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host", &dev), MP_OK, "%s", mp_last_error());
  mp_pool_t *p = make_pool(dev, NULL);
  mp_stream_t s1, s2;
  cr_assert_eq(mp_stream_create(dev, &s1), MP_OK);
  cr_assert_eq(mp_stream_create(dev, &s2), MP_OK);
  reclaim_past_a_chunk_freed_on_another_stream(p, dev, s1, s2, held);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  mp_stream_destroy(dev, s1);
  mp_stream_destroy(dev, s2);
  mp_device_close(dev);
}

/* The 10-stream llama trace grew past such chunks at its peak before (a
 * pool used from several streams skipped this reclaim). */
Test(pool_vm_holes,
     growth_past_the_peak_gives_back_a_chunk_an_idle_stream_freed) {
  reclaim_on_host(NULL);
}

Test(pool_vm_holes, growth_past_the_peak_keeps_a_chunk_a_busy_stream_freed) {
  gate_t g;
  gate_init(&g);
  reclaim_on_host(&g);
  gate_destroy(&g);
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_u64(void) {
  return xorshift64(&rng);
}

/* Sizes log-uniform 4 KiB .. 16 MiB (free blocks coalesce past max_split), live
 * bytes kept under 1 GiB, on a device of 1.3 GiB: every allocation must succeed
 * (the out-of-memory ladder may trim and retry), so the pool cannot grow
 * without bound. */
static void mixed_workload_fits(const char *opts) {
  enum { OPS = 40000, SLOTS = 4096 };
  const size_t live_cap = (size_t)1 << 30;
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host:capacity=1331M", &dev), MP_OK);
  mp_pool_t *p = make_pool(dev, opts);
  void *ptr[SLOTS] = {0};
  size_t sz[SLOTS] = {0}, live = 0, peak = 0;
  for (int op = 0; op < OPS; op++) {
    unsigned k = (unsigned)(next_u64() % SLOTS);
    if (ptr[k] != NULL) {
      cr_assert_eq(mp_pool_free(p, ptr[k]), MP_OK);
      live -= sz[k];
      ptr[k] = NULL;
      continue;
    }
    size_t lo = (size_t)1 << (12 + next_u64() % 12); /* 4 KiB .. 16 MiB */
    size_t n = (lo + next_u64() % lo) & ~(size_t)511;
    if (live + n > live_cap)
      continue;
    cr_assert_eq(mp_pool_alloc(p, n, NULL, &ptr[k]), MP_OK, "%s: %s", opts,
                 mp_last_error());
    sz[k] = n;
    live += n;
    if (live > peak)
      peak = live;
  }
  mp_stats_t s = stats(p);
  cr_expect_gt(peak, live_cap - live_cap / 8, "the workload reaches its cap");
  cr_expect_leq(s.peak_reserved_bytes, (size_t)1331 << 20);
  check(p);
  for (unsigned k = 0; k < SLOTS; k++)
    mp_pool_free(p, ptr[k]);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  mp_device_close(dev);
}

Test(pool_vm_holes, max_split_workload_fits_1_3x_its_peak_live) {
  mixed_workload_fits("max_split=64M");
}

Test(pool_vm_holes, default_workload_fits_1_3x_its_peak_live) {
  mixed_workload_fits(NULL);
}

Test(pool_vm_holes, plain_max_split_workload_fits_1_3x_its_peak_live) {
  mixed_workload_fits("virtual=0,max_split=64M");
}

/* Near the cap growth maps only what a block lacks. Filling a hole from
 * its top edge, below a free block, such a short mapping must still touch
 * the free block: it was placed a whole growth step below it, and the
 * allocation failed with MP_ELIMIT with room to spare. max_bytes just
 * under a granule multiple leaves less room than the hole is big. */
Test(pool_vm_holes, near_the_cap_growth_under_a_free_block_completes_it) {
  const size_t K = 1024;
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host:granularity=64K", &dev), MP_OK, "%s",
               mp_last_error());
  mp_pool_t *p = make_pool(dev, "segment_bytes=128K,max_bytes=654848");
  void *a, *b, *c, *d, *e, *x = NULL;
  cr_assert_eq(mp_pool_alloc(p, 128 * K, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 128 * K, NULL, &b), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 64 * K, NULL, &c), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 64 * K, NULL, &d), MP_OK);
  cr_assert_eq((char *)b, (char *)a + 128 * K);
  cr_assert_eq((char *)c, (char *)b + 128 * K);
  cr_assert_eq((char *)d, (char *)c + 64 * K);
  /* b's chunk becomes a hole between a and c; e maps the rest at the top. */
  cr_assert_eq(mp_pool_free(p, b), MP_OK);
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK);
  cr_assert_eq(stats(p).reserved_bytes, 256 * K);
  cr_assert_eq(mp_pool_alloc(p, 256 * K, NULL, &e), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq((char *)e, (char *)d + 64 * K);
  cr_assert_eq(mp_pool_free(p, c), MP_OK);
  check(p);
  /* 128K = c's free 64K plus the 64K of the hole right below it. */
  cr_expect_eq(mp_pool_alloc(p, 128 * K, NULL, &x), MP_OK, "%s",
               mp_last_error());
  check(p);
  cr_expect_leq(stats(p).reserved_bytes, (size_t)654848);
  if (x != NULL) {
    cr_expect_eq((char *)x + 128 * K, (char *)d, "the block ends at d");
    memset(x, 0x3C, 128 * K);
    mp_pool_free(p, x);
  }
  mp_pool_free(p, a);
  mp_pool_free(p, d);
  mp_pool_free(p, e);
  check(p);
  mp_pool_destroy(p);
  mp_device_close(dev);
}
