/* test_preload_refused_free_keeps_entry.c - a free the shim refuses leaves
 * the block in its table of pointers even when host memory has run out:
 * the program's next free of it goes through. Before, a free took the
 * entry out of the table and put it back when refused; a put that found no
 * host memory lost it, and the block could never be freed (refused as a
 * pointer the pool or the device never handed out). The shim's sources run
 * in this process; the table's puts fail when asked (refuse_table_puts.h)
 * while the free is refused:
 *  - on the host device, a managed block freed from a host function (cuda.h,
 *    cuLaunchHostFunc: "must not make any CUDA API calls");
 *  - on the fake driver, a pool block freed while the pools are paused
 *    (mempool_preload_pause: frees fail and change nothing). */
#include "free_in_host_fn.h"
#include "in_process.h"
#include "refuse_table_puts.h"

static void host_mode(void) {
  setenv("MEMPOOL_DEVICE", "host:capacity=64M", 1);
  unsetenv("MEMPOOL_PRELOAD");
  unsetenv("MEMPOOL_CONF");
  unsetenv("MEMPOOL_TRACE");
}

static void managed_refused_then_freed(bool driver) {
  void *m = NULL;
  cr_assert_eq(cudaMallocManaged(&m, 4096, 0x01 /* cudaMemAttachGlobal */), 0);
  const mp__pl_t *pl = mp__pl_get();
  cr_assert(pl->mode == MP__PL_POOL && pl->host);
  refuse_table_puts = 1;
  unsigned refusal = free_from_host_fn(pl, m, driver);
  refuse_table_puts = 0;
  cr_assert_neq(refusal, 0, "a free in a host function went through");
  unsigned r = driver ? cuMemFree_v2((mp__cuptr)(uintptr_t)m) : cudaFree(m);
  cr_expect_eq(r, 0,
               "the refused pointer could not be freed again (%u; %d puts "
               "refused)",
               r, refused);
}

Test(preload_refused_free_keeps_entry, managed_cudaFree_in_a_host_function,
     .init = host_mode) {
  managed_refused_then_freed(false);
}

Test(preload_refused_free_keeps_entry, managed_cuMemFree_in_a_host_function,
     .init = host_mode) {
  managed_refused_then_freed(true);
}

Test(preload_refused_free_keeps_entry, pool_block_freed_while_paused,
     .init = mp_in_process_cuda) {
  mp__cuptr d = 0;
  cr_assert_eq(cuMemAlloc_v2(&d, 1u << 20), MP__CU_SUCCESS);
  cr_assert_eq(mempool_preload_pause(0), 0, "the pools could not pause");
  refuse_table_puts = 1;
  mp__curesult r = cuMemFree_v2(d);
  refuse_table_puts = 0;
  cr_assert_neq(r, MP__CU_SUCCESS, "a free while paused went through");
  cr_assert_eq(mempool_preload_resume(), 0);
  r = cuMemFree_v2(d);
  cr_expect_eq(r, MP__CU_SUCCESS,
               "the refused pointer could not be freed again (%u; %d puts "
               "refused)",
               r, refused);
}
