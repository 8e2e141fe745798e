/* test_preload_device_alloc_untracked_gives_block_back.c - a device
 * allocation the pool serves but the shim's table of pointers has no room
 * to record (host memory ran out for its entry) is out of memory
 * (CUDA_ERROR_OUT_OF_MEMORY; cudaErrorMemoryAllocation, the runtime's last
 * error too), and the block goes back to the pool: unrecorded, it was
 * neither the program's (its free would be refused as a pointer in the
 * pool's memory the pool never handed out) nor the pool's. The pool is as
 * before the call: the same bytes allocated, requested and reserved, the
 * same live blocks, and the next allocation of the size gets the block.
 * As test_preload_pinned_alloc_untracked_gives_block_back.c for the
 * page-locked host pool. The shim's sources run in this process on the
 * fake driver and the stand-in runtime (stand_runtime.c, which keeps a last
 * error); the table's puts fail when asked (refuse_table_puts.h). */
#include <stdint.h>

#include "in_process.h"
#include "refuse_table_puts.h"

static unsigned (*get_last)(void);

static void cuda_mode(void) {
  cr_assert_not_null(dlopen(MP_STAND_RUNTIME, RTLD_NOW | RTLD_GLOBAL), "%s",
                     dlerror());
  mp_in_process_cuda();
  *(void **)&get_last = dlsym(RTLD_DEFAULT, "cudaGetLastError");
  cr_assert_not_null(get_last);
  (void)get_last(); /* whatever the start left */
}

/* The pool's figures the refused allocation must leave as they were. */
typedef struct {
  size_t allocated, requested, reserved;
  uint64_t live, oom;
} figures_t;

static figures_t figures(void) {
  mp_pool_t *pool = mp__pl_pool_here(mp__pl_get());
  cr_assert_not_null(pool);
  mp_stats_t s = {.struct_size = sizeof s};
  cr_assert_eq(mp_pool_get_stats(pool, &s), MP_OK);
  return (figures_t){.allocated = s.allocated_bytes,
                     .requested = s.requested_bytes,
                     .reserved = s.reserved_bytes,
                     .live = s.live_blocks,
                     .oom = s.oom_count};
}

static void figures_unchanged(figures_t was, const char *what) {
  figures_t now = figures();
  cr_expect_eq(now.allocated, was.allocated, "%s: allocated %zu, was %zu", what,
               now.allocated, was.allocated);
  cr_expect_eq(now.requested, was.requested, "%s: requested %zu, was %zu", what,
               now.requested, was.requested);
  cr_expect_eq(now.reserved, was.reserved, "%s: reserved %zu, was %zu", what,
               now.reserved, was.reserved);
  cr_expect_eq(now.live, was.live, "%s: %llu live blocks, were %llu", what,
               (unsigned long long)now.live, (unsigned long long)was.live);
  cr_expect_eq(now.oom, was.oom, "%s: oom_count %llu, was %llu", what,
               (unsigned long long)now.oom, (unsigned long long)was.oom);
}

/* A block served from the pool's cache: one of size made and freed. */
static mp__cuptr warm(size_t size) {
  mp__cuptr a = 0;
  cr_assert_eq(cuMemAlloc_v2(&a, size), MP__CU_SUCCESS);
  cr_assert_eq(cuMemFree_v2(a), MP__CU_SUCCESS);
  return a;
}

/* The call of variant v: the driver's cuMemAlloc_v2, cuMemAllocAsync and
 * its _ptsz form, the runtime's cudaMalloc and cudaMallocAsync; *d its
 * pointer (0 when none), the driver's answer or the runtime's. */
enum {
  MEM_ALLOC,
  MEM_ALLOC_ASYNC,
  MEM_ALLOC_ASYNC_PTSZ,
  RT_MALLOC,
  RT_MALLOC_ASYNC
};

static unsigned call(int v, size_t size, mp__cuptr *d) {
  void *p = NULL;
  unsigned r;
  switch (v) {
  case MEM_ALLOC: return cuMemAlloc_v2(d, size);
  case MEM_ALLOC_ASYNC: return cuMemAllocAsync(d, size, NULL);
  case MEM_ALLOC_ASYNC_PTSZ: return cuMemAllocAsync_ptsz(d, size, NULL);
  case RT_MALLOC: r = cudaMalloc(&p, size); break;
  default: r = cudaMallocAsync(&p, size, NULL); break;
  }
  *d = (mp__cuptr)(uintptr_t)p;
  return r;
}

/* Frees d, variant v's allocation, with the matching free. */
static unsigned call_free(int v, mp__cuptr d) {
  void *p = (void *)(uintptr_t)d;
  switch (v) {
  case MEM_ALLOC: return cuMemFree_v2(d);
  case MEM_ALLOC_ASYNC: return cuMemFreeAsync(d, NULL);
  case MEM_ALLOC_ASYNC_PTSZ: return cuMemFreeAsync_ptsz(d, NULL);
  case RT_MALLOC: return cudaFree(p);
  default: return cudaFreeAsync(p, NULL);
  }
}

/* The next allocation of size by variant v (on the refused call's stream:
 * the block went back stream-ordered there, reusable on another stream
 * only once a marker of that stream's work is seen done, which the
 * device's timing decides) gets block a again, and it frees. */
static void served_again(int v, mp__cuptr a, size_t size, const char *what) {
  mp__cuptr c = 0;
  cr_assert_eq(call(v, size, &c), MP__CU_SUCCESS);
  cr_expect_eq(c, a,
               "%s: the block was not given back to the pool (%#llx, "
               "not %#llx)",
               what, (unsigned long long)c, (unsigned long long)a);
  cr_expect_eq(call_free(v, c), MP__CU_SUCCESS);
}

/* Variant v's allocation refused for want of the table's entry: out of
 * memory (the runtime's code in its last error too, runtime.c), no pointer,
 * and the block back in the pool. */
static void refused_call(int v, const char *what) {
  bool runtime = v >= RT_MALLOC;
  size_t size = 4096u << v;
  mp__cuptr a = warm(size);
  figures_t was = figures();
  mp__cuptr d = 0;
  refuse_table_puts = 1;
  unsigned r = call(v, size, &d);
  refuse_table_puts = 0;
  cr_assert_eq(refused, 1, "%s: the table's put was not refused", what);
  unsigned want = runtime ? MP__CUDA_MEMORY_ALLOCATION : MP__CU_OUT_OF_MEMORY;
  cr_expect_eq(r, want, "%s answered %u", what, r);
  cr_expect_eq(d, 0, "%s: a pointer was handed out: %#llx", what,
               (unsigned long long)d);
  unsigned last = runtime ? get_last() : want;
  cr_expect_eq(last, want, "%s: cudaGetLastError said %u", what, last);
  figures_unchanged(was, what);
  served_again(v, a, size, what);
}

#define REFUSED(name, v)                                                       \
  Test(preload_device_alloc_untracked_gives_block_back, name,                  \
       .init = cuda_mode) {                                                    \
    refused_call(v, #name);                                                    \
  }

REFUSED(cuMemAlloc_v2, MEM_ALLOC)
REFUSED(cuMemAllocAsync, MEM_ALLOC_ASYNC)
REFUSED(cuMemAllocAsync_ptsz, MEM_ALLOC_ASYNC_PTSZ)
REFUSED(cudaMalloc, RT_MALLOC)
REFUSED(cudaMallocAsync, RT_MALLOC_ASYNC)
