/* test_cuda_defrag_known_stream_queries.c - mp_pool_defragment on a
 * stream the pool already holds in its stream table asks the driver
 * nothing about that stream: the pool learnt it live (mp__stream_add asked
 * the device then) and forgets it when it is destroyed (mp_stream_forget,
 * device.h), so the check that every defragmentation made before
 * (mp__stream_check: cuStreamIsCapturing, cuStreamGetFlags and
 * cuStreamGetCtx, for each call and, with arenas, once more per arena) is
 * left out; so is the one of the stream mp_pool_freeze makes for itself.
 * A stream the pool does not know is still checked: a destroyed one is
 * MP_EINVAL, and the pool does not learn it. */
#include <stdbool.h>
#include <string.h>

#include <cuda.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "fakecuda_test.h"

#define MiB ((size_t)1 << 20)

/* The driver calls that ask about a stream's state or kind. */
static long long stream_questions(void) {
  return fk_calls("cuStreamIsCapturing") + fk_calls("cuStreamGetFlags") +
         fk_calls("cuStreamGetCtx");
}

/* A pool (conf: its configuration) that has met stream s: a block
 * allocated on it and freed. */
static mp_pool_t *pool_knowing(mp_device_t *dev, const char *conf,
                               mp_stream_t s) {
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_assert_eq(mp_pool_config_parse(&cfg, conf), MP_OK, "%s", mp_last_error());
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(dev, &cfg, &pool), MP_OK, "%s", mp_last_error());
  void *p = NULL;
  cr_assert_eq(mp_pool_alloc(pool, MiB, s, &p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  return pool;
}

/* Defragments pool on s, which it knows, three times: MP_OK, nothing
 * moved, and (on the fake driver) no question about a stream asked. */
static void defragment_asks_nothing(mp_pool_t *pool, mp_stream_t s) {
  long long before = fk_is_real() ? 0 : stream_questions();
  for (int i = 0; i < 3; i++) {
    size_t moved = 77;
    cr_assert_eq(mp_pool_defragment(pool, s, &moved), MP_OK, "%s",
                 mp_last_error());
    cr_expect_eq(moved, 0);
  }
  if (!fk_is_real())
    cr_expect_eq(stream_questions() - before, 0,
                 "%lld driver questions about a known stream in three "
                 "defragmentations",
                 stream_questions() - before);
}

static void known_stream(const char *conf) {
  mp_device_t *dev = open_dev("cuda");
  mp_stream_t s = NULL;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  mp_pool_t *pool = pool_knowing(dev, conf, s);
  defragment_asks_nothing(pool, s);
  cr_assert_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

Test(cuda_defrag_known_stream_queries, a_known_stream_is_not_asked_again) {
  known_stream("virtual=0");
}

Test(cuda_defrag_known_stream_queries,
     a_known_stream_is_not_asked_again_with_arenas) {
  known_stream("virtual=0,arenas=2");
}

/* The freeze's own stream, made for it, is not asked what it is either
 * (cuStreamGetFlags, cuStreamGetCtx; the capture query of its destroy,
 * mp_stream_destroy's, and of its copies, made only when a block moves,
 * are not the check's). */
static long long kind_questions(void) {
  return fk_calls("cuStreamGetFlags") + fk_calls("cuStreamGetCtx");
}

Test(cuda_defrag_known_stream_queries, a_freeze_asks_nothing_of_its_stream) {
  mp_device_t *dev = open_dev("cuda");
  mp_pool_t *pool = pool_knowing(dev, "virtual=0", NULL);
  long long before = fk_is_real() ? 0 : kind_questions();
  cr_assert_eq(mp_pool_freeze(pool), MP_OK, "%s", mp_last_error());
  if (!fk_is_real())
    cr_expect_eq(kind_questions() - before, 0,
                 "%lld driver questions about the freeze's own stream",
                 kind_questions() - before);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

/* A stream the pool never met is still checked: one of another device's
 * context (refused by its context, as test_cuda_stream_handles shows for
 * an allocation) is MP_EINVAL with nothing moved, with and without
 * arenas, and the pool does not learn it. */
Test(cuda_defrag_known_stream_queries, an_unknown_bad_stream_is_refused) {
  if (!fk_is_real())
    setenv("FAKECUDA_DEVICE_COUNT", "2", 1);
  mp_device_t *dev = open_dev("cuda:0"), *dev1 = NULL;
  if (mp_device_open("cuda:1", &dev1) != MP_OK) {
    mp_device_close(dev);
    cr_skip_test("one GPU");
  }
  mp_stream_t other = NULL;
  cr_assert_eq(mp_stream_create(dev1, &other), MP_OK, "%s", mp_last_error());
  const char *confs[] = {"virtual=0", "virtual=0,arenas=2"};
  for (int i = 0; i < 2; i++) {
    mp_pool_t *pool = pool_knowing(dev, confs[i], NULL);
    size_t moved = 77;
    cr_expect_eq(mp_pool_defragment(pool, other, &moved), MP_EINVAL, "%s",
                 confs[i]);
    cr_expect_neq(strstr(mp_last_error(), "not a live stream"), NULL, "%s",
                  mp_last_error());
    cr_expect_eq(moved, 0);
    /* Not learnt: adding it is refused as before, not found known. */
    cr_expect_eq(mp_pool_add_stream(pool, other), MP_EINVAL);
    cr_assert_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
    cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  }
  cr_assert_eq(mp_stream_destroy(dev1, other), MP_OK, "%s", mp_last_error());
  mp_device_close(dev1);
  mp_device_close(dev);
}
