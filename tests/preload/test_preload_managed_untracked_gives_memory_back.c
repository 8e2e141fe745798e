/* test_preload_managed_untracked_gives_memory_back.c - on the host device
 * (MEMPOOL_DEVICE=host), which serves cudaMallocManaged itself (one device
 * allocation, runtime.c), an allocation the shim's table of pointers has no
 * room to record (host memory ran out for its entry) is
 * cudaErrorMemoryAllocation and its memory goes back to the device:
 * unrecorded, its cudaFree would be refused as a pointer the host device
 * never handed out, and the memory lost. The device's free bytes are as
 * before the call. The shim's sources run in this process (no LD_PRELOAD);
 * mp__ptrmap_put (ptrmap.c) is wrapped to fail for the table's map
 * (entries of mp__pl_block_t) when asked. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "refuse_table_puts.h"

static void host_mode(void) {
  setenv("MEMPOOL_DEVICE", "host:capacity=64M", 1);
  unsetenv("MEMPOOL_PRELOAD");
  unsetenv("MEMPOOL_CONF");
  unsetenv("MEMPOOL_TRACE");
}

static size_t device_free(const mp__pl_t *pl) {
  size_t free_b = 0, total = 0;
  cr_assert_eq(mp_device_mem_info(pl->dev, &free_b, &total), MP_OK);
  return free_b;
}

Test(preload_managed_untracked_gives_memory_back, cudaMallocManaged,
     .init = host_mode) {
  const mp__pl_t *pl = mp__pl_get();
  cr_assert(pl->mode == MP__PL_POOL && pl->host);
  size_t was = device_free(pl);
  void *p = NULL;
  refuse_table_puts = 1;
  mp__cudaerr r = cudaMallocManaged(&p, 1u << 20, 0x01u /* global */);
  refuse_table_puts = 0;
  cr_assert_eq(refused, 1, "the table's put was not refused");
  cr_expect_eq(r, MP__CUDA_MEMORY_ALLOCATION, "answered %u", r);
  cr_expect_null(p, "a pointer was handed out: %p", p);
  size_t now = device_free(pl);
  cr_expect_eq(now, was, "the device's free bytes are %zu, were %zu", now, was);
  /* And the next one is the program's. */
  cr_assert_eq(cudaMallocManaged(&p, 1u << 20, 0x01u), MP__CUDA_SUCCESS);
  cr_expect_eq(cudaFree(p), MP__CUDA_SUCCESS);
  cr_expect_eq(device_free(pl), was);
}
