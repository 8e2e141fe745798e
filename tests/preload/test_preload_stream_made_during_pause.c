/* test_preload_stream_made_during_pause.c - a stream the program creates
 * while the pools are paused (mempool_preload_pause) is known to its
 * device's pool once they are resumed, as one created before the pause
 * is: a cuMemFree of a pool block then waits for the work queued on it
 * (README, LD_PRELOAD: "the shim hooks cuStreamCreate*"). A paused pool
 * refuses mp_pool_add_stream (mempool/pool.h, mp_pool_pause: every call
 * but a few is MP_EBUSY), and the shim dropped the refusal: after the
 * resume the stream was unknown, and a non-blocking one (all of PyTorch's)
 * was waited for by no free. A stream destroyed before the resume is not
 * added by it.
 *
 * The shim's sources run in the test's process (no LD_PRELOAD), pooling
 * on the fake driver (tests/fakecuda). */
#include "in_process.h"
#include "pool/pool_internal.h"

#define MP_NON_BLOCKING 1u /* CU_STREAM_NON_BLOCKING */

static bool known(mp__custream s) {
  mp_pool_t *pool = mp__pl_pool_first(mp__pl_get());
  cr_assert_not_null(pool, "device 0 has no pool");
  mp__pool_lock(pool);
  bool k = mp__stream_known(pool, (mp_stream_t)s);
  mp__pool_unlock(pool);
  return k;
}

/* Failed before: "the stream made during the pause is unknown". */
Test(preload_stream_made_during_pause, is_known_after_the_resume,
     .init = mp_in_process_cuda) {
  mp__custream before = NULL, during = NULL;
  cr_assert_eq(cuStreamCreate(&before, MP_NON_BLOCKING), 0);
  cr_assert_eq(mempool_preload_pause(0), 0, "pause: %s", mp_last_error());
  cr_assert_eq(cuStreamCreate(&during, MP_NON_BLOCKING), 0);
  cr_assert_eq(mempool_preload_resume(), 0, "resume: %s", mp_last_error());
  cr_expect(known(before), "the stream made before the pause is unknown");
  cr_expect(known(during), "the stream made during the pause is unknown");
  cr_expect_eq(cuStreamDestroy_v2(during), 0);
  cr_expect_not(known(during), "a destroyed stream is still known");
  cr_expect_eq(cuStreamDestroy_v2(before), 0);
}

/* Destroyed while paused: the resume leaves its dead handle alone (the
 * fake driver stops the process on a use of it). */
Test(preload_stream_made_during_pause, destroyed_before_the_resume_is_not_added,
     .init = mp_in_process_cuda) {
  mp__custream gone = NULL, kept = NULL;
  cr_assert_eq(mempool_preload_pause(0), 0, "pause: %s", mp_last_error());
  cr_assert_eq(cuStreamCreate(&gone, MP_NON_BLOCKING), 0);
  cr_assert_eq(cuStreamCreate(&kept, MP_NON_BLOCKING), 0);
  cr_assert_eq(cuStreamDestroy_v2(gone), 0);
  cr_assert_eq(mempool_preload_resume(), 0, "resume: %s", mp_last_error());
  cr_expect_not(known(gone), "the destroyed stream was added");
  cr_expect(known(kept), "the stream made during the pause is unknown");
  cr_expect_eq(cuStreamDestroy_v2(kept), 0);
}
