/* test_preload_host_device_foreign_free_host.c - on the host device
 * (MEMPOOL_DEVICE=host) cudaFreeHost of a pointer the shim never handed
 * out (a malloc'd one, a stack address, one freed already) is the
 * runtime's invalid value, answered by the shim and counted as a foreign
 * free, as its cudaFree of such a pointer is (runtime.c): the host device
 * serves every page-locked allocation, so no other pinned memory exists to
 * free, and the real runtime (absent here; on a GPU machine it would make
 * a context) must not be asked. The program's live blocks are untouched.
 * The shim's sources run in this process (no LD_PRELOAD). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "preload/hooks.h"

static void host_mode(void) {
  setenv("MEMPOOL_DEVICE", "host:capacity=64M", 1);
  unsetenv("MEMPOOL_PRELOAD");
  unsetenv("MEMPOOL_CONF");
  unsetenv("MEMPOOL_TRACE");
}

Test(preload_host_device_foreign_free_host,
     an_unknown_pointer_is_invalid_value_and_changes_nothing,
     .init = host_mode) {
  const mp__pl_t *pl = mp__pl_get();
  cr_assert(pl->mode == MP__PL_POOL && pl->host);
  void *live = NULL, *gone = NULL;
  cr_assert_eq(cudaMallocHost(&live, 256), 0);
  memset(live, 0x5a, 256);
  cr_assert_eq(cudaHostAlloc(&gone, 128, 0), 0);
  cr_assert_eq(cudaFreeHost(gone), 0);

  void *heap = malloc(64);
  int on_stack = 0;
  void *foreign[] = {heap, &on_stack, gone, (char *)live + 16};
  for (size_t i = 0; i < sizeof foreign / sizeof *foreign; i++)
    cr_expect_eq(cudaFreeHost(foreign[i]), MP__CUDA_INVALID_VALUE,
                 "cudaFreeHost of foreign pointer %zu: not invalid value", i);
  free(heap);

  for (int i = 0; i < 256; i++)
    cr_expect_eq(((unsigned char *)live)[i], 0x5a, "the live block changed");
  cr_expect_eq(cudaFreeHost(live), 0, "the live block cannot be freed");
  mp__pl_counts_t n;
  cr_assert(mp__pl_record_close(&n));
  cr_expect_eq(n.foreign_frees, 4, "foreign frees counted: %llu",
               (unsigned long long)n.foreign_frees);
}
