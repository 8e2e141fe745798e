/* test_preload_sync_free_capture_unknown_refused.c - a synchronous free
 * (cuMemFree) of a pool block while the driver answers its capture
 * question (cuStreamIsCapturing of the legacy stream) with an error that
 * is no capture's, the sticky error after a kernel's fault (cuda.h,
 * CUDA_ERROR_ILLEGAL_ADDRESS, \notefnerr), is refused with that code, as
 * the driver refuses its own free, and the block stays the program's.
 *
 * Before, the shim could not tell whether a capture prohibits the free,
 * freed the block into the pool and answered success. The shim's sources
 * run in this process on the fake driver (cuFakeSetStickyError). */
#include "in_process.h"

#define ILLEGAL_ADDRESS 700u /* cuda.h, CUDA_ERROR_ILLEGAL_ADDRESS */

/* Every later call answers code (0: none). */
static void sticky(unsigned code) {
  void (*set)(int) = NULL;
  *(void **)&set = dlsym(RTLD_DEFAULT, "cuFakeSetStickyError");
  cr_assert_not_null(set, "the fake driver has no cuFakeSetStickyError");
  set((int)code);
}

static void pooling(void) {
  unsetenv("MEMPOOL_TRACE");
  mp_in_process_cuda();
}

Test(preload_sync_free_capture_unknown_refused, keeps_block, .init = pooling) {
  mp__cuptr p = 0;
  cr_assert_eq(cuMemAlloc_v2(&p, 4096), 0);
  sticky(ILLEGAL_ADDRESS);
  cr_expect_eq(cuMemFree_v2(p), ILLEGAL_ADDRESS,
               "the free under a sticky error was not refused");
  sticky(0);
  cr_expect_eq(cuMemFree_v2(p), MP__CU_SUCCESS,
               "the block is no longer the program's");
}
