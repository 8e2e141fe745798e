/* An allocator row's device calls count the device (or page-locked)
 * allocations and frees the driver made, as the pool's stats count them
 * (mempool/stats.h: calls into the driver, counted where the call
 * succeeded) and host-pow2 does. host-direct, pool-nograph and jemalloc
 * counted the attempt: a refused allocation (the row that ran out of
 * memory) put them one above the pool for the same work. Each allocator
 * here makes one block, is refused one too big, then frees the first: the
 * count is unchanged by the refusal, and the successful calls are all
 * counted. */
#include <criterion/criterion.h>
#include <string.h>

#include "mpbench.h"

#define MiB ((size_t)1 << 20)
/* 2^61 bytes: page-locked memory no 47- or 56-bit address space holds. */
#define TOO_BIG_PINNED ((size_t)1 << 61)
/* Over the device's 64 MiB. */
#define TOO_BIG_DEVICE (128 * MiB)

static uint64_t calls(mpb_allocator_t *a) {
  mpb_sample_t s;
  mpb_allocator_sample(a, &s);
  return s.device_calls;
}

/* name on a 64 MiB host device: one block, one refused, the block freed.
 * capture: inside a capture on the default stream (pool-nograph serves it
 * from the device), released after. want: the device calls at the end
 * (the block's allocation and free, both made), or 0 where they are the
 * allocator's own business (a pool keeps what it got). */
static void refused_is_not_counted(const char *name, bool capture,
                                   uint64_t want) {
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host:capacity=64M", &dev), MP_OK, "%s",
               mp_last_error());
  char why[160];
  if (!mpb_allocator_available(name, dev, why, sizeof why)) {
    mp_device_close(dev);
    cr_skip_test("%s: %s", name, why);
  }
  mpb_allocator_t *a = NULL;
  cr_assert_eq(mpb_allocator_open(name, dev, NULL, &a), MP_OK, "%s: %s", name,
               mp_last_error());
  if (capture)
    cr_assert_eq(mpb_allocator_graph(a, MPB_CAPTURE_BEGIN, NULL), MP_OK);
  void *p = NULL, *q = NULL;
  cr_assert_eq(mpb_allocator_alloc(a, MiB, NULL, &p), MP_OK, "%s: %s", name,
               mp_last_error());
  uint64_t before = calls(a);
  cr_expect_geq(before, 1, "%s: %llu device calls for a first block", name,
                (unsigned long long)before);
  size_t big = mpb_allocator_is_pinned(name) ? TOO_BIG_PINNED : TOO_BIG_DEVICE;
  cr_expect_neq(mpb_allocator_alloc(a, big, NULL, &q), MP_OK,
                "%s: %zu bytes were allocated", name, big);
  uint64_t after = calls(a);
  cr_expect_eq(after, before,
               "%s: %llu device calls after a refused allocation, %llu before",
               name, (unsigned long long)after, (unsigned long long)before);
  cr_expect_eq(mpb_allocator_free(a, p), MP_OK);
  if (capture) {
    cr_expect_eq(mpb_allocator_graph(a, MPB_CAPTURE_END, NULL), MP_OK);
    cr_expect_eq(mpb_allocator_graph(a, MPB_GRAPH_RELEASE, NULL), MP_OK);
  }
  if (want != 0)
    cr_expect_eq(calls(a), want, "%s: %llu device calls at the end", name,
                 (unsigned long long)calls(a));
  mpb_allocator_close(a);
  mp_device_close(dev);
}

/* One page-locked allocation, one free: each a call the driver made. */
Test(refused_device_call_not_counted, host_direct) {
  refused_is_not_counted("host-direct", false, 2);
}

/* A capture's allocation from the device, then its free at the release. */
Test(refused_device_call_not_counted, pool_nograph_in_a_capture) {
  refused_is_not_counted("pool-nograph", true, 2);
}

Test(refused_device_call_not_counted, jemalloc) {
  refused_is_not_counted("jemalloc", false, 0);
}

Test(refused_device_call_not_counted, host_jemalloc) {
  refused_is_not_counted("host-jemalloc", false, 0);
}

/* The references the others now match. */
Test(refused_device_call_not_counted, pool_host_pool_host_pow2_direct) {
  refused_is_not_counted("pool", false, 0);
  refused_is_not_counted("host-pool", false, 0);
  refused_is_not_counted("host-pow2", false, 0);
  refused_is_not_counted("direct", false, 2);
}
