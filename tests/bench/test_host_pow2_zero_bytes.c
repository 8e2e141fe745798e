/* host-pow2 answers a request of 0 bytes as PyTorch's
 * CachingHostAllocator::allocate does (c10 CachingHostAllocator.h: "if
 * (size == 0) return {nullptr, nullptr}"): MP_OK with NULL, no page-locked
 * block made. Before, it made a block of the 1-byte class: one driver call
 * and reserved bytes the baseline it stands for never has. */
#include <criterion/criterion.h>

#include "mpbench.h"

static mp_device_t *dev;
static mpb_allocator_t *pow2;

static void open_pow2(void) {
  cr_assert_eq(mp_device_open("host", &dev), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mpb_allocator_open("host-pow2", dev, NULL, &pow2), MP_OK, "%s",
               mp_last_error());
}

static void close_pow2(void) {
  mpb_allocator_close(pow2);
  mp_device_close(dev);
}

static mpb_sample_t sample(void) {
  mpb_sample_t s;
  mpb_allocator_sample(pow2, &s);
  return s;
}

TestSuite(host_pow2_zero_bytes, .init = open_pow2, .fini = close_pow2);

Test(host_pow2_zero_bytes, is_null_with_no_driver_call) {
  void *p = (void *)&dev;
  cr_expect_eq(mpb_allocator_alloc(pow2, 0, NULL, &p), MP_OK, "%s",
               mp_last_error());
  cr_expect_null(p);
  cr_expect_eq(sample().device_calls, 0, "%llu driver calls for 0 bytes",
               (unsigned long long)sample().device_calls);
  cr_expect_eq(sample().reserved, 0, "%zu bytes reserved for 0 bytes",
               sample().reserved);
  cr_expect_eq(mpb_allocator_free(pow2, p), MP_OK);
  /* A byte is still a block of its own. */
  cr_expect_eq(mpb_allocator_alloc(pow2, 1, NULL, &p), MP_OK);
  cr_expect_not_null(p);
  cr_expect_eq(sample().device_calls, 1);
  cr_expect_eq(mpb_allocator_free(pow2, p), MP_OK);
}
