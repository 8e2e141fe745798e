/* test_preload_pinned_alloc_untracked_gives_block_back.c - a page-locked
 * allocation the host pool serves but the shim's table of pointers has no
 * room to record (host memory ran out for its entry) is out of memory, and
 * the block goes back to the pool: it was neither the program's (it could
 * never be freed, its free refused as a pointer the pool never handed out)
 * nor the pool's. The shim's sources run in this process on the fake
 * driver; mp__ptrmap_put (ptrmap.c) is wrapped to fail for the table's map
 * (entries of mp__pl_block_t) when asked. */
#include "in_process.h"
#include "refuse_table_puts.h"

/* A block served from the pool's cache: one of size made and freed
 * (its chunk made, so nothing else is asked of the driver). */
static void *warm(size_t size) {
  void *a = NULL;
  cr_assert_eq(cuMemAllocHost_v2(&a, size), MP__CU_SUCCESS);
  cr_assert_eq(cuMemFreeHost(a), MP__CU_SUCCESS);
  return a;
}

/* The next allocation of size gets block a again, and it frees. */
static void served_again(void *a, size_t size) {
  void *c = NULL;
  cr_assert_eq(cuMemAllocHost_v2(&c, size), MP__CU_SUCCESS);
  cr_expect_eq(c, a, "the block was not given back to the pool (%p, not %p)", c,
               a);
  cr_expect_eq(cuMemFreeHost(c), MP__CU_SUCCESS);
}

Test(preload_pinned_alloc_untracked_gives_block_back, cuMemAllocHost,
     .init = mp_in_process_cuda) {
  void *a = warm(4096);
  void *b = a;
  refuse_table_puts = 1;
  mp__curesult r = cuMemAllocHost_v2(&b, 4096);
  refuse_table_puts = 0;
  cr_assert_eq(refused, 1, "the table's put was not refused");
  cr_expect_eq(r, MP__CU_OUT_OF_MEMORY, "answered %u", r);
  cr_expect_null(b, "a pointer was handed out: %p", b);
  served_again(a, 4096);
}

Test(preload_pinned_alloc_untracked_gives_block_back, cudaHostAlloc,
     .init = mp_in_process_cuda) {
  void *a = warm(8192);
  void *b = a;
  refuse_table_puts = 1;
  mp__cudaerr r = cudaHostAlloc(&b, 8192, 0x01u /* portable */);
  refuse_table_puts = 0;
  cr_assert_eq(refused, 1, "the table's put was not refused");
  cr_expect_eq(r, MP__CUDA_MEMORY_ALLOCATION, "answered %u", r);
  cr_expect_null(b, "a pointer was handed out: %p", b);
  served_again(a, 8192);
}
