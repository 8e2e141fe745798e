/* test_preload_rt_own_calls_mode_refused.c - the runtime calls the shim
 * makes of its own beside a runtime call it serves (runtime.c's
 * mp__rt_start_thread: cudaFree(NULL), which starts the runtime on a
 * thread; host.c's mp__pl_rt_set_last_error: a cudaMalloc the runtime
 * refuses as the shim did, for its last error) are potentially unsafe
 * (cuda.h, cuThreadExchangeStreamCaptureMode: "prohibited from potentially
 * unsafe API calls"), so they are made in relaxed capture mode. Where the
 * driver refuses the switch to relaxed mode (cuFakeRefuse) while a capture
 * is begun, they are not made: in the caller's mode a global-mode capture
 * prohibits them, and the driver invalidates it.
 *
 * Before, both were made in the caller's mode: the cudaMalloc of SIZE_MAX
 * (the stand-in runtime's cuMemAlloc, refused by the fake as unsafe)
 * invalidated the program's own global capture, and the cudaFree(NULL)
 * was made (counted here: the stand-in's is a no-op). The shim's sources
 * run in this process on the fake driver and the stand-in runtime
 * (stand_runtime.c); the shim's table of the runtime's calls is wrapped to
 * count cudaFree(NULL). */
#include <stdint.h>

#include "capture_fork.h"
#include "refuse_table_puts.h"

#define UNKNOWN 999u /* cuda.h, CUDA_ERROR_UNKNOWN */

const mp__real_cudart_t *__real_mp__pl_real_cudart(void);
const mp__real_cudart_t *__wrap_mp__pl_real_cudart(void);

static mp__real_cudart_t wrapped;
static int null_frees; /* cudaFree(NULL) calls the shim made */

static mp__cudaerr counting_free(void *p) {
  if (p == NULL)
    null_frees++;
  return __real_mp__pl_real_cudart()->cudaFree(p);
}

const mp__real_cudart_t *__wrap_mp__pl_real_cudart(void) {
  const mp__real_cudart_t *real = __real_mp__pl_real_cudart();
  if (real->cudaFree == NULL)
    return real;
  wrapped = *real;
  wrapped.cudaFree = counting_free;
  return &wrapped;
}

static void cuda_mode(void) {
  unsetenv("MEMPOOL_TRACE");
  cr_assert_not_null(dlopen(MP_STAND_RUNTIME, RTLD_NOW | RTLD_GLOBAL), "%s",
                     dlerror());
  mp_in_process_cuda();
}

static void mode_switch_refused(unsigned code) {
  bool (*refuse)(const char *, int, long) = NULL;
  *(void **)&refuse = fake("cuFakeRefuse");
  cr_assert(
      refuse("cuThreadExchangeStreamCaptureMode", (int)code, code ? -1 : 0));
}

/* A non-blocking stream of the current context. */
static mp__custream stream(void) {
  mp__custream s = NULL;
  cr_assert_eq(cuStreamCreate(&s, 1 /* CU_STREAM_NON_BLOCKING */), 0);
  return s;
}

/* c's capture ended: the driver's answer (the graph destroyed). */
static mp__curesult end_capture(mp__custream c) {
  mp__cugraph g = NULL;
  mp__curesult e = cuStreamEndCapture(c, &g);
  if (e == 0)
    cr_expect_eq(cuGraphDestroy(g), 0);
  return e;
}

/* A cudaMallocAsync on stream s that the pool serves but the shim answers
 * out of memory (its table of pointers refused the entry), while this
 * thread captures on c in global mode and the switch to relaxed mode is
 * refused: the shim's cudaMalloc for the runtime's last error is not made,
 * and the capture stays valid. */
Test(preload_rt_own_calls_mode_refused, last_error_probe_not_made,
     .init = cuda_mode) {
  mp__custream s = stream(), c = stream();
  void *p = NULL;
  /* The thread started and the pool warm on s, before the capture. */
  cr_assert_eq(cudaMallocAsync(&p, 4096, s), 0);
  cr_assert_eq(cudaFreeAsync(p, s), 0);
  cr_assert_eq(null_frees, 1, "the thread was not started");
  cr_assert_eq(cuStreamBeginCapture_v2(c, 0 /* GLOBAL */), 0);
  mode_switch_refused(UNKNOWN);
  refuse_table_puts = 1;
  p = NULL;
  mp__cudaerr r = cudaMallocAsync(&p, 4096, s);
  refuse_table_puts = 0;
  mode_switch_refused(0);
  cr_assert_eq(refused, 1, "the table's put was not refused");
  cr_expect_eq(r, MP__CUDA_MEMORY_ALLOCATION, "the allocation answered %u", r);
  cr_expect_null(p);
  mp__curesult e = end_capture(c);
  cr_expect_eq(e, 0, "the capture ended %u: the shim's probe invalidated it",
               e);
  cr_expect_eq(cuStreamDestroy_v2(s), 0);
  cr_expect_eq(cuStreamDestroy_v2(c), 0);
}

/* The thread's first runtime call the pool serves, while this thread
 * captures on c in global mode and the switch to relaxed mode is refused:
 * no cudaFree(NULL), the capture stays valid; the next call, once the
 * switch is allowed again, starts the thread. */
Test(preload_rt_own_calls_mode_refused, start_deferred, .init = cuda_mode) {
  mp__custream s = stream(), c = stream();
  mp__cuptr d = 0;
  /* The pool warm on s through the driver's calls (no runtime start). */
  cr_assert_eq(cuMemAllocAsync(&d, 4096, s), 0);
  cr_assert_eq(cuMemFreeAsync(d, s), 0);
  cr_assert_eq(null_frees, 0);
  cr_assert_eq(cuStreamBeginCapture_v2(c, 0 /* GLOBAL */), 0);
  mode_switch_refused(UNKNOWN);
  void *p = NULL;
  mp__cudaerr r = cudaMallocAsync(&p, 4096, s);
  mode_switch_refused(0);
  cr_expect_eq(r, 0, "the allocation answered %u", r);
  cr_expect_eq(null_frees, 0,
               "cudaFree(NULL) was made in the caller's mode during the "
               "capture");
  mp__curesult e = end_capture(c);
  cr_expect_eq(e, 0, "the capture ended %u", e);
  if (p != NULL)
    cr_expect_eq(cudaFreeAsync(p, s), 0);
  p = NULL;
  cr_expect_eq(cudaMallocAsync(&p, 4096, s), 0);
  cr_expect_eq(null_frees, 1, "the thread was not started after the capture");
  cr_expect_eq(cudaFreeAsync(p, s), 0);
  cr_expect_eq(cuStreamDestroy_v2(s), 0);
  cr_expect_eq(cuStreamDestroy_v2(c), 0);
}
