/* test_preload_free_capture_unknown_refused.c - a stream-ordered free
 * whose stream the driver cannot say is being captured or not (its
 * cuStreamGetCaptureInfo answers an error: cuda.h, \notefnerr, a previous
 * launch's error, CUDA_ERROR_ILLEGAL_ADDRESS for good after a kernel's
 * fault) is refused with the driver's code and frees nothing: the block
 * stays the program's, freed once the driver answers again.
 *
 * Before, the shim read the error as "not captured": a launch's output
 * freed so was marked free until the next launch (the program's later
 * free of it refused as invalid), a pool block freed on a capturing
 * stream went to the pool on that stream (its memory handed out again
 * while the capture may use it), and the free of an output inside a
 * capture was answered CUDA_ERROR_INVALID_VALUE, not the driver's code.
 * The shim's sources run in this process on the fake driver, whose
 * cuFakeRefuse makes cuStreamGetCaptureInfo_v2 (the shim's query) answer
 * 700, the sticky error's code, while every other call works; and under
 * the sticky error itself (cuFakeSetStickyError), where before a
 * stream-ordered free gave the block back to the pool and answered
 * success. */
#include "graph_output.h"

#include "mempool/status.h"

#define ILLEGAL_ADDRESS 700u /* cuda.h, CUDA_ERROR_ILLEGAL_ADDRESS */

/* cuStreamGetCaptureInfo_v2 answers code to every call (0: works again). */
static void capture_info_fails(unsigned code) {
  bool (*refuse)(const char *, int, long) = NULL;
  *(void **)&refuse = dlsym(RTLD_DEFAULT, "cuFakeRefuse");
  cr_assert_not_null(refuse, "the fake driver has no cuFakeRefuse");
  cr_assert(refuse("cuStreamGetCaptureInfo_v2", (int)code, code ? -1 : 0));
}

static void pooling(void) {
  unsetenv("MEMPOOL_TRACE");
  mp_in_process_cuda();
}

/* The last error names the refusal and the driver's code. */
static void says_unknown(void) {
  cr_expect_eq(mp_last_driver_error(), (int)ILLEGAL_ADDRESS);
  cr_expect(strstr(mp_last_error(), "cuStreamGetCaptureInfo") != NULL,
            "the last error says: %s", mp_last_error());
}

/* (a) A launch's output, held: not marked free until the next launch. */
Test(preload_free_capture_unknown_refused, held_output, .init = pooling) {
  mp__custream s = NULL;
  mp__cuptr out = 0;
  mp__cugraphexec x = mp_exec_with_output(&s, &out, NULL);
  cr_assert_eq(cuGraphLaunch(x, s), MP__CU_SUCCESS);
  capture_info_fails(ILLEGAL_ADDRESS);
  cr_expect_eq(cuMemFreeAsync(out, s), ILLEGAL_ADDRESS,
               "a free whose capture is not known was not refused");
  says_unknown();
  capture_info_fails(0);
  cr_expect_eq(cuMemFreeAsync(out, s), MP__CU_SUCCESS,
               "the output is no longer the program's");
  cr_expect_eq(cuGraphExecDestroy(x), 0);
  cr_expect_eq(cuStreamDestroy_v2(s), 0);
}

/* p freed (cuMemFreeAsync) on *s, a new stream, inside a capture begun on
 * it while cuStreamGetCaptureInfo fails: refused with the driver's code,
 * which the last error names; the capture then ended, its graph
 * destroyed. */
static void refused_in_capture(mp__cuptr p, mp__custream *s) {
  cr_assert_eq(cuStreamCreate(s, 1 /* CU_STREAM_NON_BLOCKING */), 0);
  cr_assert_eq(cuStreamBeginCapture_v2(*s, 2 /* RELAXED */), 0);
  capture_info_fails(ILLEGAL_ADDRESS);
  cr_expect_eq(cuMemFreeAsync(p, *s), ILLEGAL_ADDRESS,
               "a free whose capture is not known was not refused");
  says_unknown();
  capture_info_fails(0);
  mp__cugraph g = NULL;
  cr_assert_eq(cuStreamEndCapture(*s, &g), 0);
  cr_expect_eq(cuGraphDestroy(g), 0);
}

/* (b) A pool block freed on a capturing stream: not freed on that
 * stream, still the program's. */
Test(preload_free_capture_unknown_refused, block_on_capturing_stream,
     .init = pooling) {
  mp__custream s = NULL;
  mp__cuptr p = 0;
  cr_assert_eq(cuMemAlloc_v2(&p, 4096), 0);
  refused_in_capture(p, &s);
  cr_expect_eq(cuMemFree_v2(p), MP__CU_SUCCESS,
               "the block is no longer the program's");
  cr_expect_eq(cuStreamDestroy_v2(s), 0);
}

/* An output the program does not hold, freed inside a capture: the
 * driver's code, not CUDA_ERROR_INVALID_VALUE. */
Test(preload_free_capture_unknown_refused, output_not_held, .init = pooling) {
  mp__custream s = NULL, t = NULL;
  mp__cuptr out = 0;
  mp__cugraphexec x = mp_exec_with_output(&s, &out, NULL);
  cr_assert_eq(cuGraphLaunch(x, s), MP__CU_SUCCESS);
  cr_assert_eq(cuMemFreeAsync(out, s), MP__CU_SUCCESS);
  refused_in_capture(out, &t);
  cr_expect_eq(cuGraphExecDestroy(x), 0);
  cr_expect_eq(cuStreamDestroy_v2(t), 0);
  cr_expect_eq(cuStreamDestroy_v2(s), 0);
}

/* Every later call answers the sticky error (cuFakeSetStickyError), as
 * after a kernel's fault: 0 clears it. */
static void sticky(unsigned code) {
  void (*set)(int) = NULL;
  *(void **)&set = dlsym(RTLD_DEFAULT, "cuFakeSetStickyError");
  cr_assert_not_null(set, "the fake driver has no cuFakeSetStickyError");
  set((int)code);
}

/* Under a sticky error, a stream-ordered free of a pool block on a
 * stream the driver says nothing of: the driver's code, the block kept. */
Test(preload_free_capture_unknown_refused, sticky_error, .init = pooling) {
  mp__custream s = NULL;
  mp__cuptr p = 0;
  cr_assert_eq(cuStreamCreate(&s, 1 /* CU_STREAM_NON_BLOCKING */), 0);
  cr_assert_eq(cuMemAllocAsync(&p, 4096, s), 0);
  sticky(ILLEGAL_ADDRESS);
  cr_expect_eq(cuMemFreeAsync(p, s), ILLEGAL_ADDRESS,
               "a free whose capture is not known was not refused");
  sticky(0);
  cr_expect_eq(cuMemFreeAsync(p, s), MP__CU_SUCCESS,
               "the block is no longer the program's");
  cr_expect_eq(cuStreamDestroy_v2(s), 0);
}
