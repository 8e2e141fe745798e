/* test_preload_refused_free.c - a free the device refuses leaves the
 * pointer with the shim, so that the program can free it again once the
 * refusal is over. The shim's sources run in this process (no LD_PRELOAD:
 * the test calls its hooks directly), on the host device, where the
 * refusal is a free from a host function: cuda.h, cuLaunchHostFunc, "the
 * host function must not make any CUDA API calls". */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "free_in_host_fn.h"

static void host_mode(void) {
  setenv("MEMPOOL_DEVICE", "host:capacity=64M", 1);
  unsetenv("MEMPOOL_PRELOAD");
  unsetenv("MEMPOOL_CONF");
}

static void refused_then_freed(bool driver) {
  void *m = NULL;
  cr_assert_eq(cudaMallocManaged(&m, 4096, 0x01 /* cudaMemAttachGlobal */), 0);
  const mp__pl_t *pl = mp__pl_get();
  cr_assert_eq(pl->mode, MP__PL_POOL);
  cr_assert(pl->host);
  cr_expect_neq(free_from_host_fn(pl, m, driver), 0,
                "a free in a host function went through");
  unsigned r = driver ? cuMemFree_v2((mp__cuptr)(uintptr_t)m) : cudaFree(m);
  cr_expect_eq(r, 0, "the refused pointer could not be freed again");
  r = driver ? cuMemFree_v2((mp__cuptr)(uintptr_t)m) : cudaFree(m);
  cr_expect_neq(r, 0, "freed twice");
}

Test(preload_refused_free, a_refused_cudaFree_of_managed_memory_keeps_it,
     .init = host_mode) {
  refused_then_freed(false);
}

Test(preload_refused_free, a_refused_cuMemFree_of_managed_memory_keeps_it,
     .init = host_mode) {
  refused_then_freed(true);
}
