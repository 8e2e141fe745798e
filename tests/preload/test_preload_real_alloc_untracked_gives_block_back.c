/* test_preload_real_alloc_untracked_gives_block_back.c - memory the real
 * driver hands out through the shim (here in passthrough mode, which only
 * records) that the shim's table of pointers has no room to record (host
 * memory ran out for its entry) goes back to the driver, and the answer is
 * out of memory (CUDA_ERROR_OUT_OF_MEMORY), traced as a failed allocation.
 * Before, it was the program's and traced live, but its free, of a pointer
 * the table did not know, went to the driver untraced: the trace and the
 * report kept it live for good (a page-locked one counted "pinned" with
 * no "pinned_free"). The driver's free memory and the report's live bytes
 * are as before the call. The shim's sources run in this process on the
 * fake driver; the table's puts fail when asked (refuse_table_puts.h). */
#include "in_process.h"
#include "refuse_table_puts.h"

static void *libcuda;

static void passthrough_mode(void) {
  setenv("MEMPOOL_PRELOAD", "passthrough", 1);
  unsetenv("MEMPOOL_CONF");
  unsetenv("MEMPOOL_TRACE");
  libcuda = mp_in_process_context();
  cr_assert_eq(mp__pl_get()->mode, MP__PL_PASSTHROUGH);
}

/* The fake driver's free device memory (its own cuMemGetInfo_v2). */
static size_t driver_free(void) {
  mp__curesult (*info)(size_t *, size_t *) = NULL;
  *(void **)&info = dlsym(libcuda, "cuMemGetInfo_v2");
  cr_assert_not_null(info);
  size_t free_b = 0, total = 0;
  cr_assert_eq(info(&free_b, &total), 0);
  return free_b;
}

/* What the report says at exit of the recording so far. */
static mp__pl_counts_t report(void) {
  mp__pl_counts_t n;
  cr_assert(mp__pl_record_close(&n));
  return n;
}

static void refused_device_alloc(bool async) {
  size_t was = driver_free();
  mp__cuptr d = 0;
  refuse_table_puts = 1;
  mp__curesult r =
      async ? cuMemAllocAsync(&d, 1u << 20, NULL) : cuMemAlloc_v2(&d, 1u << 20);
  refuse_table_puts = 0;
  cr_assert_eq(refused, 1, "the table's put was not refused");
  cr_expect_eq(r, MP__CU_OUT_OF_MEMORY, "answered %u", r);
  cr_expect_eq(d, 0, "a pointer was handed out: %#llx", (unsigned long long)d);
  if (r == MP__CU_SUCCESS && d != 0) /* the program's: freed as it would */
    cr_expect_eq(cuMemFree_v2(d), MP__CU_SUCCESS);
  cr_expect_eq(driver_free(), was, "the driver's free memory is not back");
  mp__pl_counts_t n = report();
  cr_expect_eq(n.live, 0, "the report's live bytes: %zu", n.live);
  cr_expect_eq(n.allocs, 0, "%llu allocations traced",
               (unsigned long long)n.allocs);
  cr_expect_eq(n.alloc_failures, 1, "%llu failed allocations traced",
               (unsigned long long)n.alloc_failures);
}

Test(preload_real_alloc_untracked_gives_block_back, cuMemAlloc_v2,
     .init = passthrough_mode) {
  refused_device_alloc(false);
}

Test(preload_real_alloc_untracked_gives_block_back, cuMemAllocAsync,
     .init = passthrough_mode) {
  refused_device_alloc(true);
}

Test(preload_real_alloc_untracked_gives_block_back, cuMemAllocHost_v2,
     .init = passthrough_mode) {
  void *p = NULL;
  refuse_table_puts = 1;
  mp__curesult r = cuMemAllocHost_v2(&p, 1u << 20);
  refuse_table_puts = 0;
  cr_assert_eq(refused, 1, "the table's put was not refused");
  cr_expect_eq(r, MP__CU_OUT_OF_MEMORY, "answered %u", r);
  cr_expect_null(p, "a pointer was handed out: %p", p);
  if (r == MP__CU_SUCCESS && p != NULL)
    cr_expect_eq(cuMemFreeHost(p), MP__CU_SUCCESS);
  mp__pl_counts_t n = report();
  cr_expect_eq(n.pinned, 0, "%llu page-locked allocations counted",
               (unsigned long long)n.pinned);
}
