/* test_preload_trace_per_thread_stream.c - a stream-ordered call of a
 * _ptsz entry point (what cuda.h maps a call to under
 * CUDA_API_PER_THREAD_DEFAULT_STREAM) on the NULL stream is traced
 * (MEMPOOL_TRACE) on the per-thread default stream, CU_STREAM_PER_THREAD's
 * 2, as the pool serves it (mp__pl_stream), not as the legacy stream's 0:
 * a replay runs each traced stream on a stream of its own, ordered apart.
 * The legacy stream is 0 however it is named (NULL outside a _ptsz call,
 * CU_STREAM_LEGACY anywhere). Before, a _ptsz call's NULL was traced as 0.
 * Allocations and frees of the driver (cuMemAllocAsync_ptsz,
 * cuMemFreeAsync_ptsz) and of the runtime (cudaMallocAsync_ptsz,
 * cudaFreeAsync_ptsz, on the stand-in runtime), served by the pool or,
 * in passthrough mode, by the real driver; and a graph's output allocated
 * by cuGraphLaunch_ptsz. The shim's sources run in this process on the
 * fake driver. */
#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>

#include "graph_output.h"

#define PER_THREAD ((mp__custream)0x2) /* CU_STREAM_PER_THREAD */
#define LEGACY     ((mp__custream)0x1) /* CU_STREAM_LEGACY */

static char trace_path[96];

/* The trace at a new path, the stand-in runtime loaded; mode: "pool" or
 * "passthrough". */
static void traced(const char *mode) {
  cr_assert_not_null(dlopen(MP_STAND_RUNTIME, RTLD_NOW | RTLD_GLOBAL), "%s",
                     dlerror());
  mp_in_process_trace_to(trace_path, sizeof trace_path, "ptsz");
  setenv("MEMPOOL_DEVICE", "cuda", 1);
  setenv("MEMPOOL_PRELOAD", mode, 1);
  unsetenv("MEMPOOL_CONF");
  (void)mp_in_process_context();
  const mp__pl_t *pl = mp__pl_get();
  cr_assert_eq(pl->mode,
               strcmp(mode, "pool") == 0 ? MP__PL_POOL : MP__PL_PASSTHROUGH);
}

static void traced_pool(void) {
  traced("pool");
}

static void traced_passthrough(void) {
  traced("passthrough");
}

static void untraced(void) {
  unlink(trace_path);
}

/* The Stream column of the trace's last row of action on ptr; -1 when
 * there is none. */
static long traced_stream(const char *action, uintptr_t ptr) {
  FILE *f = fopen(trace_path, "r");
  cr_assert_not_null(f, "%s: %s", trace_path, strerror(errno));
  char line[256], want[96];
  snprintf(want, sizeof want, ",%s,%#lx,", action, (unsigned long)ptr);
  long stream = -1;
  while (fgets(line, sizeof line, f) != NULL) {
    char *at = strstr(line, want);
    char *last = strrchr(line, ',');
    if (at != NULL && last != NULL)
      stream = strtol(last + 1, NULL, 10);
  }
  fclose(f);
  return stream;
}

static void expect_traced_on(uintptr_t ptr, long stream, const char *what) {
  long a = traced_stream("allocate", ptr), f = traced_stream("free", ptr);
  cr_expect_eq(a, stream, "%s: allocation traced on stream %ld, not %ld", what,
               a, stream);
  cr_expect_eq(f, stream, "%s: free traced on stream %ld, not %ld", what, f,
               stream);
}

/* Allocated and freed by the driver's call on s (ptsz: the _ptsz forms),
 * traced on stream want. */
static void driver_on(mp__custream s, bool ptsz, long want, const char *what) {
  mp__cuptr d = 0;
  cr_assert_eq(ptsz ? cuMemAllocAsync_ptsz(&d, 4096, s)
                    : cuMemAllocAsync(&d, 4096, s),
               MP__CU_SUCCESS, "%s", what);
  cr_assert_eq(ptsz ? cuMemFreeAsync_ptsz(d, s) : cuMemFreeAsync(d, s),
               MP__CU_SUCCESS, "%s", what);
  expect_traced_on((uintptr_t)d, want, what);
}

/* The same through the runtime's _ptsz forms. */
static void runtime_on(mp__custream s, long want, const char *what) {
  void *p = NULL;
  cr_assert_eq(cudaMallocAsync_ptsz(&p, 4096, s), MP__CUDA_SUCCESS, "%s", what);
  cr_assert_eq(cudaFreeAsync_ptsz(p, s), MP__CUDA_SUCCESS, "%s", what);
  expect_traced_on((uintptr_t)p, want, what);
}

static void streams_traced(void) {
  driver_on(NULL, true, 2, "cuMemAllocAsync_ptsz on NULL");
  driver_on(PER_THREAD, false, 2, "cuMemAllocAsync on CU_STREAM_PER_THREAD");
  driver_on(NULL, false, 0, "cuMemAllocAsync on NULL");
  driver_on(LEGACY, false, 0, "cuMemAllocAsync on CU_STREAM_LEGACY");
  driver_on(LEGACY, true, 0, "cuMemAllocAsync_ptsz on CU_STREAM_LEGACY");
  runtime_on(NULL, 2, "cudaMallocAsync_ptsz on NULL");
  runtime_on(LEGACY, 0, "cudaMallocAsync_ptsz on cudaStreamLegacy");
}

Test(preload_trace_per_thread_stream, pool_calls, .init = traced_pool,
     .fini = untraced) {
  streams_traced();
}

Test(preload_trace_per_thread_stream, passthrough_calls,
     .init = traced_passthrough, .fini = untraced) {
  streams_traced();
}

/* A graph's output, allocated by each launch: by cuGraphLaunch_ptsz on
 * NULL, on the per-thread stream. */
Test(preload_trace_per_thread_stream, graph_launch_output, .init = traced_pool,
     .fini = untraced) {
  mp__custream s = NULL;
  mp__cuptr out = 0;
  mp__cugraphexec x = mp_exec_with_output(&s, &out, NULL);
  cr_assert_eq(cuGraphLaunch_ptsz(x, NULL), MP__CU_SUCCESS);
  cr_assert_eq(cuMemFreeAsync_ptsz(out, NULL), MP__CU_SUCCESS);
  expect_traced_on((uintptr_t)out, 2, "cuGraphLaunch_ptsz on NULL");
  cr_assert_eq(cuGraphLaunch(x, s), MP__CU_SUCCESS);
  cr_assert_eq(cuMemFreeAsync(out, s), MP__CU_SUCCESS);
  expect_traced_on((uintptr_t)out, (long)(uintptr_t)s, "cuGraphLaunch on s");
  cr_expect_eq(cuGraphExecDestroy(x), 0);
  cr_expect_eq(cuStreamDestroy_v2(s), 0);
}
