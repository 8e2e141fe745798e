/* cuda-malloc's device calls count the cuMemAlloc and cuMemFree calls the
 * driver made, as the pool's stats do (mempool/stats.h: calls into the
 * driver): a cuMemAlloc refused for want of memory (CUDA_ERROR_OUT_OF_MEMORY)
 * made nothing. It was counted, so the row of a replay that ran out of
 * memory read one call more than the driver made. On the fake driver of
 * tests/fakecuda, its device 64 MiB. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "mpbench.h"

#define MiB ((size_t)1 << 20)

Test(fakecuda_refused_device_call_not_counted, cuda_malloc) {
  cr_assert_eq(setenv("FAKECUDA_DEVICE", "capacity=64M", 1), 0);
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("cuda", &dev), MP_OK, "%s", mp_last_error());
  mpb_allocator_t *a;
  cr_assert_eq(mpb_allocator_open("cuda-malloc", dev, NULL, &a), MP_OK, "%s",
               mp_last_error());
  void *p = NULL, *q = NULL;
  cr_assert_eq(mpb_allocator_alloc(a, MiB, NULL, &p), MP_OK, "%s",
               mp_last_error());
  mpb_sample_t s;
  mpb_allocator_sample(a, &s);
  cr_expect_eq(s.device_calls, 1);
  cr_expect_neq(mpb_allocator_alloc(a, 128 * MiB, NULL, &q), MP_OK,
                "128 MiB allocated on a 64 MiB device");
  mpb_allocator_sample(a, &s);
  cr_expect_eq(s.device_calls, 1,
               "%llu device calls after a refused cuMemAlloc",
               (unsigned long long)s.device_calls);
  cr_expect_eq(mpb_allocator_free(a, p), MP_OK);
  mpb_allocator_sample(a, &s);
  cr_expect_eq(s.device_calls, 2);
  mpb_allocator_close(a);
  mp_device_close(dev);
}
