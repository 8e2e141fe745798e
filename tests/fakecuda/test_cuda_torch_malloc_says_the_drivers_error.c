/* mp_torch_malloc asks whether its stream is captured (to route it to the
 * capture's graph pool, torch.c) before the pool serves it. After a
 * kernel's fault the driver fails that question with its sticky error
 * ("any further CUDA work will return the same error", cuda.h): that is
 * no answer, and the allocation says the driver's error. It was taken for
 * "cannot tell" (the cuda backend answered -1 for every refusal of
 * cuStreamGetCaptureInfo) and the pool served a cached block as if the
 * stream were not captured. The sticky error is the fake's: no GPU twin. */
#include <stdio.h>
#include <stdlib.h>

#include <cuda.h>
#include <mempool/mempool.h>

#include "fakecuda_test.h"

#define MiB ((size_t)1 << 20)

static void on_cuda(void) {
  setenv("MEMPOOL_DEVICE", "cuda", 1);
}

TestSuite(cuda_torch_malloc_driver_error, .init = on_cuda);

Test(cuda_torch_malloc_driver_error, a_sticky_error_is_the_mallocs_failure) {
  if (fk_is_real())
    cr_skip_test("the sticky error is the fake driver's");
  mp_device_t *dev = mp_pool_device(mp_default_pool());
  mp_stream_t s = NULL;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  /* A block of s cached in the pool, which needs no driver call to serve. */
  void *p = mp_torch_malloc(MiB, 0, s);
  cr_assert_not_null(p, "%s", mp_last_error());
  mp_torch_free(p, MiB, 0, s);
  fk_sticky_error(CUDA_ERROR_ILLEGAL_ADDRESS);
  void *q = mp_torch_malloc(MiB, 0, s);
  mp_status_t st = mp_last_status();
  int cu = mp_last_driver_error();
  char msg[512];
  snprintf(msg, sizeof msg, "%s", mp_last_error());
  fk_sticky_error(0);
  cr_expect_null(q, "served though the driver failed the capture question");
  cr_expect_eq(st, MP_EDRIVER, "%s: %s", mp_status_name(st), msg);
  cr_expect_eq(cu, CUDA_ERROR_ILLEGAL_ADDRESS, "%d: %s", cu, msg);
  if (q != NULL)
    mp_torch_free(q, MiB, 0, s);
  /* The driver answering again, the block is served. */
  q = mp_torch_malloc(MiB, 0, s);
  cr_expect_not_null(q, "%s", mp_last_error());
  mp_torch_free(q, MiB, 0, s);
  mp_stats_t stats;
  cr_assert_eq(mp_pool_get_stats(mp_default_pool(), &stats), MP_OK);
  cr_expect_eq(stats.live_blocks, 0);
  cr_expect_eq(mp_pool_check(mp_default_pool()), MP_OK, "%s", mp_last_error());
}
