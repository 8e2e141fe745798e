/* test_cuda_stream_handles.c - the stream handles a pool takes on the cuda
 * backend. The driver is asked (cuStreamGetFlags, once per new handle) where
 * it can tell: a handle it never made, or one destroyed, is
 * CUDA_ERROR_INVALID_HANDLE from the fake driver (as cuda.h lists), and the
 * pool refuses it with MP_EINVAL and nothing changed instead of taking it
 * (it used to be MP_OK, and the first event recorded on it failed later,
 * unseen). A real driver may not survive such a handle (undefined
 * behaviour), so the GPU twin runs only the live-handle case. */
#include <cuda.h>
#include <string.h>

#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "fakecuda_test.h"

static long long fk_bad_handles(void) {
  long long (*count)(CUresult);
  FK_LOAD(count, "cuFakeGetErrorCount");
  return count(CUDA_ERROR_INVALID_HANDLE);
}

static mp_pool_t *make_cuda_pool(mp_device_t *dev) {
  mp_pool_t *p = NULL;
  cr_assert_eq(mp_pool_create(dev, NULL, &p), MP_OK, "%s", mp_last_error());
  return p;
}

/* h is refused by a pool that has one live block on the default stream,
 * and the pool is as it was. */
static void expect_refused(mp_device_t *dev, mp_stream_t h) {
  mp_pool_t *p = make_cuda_pool(dev);
  void *kept = NULL;
  cr_assert_eq(mp_pool_alloc(p, 4096, NULL, &kept), MP_OK);
  mp_stats_t before, after;
  cr_assert_eq(mp_pool_get_stats(p, &before), MP_OK);
  long long bad = fk_bad_handles();
  int sentinel;
  void *out = &sentinel;
  cr_expect_eq(mp_pool_alloc(p, 4096, h, &out), MP_EINVAL,
               "a handle the driver calls invalid was taken");
  cr_expect(strstr(mp_last_error(), "not a live stream") != NULL, "%s",
            mp_last_error());
  cr_expect_gt(fk_bad_handles(), bad,
               "the driver was never asked (or did not say invalid handle)");
  cr_expect_eq(out, &sentinel, "the output was written");
  cr_expect_eq(mp_pool_add_stream(p, h), MP_EINVAL);
  mp_handle_t *mh = NULL;
  cr_expect_eq(mp_pool_alloc_movable(p, 4096, h, &mh), MP_EINVAL);
  cr_expect_null(mh);
  cr_assert_eq(mp_pool_get_stats(p, &after), MP_OK);
  cr_expect_eq(after.reserved_bytes, before.reserved_bytes);
  cr_expect_eq(after.allocated_bytes, before.allocated_bytes);
  cr_expect_eq(after.alloc_count, before.alloc_count);
  cr_expect_eq(mp_pool_check(p), MP_OK, "%s", mp_last_error());
  /* The pool still works, and nothing it does later trips on h. */
  bad = fk_bad_handles();
  void *more = NULL;
  cr_expect_eq(mp_pool_alloc(p, 4096, NULL, &more), MP_OK);
  cr_expect_eq(mp_pool_free(p, more), MP_OK);
  cr_expect_eq(mp_pool_free(p, kept), MP_OK);
  cr_expect_eq(mp_pool_trim(p, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(fk_bad_handles(), bad, "the pool used the refused handle");
  cr_expect_eq(mp_pool_destroy(p), MP_OK);
}

Test(cuda_stream_handles, a_handle_the_driver_never_made_is_refused) {
  if (fk_is_real())
    cr_skip_test("a handle no driver made is undefined behaviour on a GPU");
  mp_device_t *dev = open_dev("cuda");
  int not_a_stream;
  expect_refused(dev, (mp_stream_t)&not_a_stream);
  mp_device_close(dev);
}

Test(cuda_stream_handles, a_destroyed_stream_is_refused) {
  if (fk_is_real())
    cr_skip_test("a destroyed handle is undefined behaviour on a GPU");
  /* The fake answers it instead of stopping the process. */
  setenv("FAKECUDA_DEAD_STREAMS", "refuse", 1);
  mp_device_t *dev = open_dev("cuda");
  mp_stream_t s = NULL;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  expect_refused(dev, s);
  /* A query that cannot tell whether the stream captures fails with a
   * message; it does not say "busy" (a poll would spin on it). */
  cr_expect_eq(mp_stream_query(dev, s), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "cuStreamIsCapturing") != NULL, "%s",
            mp_last_error());
  cr_expect_eq(mp_stream_destroy(dev, s), MP_EINVAL, "destroyed twice");
  mp_device_close(dev);
}

/* Live handles: a created stream and the default streams by every name. */
Test(cuda_stream_handles, live_and_default_streams_are_taken) {
  mp_device_t *dev = open_dev("cuda");
  mp_stream_t s = NULL;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  mp_pool_t *p = make_cuda_pool(dev);
  mp_stream_t hs[] = {s, NULL, (mp_stream_t)CU_STREAM_LEGACY,
                      (mp_stream_t)CU_STREAM_PER_THREAD};
  long long asked = fk_is_real() ? 0 : fk_calls("cuStreamGetFlags");
  for (int round = 0; round < 2; round++)
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) {
      void *a = NULL;
      cr_assert_eq(mp_pool_alloc(p, 4096, hs[i], &a), MP_OK, "stream %zu: %s",
                   i, mp_last_error());
      cr_assert_eq(mp_pool_free(p, a), MP_OK);
    }
  /* Asked once, for the one handle that names no default stream. */
  if (!fk_is_real())
    cr_expect_eq(fk_calls("cuStreamGetFlags") - asked, 1);
  cr_expect_eq(mp_pool_check(p), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_destroy(p), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

/* A stream of another device's context: the driver answers
 * cuStreamGetFlags for it (an H200 did, 2026-11-28, and the fake now
 * does), but the pool's events cannot be recorded on it and a
 * synchronization of the pool's context does not wait for it, so it is
 * refused by its context (cuStreamGetCtx), and the pool is as it was. */
Test(cuda_stream_handles, a_stream_of_another_device_is_refused) {
  if (!fk_is_real())
    setenv("FAKECUDA_DEVICE_COUNT", "2", 1);
  mp_device_t *dev0 = open_dev("cuda:0"), *dev1 = NULL;
  if (mp_device_open("cuda:1", &dev1) != MP_OK) {
    mp_device_close(dev0);
    cr_skip_test("one GPU");
  }
  mp_stream_t s1 = NULL;
  cr_assert_eq(mp_stream_create(dev1, &s1), MP_OK, "%s", mp_last_error());
  mp_pool_t *p = make_cuda_pool(dev0);
  int sentinel;
  void *out = &sentinel;
  cr_expect_eq(mp_pool_alloc(p, 4096, s1, &out), MP_EINVAL,
               "another device's stream was taken");
  cr_expect(strstr(mp_last_error(), "not a live stream") != NULL, "%s",
            mp_last_error());
  cr_expect_eq(out, &sentinel, "the output was written");
  cr_expect_eq(mp_pool_add_stream(p, s1), MP_EINVAL);
  mp_stats_t st;
  cr_assert_eq(mp_pool_get_stats(p, &st), MP_OK);
  cr_expect_eq(st.alloc_count, 0);
  cr_expect_eq(st.reserved_bytes, 0);
  /* Its own device's pool takes it. */
  mp_pool_t *p1 = make_cuda_pool(dev1);
  void *a = NULL;
  cr_expect_eq(mp_pool_alloc(p1, 4096, s1, &a), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_free(p1, a), MP_OK);
  cr_expect_eq(mp_pool_destroy(p1), MP_OK);
  cr_expect_eq(mp_pool_destroy(p), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev1, s1), MP_OK, "%s", mp_last_error());
  mp_device_close(dev1);
  mp_device_close(dev0);
}
