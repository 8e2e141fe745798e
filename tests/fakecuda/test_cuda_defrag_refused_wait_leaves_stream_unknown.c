/* test_cuda_defrag_refused_wait_leaves_stream_unknown.c - a
 * mp_pool_defragment with blocks to move, refused at its wait for the
 * pool's streams (another stream the pool knows is being captured without
 * its knowledge: MP_EBUSY, nothing moved), must not leave its copy stream
 * in the pool's stream table. Every later synchronization waits for a
 * stream there and is refused while it is captured
 * (mp__streams_unwaitable): a trim during a later capture of that stream
 * was MP_EBUSY although the pool never queued anything on it. */
#include <stdbool.h>
#include <string.h>

#include <cuda.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "capture_beside.h"
#include "fakecuda_test.h"

#define MiB ((size_t)1 << 20)

/* The pool's reserved bytes (stats.h). */
static size_t reserved_now(mp_pool_t *p) {
  mp_stats_t st = {0};
  return mp_pool_get_stats(p, &st) == MP_OK ? st.reserved_bytes : SIZE_MAX;
}

/* Ends the capture of s (begun in relaxed mode: the pool's own calls from
 * this thread are allowed), which must have stayed valid. */
static void end_capture(CUstream s) {
  CUgraph g = NULL;
  cr_expect_eq(capcu.end(s, &g), CUDA_SUCCESS, "the capture was invalidated");
  if (g != NULL)
    cr_assert_eq(capcu.graph_destroy(g), CUDA_SUCCESS);
}

Test(cuda_defrag_refused_wait, leaves_the_copy_stream_unknown,
     .init = capture_load) {
  mp_device_t *dev = open_dev("cuda");
  CUcontext ctx;
  cr_assert_eq(capcu.retain(&ctx, 0), CUDA_SUCCESS);
  cr_assert_eq(capcu.push(ctx), CUDA_SUCCESS);
  CUstream a, b, d; /* a: the blocks' stream; b: known, captured; d: copies */
  CUstream *mine[] = {&a, &b, &d};
  for (int i = 0; i < 3; i++)
    cr_assert_eq(capcu.create(mine[i], CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cfg.segment_bytes = 8 * MiB;
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_config_parse(&cfg, "virtual=0"), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_create(dev, &cfg, &pool), MP_OK, "%s", mp_last_error());
  /* Eight movable MiB blocks on a; every other one freed: four kept, a
   * MiB hole below each. */
  mp_handle_t *h[8], *keep[4];
  for (int i = 0; i < 8; i++)
    cr_assert_eq(mp_pool_alloc_movable(pool, MiB, (mp_stream_t)a, &h[i]), MP_OK,
                 "%s", mp_last_error());
  for (int i = 0; i < 8; i += 2) {
    cr_assert_eq(mp_handle_free(h[i]), MP_OK);
    keep[i / 2] = h[i + 1];
  }
  /* A second segment, idle: what the trim gives back. */
  void *idle = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 8 * MiB, (mp_stream_t)a, &idle), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(pool, idle), MP_OK);
  cr_assert_eq(mp_pool_add_stream(pool, (mp_stream_t)b), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_stream_synchronize(dev, (mp_stream_t)a), MP_OK);

  /* b, which the pool knows, captured: the defragmentation on d cannot
   * wait for it. */
  cr_assert_eq(capcu.begin(b, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  size_t moved = 77;
  mp_status_t st = mp_pool_defragment(pool, (mp_stream_t)d, &moved);
  char why[512];
  snprintf(why, sizeof why, "%s", mp_last_error());
  end_capture(b);
  cr_expect_eq(st, MP_EBUSY, "defragment beside a capture: %d (%s)", st, why);
  cr_expect_eq(moved, 0);
  cr_assert_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());

  /* d captured now: the pool never used it, so a trim still runs (and,
   * waiting by events only, keeps another thread's capture in global mode
   * valid). */
  capture_t beside;
  capture_start(&beside);
  cr_assert_eq(capcu.begin(d, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  size_t before = reserved_now(pool);
  mp_status_t trim = mp_pool_trim(pool, 0);
  snprintf(why, sizeof why, "%s", mp_last_error());
  size_t after = reserved_now(pool);
  end_capture(d);
  capture_finish(&beside);
  cr_expect_eq(trim, MP_OK, "the trim during a capture of d: %s", why);
  cr_expect_lt(after, before, "the trim gave nothing back (%zu)", after);

  /* The capture over, the blocks move on d. */
  cr_assert_eq(mp_pool_defragment(pool, (mp_stream_t)d, &moved), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(moved, 4 * MiB, "moved %zu", moved);
  cr_assert_eq(mp_stream_synchronize(dev, (mp_stream_t)d), MP_OK);
  cr_assert_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  for (int i = 0; i < 4; i++)
    cr_assert_eq(mp_handle_free(keep[i]), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(mp_stream_forget(dev, (mp_stream_t)*mine[i]), MP_OK);
    cr_assert_eq(capcu.destroy(*mine[i]), CUDA_SUCCESS);
  }
  cr_assert_eq(capcu.pop(NULL), CUDA_SUCCESS);
  cr_assert_eq(capcu.release(0), CUDA_SUCCESS);
  mp_device_close(dev);
}
