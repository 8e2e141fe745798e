/* test_cuda_direct_more_than_the_device.c - on CUDA, mp_direct_alloc of
 * more than the device has in all (cuMemGetInfo's total) is MP_ENOMEM
 * without a device synchronization or a free: nothing the session gives
 * back could make it fit. It used to end the session first (cuCtxSynchronize
 * and a cuMemFree of every deferred block), then fail anyway. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "fakecuda_test.h"

static void small_device(void) {
  setenv("FAKECUDA_DEVICE", "capacity=64M", 1); /* read at cuInit */
}

Test(cuda_direct_more_than_the_device, neither_synchronizes_nor_frees,
     .init = small_device) {
  mp_device_t *dev = open_dev("cuda");
  size_t total = 0;
  cr_assert_eq(mp_device_mem_info(dev, NULL, &total), MP_OK, "%s",
               mp_last_error());
  mp_direct_t *d = NULL;
  cr_assert_eq(mp_direct_create(dev, &d), MP_OK, "%s", mp_last_error());
  /* Fits only once the block below has gone back. */
  size_t fit = free_bytes(dev) & ~(((size_t)1 << 20) - 1);
  void *a = NULL, *p = NULL;
  cr_assert_eq(mp_direct_alloc(d, 1 << 20, NULL, &a), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_direct_free(d, a), MP_OK, "%s", mp_last_error());
  fk_reset_calls();
  cr_assert_eq(mp_direct_alloc(d, total + (1 << 20), NULL, &p), MP_ENOMEM);
  cr_expect(strstr(mp_last_error(), "more than device") != NULL, "%s",
            mp_last_error());
  fk_assert_calls("cuCtxSynchronize", 0);
  fk_assert_calls("cuMemFree_v2", 0);
  mp_stats_t s;
  cr_assert_eq(mp_direct_get_stats(d, &s), MP_OK, "%s", mp_last_error());
  cr_expect_eq(s.free_blocks, 1, "the freed block stays deferred");
  cr_expect_eq(s.device_free_count, 0);
  /* Within the device's size, a full device still ends the session. */
  cr_assert_eq(mp_direct_alloc(d, fit, NULL, &p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_direct_get_stats(d, &s), MP_OK, "%s", mp_last_error());
  cr_expect_eq(s.device_free_count, 1);
  cr_expect_eq(s.alloc_retry_count, 1);
  cr_expect_eq(mp_direct_free(d, p), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_direct_destroy(d), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}
