/* test_preload_real_alloc_untracked_gives_block_back.c - memory the real
 * driver hands out through the shim (here in passthrough mode, which only
 * records) that the shim's table of pointers has no room to record (host
 * memory ran out for its entry) goes back to the driver, and the answer is
 * out of memory (CUDA_ERROR_OUT_OF_MEMORY), traced as a failed allocation.
 * Before, it was the program's and traced live, but its free, of a pointer
 * the table did not know, went to the driver untraced: the trace and the
 * report kept it live for good (a page-locked one counted "pinned" with
 * no "pinned_free"). The driver's free memory and the report's live bytes
 * are as before the call. The same for the runtime's entry points the shim
 * interposes (cudaMalloc, cudaMallocAsync and its _ptsz form,
 * cudaMallocHost, cudaHostAlloc): the runtime's block goes back to it by
 * the matching free, and the answer is cudaErrorMemoryAllocation, the
 * runtime's last error too. The shim's sources run in this process on the
 * fake driver and, for the runtime's calls, the stand-in runtime
 * (stand_runtime.c, which keeps a last error); the table's puts fail when
 * asked (refuse_table_puts.h), and the link wraps the shim's table of the
 * runtime's calls (mp__pl_real_cudart) to see what the runtime handed out
 * and what was given back to it. */
#include "in_process.h"
#include "refuse_table_puts.h"

/* cudaErrorMemoryAllocation (driver_types.h) */
#define MEMORY_ALLOCATION 2u

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

/* The report at exit of the recording so far, after a refused
 * allocation: nothing allocated or live, failures failed allocations
 * traced (a page-locked one is not traced). */
static void report_refused(unsigned long long failures) {
  mp__pl_counts_t n;
  cr_assert(mp__pl_record_close(&n));
  cr_expect_eq(n.live, 0, "the report's live bytes: %zu", n.live);
  cr_expect_eq(n.allocs, 0, "%llu allocations traced",
               (unsigned long long)n.allocs);
  cr_expect_eq(n.alloc_failures, failures, "%llu failed allocations traced",
               (unsigned long long)n.alloc_failures);
  cr_expect_eq(n.pinned, 0, "%llu page-locked allocations counted",
               (unsigned long long)n.pinned);
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
  report_refused(1);
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
  report_refused(0);
}

/* ---- the runtime's entry points ------------------------------------------ */

const mp__real_cudart_t *__real_mp__pl_real_cudart(void);
const mp__real_cudart_t *__wrap_mp__pl_real_cudart(void);

static mp__real_cudart_t rt_wrapped;
static void *rt_handed; /* what the runtime's allocation last handed out */
static void *rt_back;   /* what was last given back to the runtime */

static mp__cudaerr handed(mp__cudaerr r, void **p) {
  if (r == 0 && p != NULL)
    rt_handed = *p;
  return r;
}

static mp__cudaerr rt_malloc(void **p, size_t n) {
  return handed(__real_mp__pl_real_cudart()->cudaMalloc(p, n), p);
}

static mp__cudaerr rt_malloc_async(void **p, size_t n, mp__custream s) {
  return handed(__real_mp__pl_real_cudart()->cudaMallocAsync(p, n, s), p);
}

static mp__cudaerr rt_malloc_async_ptsz(void **p, size_t n, mp__custream s) {
  return handed(__real_mp__pl_real_cudart()->cudaMallocAsync_ptsz(p, n, s), p);
}

static mp__cudaerr rt_malloc_host(void **p, size_t n) {
  return handed(__real_mp__pl_real_cudart()->cudaMallocHost(p, n), p);
}

static mp__cudaerr rt_host_alloc(void **p, size_t n, unsigned flags) {
  return handed(__real_mp__pl_real_cudart()->cudaHostAlloc(p, n, flags), p);
}

static mp__cudaerr rt_free(void *p) {
  rt_back = p;
  return __real_mp__pl_real_cudart()->cudaFree(p);
}

static mp__cudaerr rt_free_async(void *p, mp__custream s) {
  rt_back = p;
  return __real_mp__pl_real_cudart()->cudaFreeAsync(p, s);
}

static mp__cudaerr rt_free_async_ptsz(void *p, mp__custream s) {
  rt_back = p;
  return __real_mp__pl_real_cudart()->cudaFreeAsync_ptsz(p, s);
}

static mp__cudaerr rt_free_host(void *p) {
  rt_back = p;
  return __real_mp__pl_real_cudart()->cudaFreeHost(p);
}

/* The runtime's table, its allocations and frees seen (the stand-in
 * runtime has them all: stand_runtime.c). */
const mp__real_cudart_t *__wrap_mp__pl_real_cudart(void) {
  rt_wrapped = *__real_mp__pl_real_cudart();
  if (rt_wrapped.cudaMalloc == NULL)
    return &rt_wrapped; /* no runtime loaded: nothing to see */
  rt_wrapped.cudaMalloc = rt_malloc;
  rt_wrapped.cudaMallocAsync = rt_malloc_async;
  rt_wrapped.cudaMallocAsync_ptsz = rt_malloc_async_ptsz;
  rt_wrapped.cudaMallocHost = rt_malloc_host;
  rt_wrapped.cudaHostAlloc = rt_host_alloc;
  rt_wrapped.cudaFree = rt_free;
  rt_wrapped.cudaFreeAsync = rt_free_async;
  rt_wrapped.cudaFreeAsync_ptsz = rt_free_async_ptsz;
  rt_wrapped.cudaFreeHost = rt_free_host;
  return &rt_wrapped;
}

static unsigned (*get_last)(void);

/* Passthrough on the stand-in runtime, loaded where the shim looks for the
 * real one, its last error cleared. */
static void runtime_passthrough(void) {
  cr_assert_not_null(dlopen(MP_STAND_RUNTIME, RTLD_NOW | RTLD_GLOBAL), "%s",
                     dlerror());
  passthrough_mode();
  *(void **)&get_last = dlsym(RTLD_DEFAULT, "cudaGetLastError");
  cr_assert_not_null(get_last);
  (void)get_last();
}

typedef enum {
  MALLOC,
  MALLOC_ASYNC,
  MALLOC_ASYNC_PTSZ,
  MALLOC_HOST,
  HOST_ALLOC
} rt_call_t;

static void refused_runtime_alloc(rt_call_t call) {
  bool device = call != MALLOC_HOST && call != HOST_ALLOC;
  size_t was = driver_free();
  void *p = NULL;
  mp__cudaerr r = 0;
  refuse_table_puts = 1;
  switch (call) {
  case MALLOC: r = cudaMalloc(&p, 1u << 20); break;
  case MALLOC_ASYNC: r = cudaMallocAsync(&p, 1u << 20, NULL); break;
  case MALLOC_ASYNC_PTSZ: r = cudaMallocAsync_ptsz(&p, 1u << 20, NULL); break;
  case MALLOC_HOST: r = cudaMallocHost(&p, 1u << 20); break;
  case HOST_ALLOC: r = cudaHostAlloc(&p, 1u << 20, 0); break;
  }
  refuse_table_puts = 0;
  cr_assert_eq(refused, 1, "the table's put was not refused");
  cr_assert_not_null(rt_handed, "the runtime handed out nothing");
  cr_expect_eq(r, MEMORY_ALLOCATION, "answered %u", r);
  cr_expect_null(p, "a pointer was handed out: %p", p);
  cr_expect_eq(rt_back, rt_handed,
               "the runtime's block %p was not given back to it", rt_handed);
  unsigned last = get_last();
  cr_expect_eq(last, MEMORY_ALLOCATION, "the runtime's last error: %u", last);
  if (r == 0 && p != NULL) /* the program's: freed as it would */
    cr_expect_eq(device ? cudaFree(p) : cudaFreeHost(p), 0);
  if (device)
    cr_expect_eq(driver_free(), was, "the driver's free memory is not back");
  report_refused(device ? 1 : 0);
}

Test(preload_real_alloc_untracked_gives_block_back, cudaMalloc,
     .init = runtime_passthrough) {
  refused_runtime_alloc(MALLOC);
}

Test(preload_real_alloc_untracked_gives_block_back, cudaMallocAsync,
     .init = runtime_passthrough) {
  refused_runtime_alloc(MALLOC_ASYNC);
}

Test(preload_real_alloc_untracked_gives_block_back, cudaMallocAsync_ptsz,
     .init = runtime_passthrough) {
  refused_runtime_alloc(MALLOC_ASYNC_PTSZ);
}

Test(preload_real_alloc_untracked_gives_block_back, cudaMallocHost,
     .init = runtime_passthrough) {
  refused_runtime_alloc(MALLOC_HOST);
}

Test(preload_real_alloc_untracked_gives_block_back, cudaHostAlloc,
     .init = runtime_passthrough) {
  refused_runtime_alloc(HOST_ALLOC);
}
