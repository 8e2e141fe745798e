/* host-pow2's device calls count the page-locked allocations the driver
 * made, as the pool's device_alloc_count does (mempool/stats.h: calls into
 * the driver): one the driver refused made nothing, and counting it put
 * the row's figure one above host-pool's for the same work. */
#include <criterion/criterion.h>

#include "mpbench.h"

/* 2^61 bytes: a power-of-two class host-pow2 takes (its limit is 2^62),
 * and an mmap no 47- or 56-bit address space holds, so the host device's
 * page-locked allocation is refused every time. */
#define TOO_BIG ((size_t)1 << 61)

Test(host_pow2, a_refused_page_locked_allocation_is_no_device_call) {
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host", &dev), MP_OK, "%s", mp_last_error());
  mpb_allocator_t *a = NULL;
  cr_assert_eq(mpb_allocator_open("host-pow2", dev, NULL, &a), MP_OK, "%s",
               mp_last_error());
  void *p = NULL, *q = NULL;
  cr_assert_eq(mpb_allocator_alloc(a, 3000, NULL, &p), MP_OK, "%s",
               mp_last_error());
  mpb_sample_t before, after;
  mpb_allocator_sample(a, &before);
  cr_expect_eq(before.device_calls, 1);
  cr_expect_eq(before.reserved, 4096);

  cr_expect_eq(mpb_allocator_alloc(a, TOO_BIG, NULL, &q), MP_ENOMEM);
  mpb_allocator_sample(a, &after);
  cr_expect_eq(after.device_calls, before.device_calls,
               "%llu device calls after a refused allocation, %llu before",
               (unsigned long long)after.device_calls,
               (unsigned long long)before.device_calls);
  cr_expect_eq(after.reserved, before.reserved);

  /* Still usable: a freed block comes back from the cache, a new class
   * from the driver. */
  cr_expect_eq(mpb_allocator_free(a, p), MP_OK);
  cr_expect_eq(mpb_allocator_alloc(a, 4096, NULL, &p), MP_OK);
  cr_expect_eq(mpb_allocator_alloc(a, 5000, NULL, &q), MP_OK);
  mpb_allocator_sample(a, &after);
  cr_expect_eq(after.device_calls, 2);
  cr_expect_eq(after.reserved, 4096 + 8192);
  cr_expect_eq(mpb_allocator_free(a, p), MP_OK);
  cr_expect_eq(mpb_allocator_free(a, q), MP_OK);
  mpb_allocator_close(a);
  mp_device_close(dev);
}
