/* test_cuda_defrag_captured_stream.c - mp_pool_defragment on a stream the
 * application is capturing into a graph without telling the pool (no
 * mp_pool_graph_begin: torch.cuda.graph with another allocator, a raw
 * cuStreamBeginCapture) changes nothing. Copies queued there would go
 * into the graph, not run (cuda.h, cuStreamBeginCapture_v2: work "is not
 * enqueued for execution" while the stream captures), so with blocks to
 * move it is MP_EBUSY; with none it is MP_OK. Either way the pool must not
 * learn the stream: a stream in its table is waited for by every later
 * synchronization (trim, the out-of-memory ladder, pause), which is then
 * refused as long as the capture lasts (mp__streams_unwaitable). */
#include <stdbool.h>
#include <string.h>

#include <cuda.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "capture_beside.h"
#include "fakecuda_test.h"

#define MiB ((size_t)1 << 20)

static void load_driver(void) {
  capture_load();
}

static size_t reserved(mp_pool_t *p) {
  mp_stats_t s;
  cr_assert_eq(mp_pool_get_stats(p, &s), MP_OK);
  return s.reserved_bytes;
}

/* A pool of plain 8 MiB segments; with fragmented, four movable MiB
 * blocks on a with a MiB hole below each, else one block allocated and
 * freed on a (the pool knows a, and holds idle memory a trim gives back).
 * Then the application captures c (never shown to the pool, relaxed mode:
 * the pool's own calls from this thread are allowed), defragments on it,
 * and trims, while another thread captures in global mode
 * (capture_beside.h): the trim must still give the idle memory back, and
 * both captures end valid. */
static void defragment_on_a_captured_stream(bool fragmented) {
  mp_device_t *dev = open_dev("cuda");
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_assert_eq(mp_pool_config_parse(&cfg, "virtual=0,segment_bytes=8M"), MP_OK,
               "%s", mp_last_error());
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(dev, &cfg, &pool), MP_OK, "%s", mp_last_error());
  CUcontext ctx;
  cr_assert_eq(capcu.retain(&ctx, 0), CUDA_SUCCESS);
  cr_assert_eq(capcu.push(ctx), CUDA_SUCCESS);
  CUstream a, c;
  cr_assert_eq(capcu.create(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  cr_assert_eq(capcu.create(&c, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  mp_handle_t *keep[4] = {0};
  void *idle = NULL;
  if (fragmented) {
    mp_handle_t *gap[4];
    for (int i = 0; i < 4; i++) {
      cr_assert_eq(mp_pool_alloc_movable(pool, MiB, (mp_stream_t)a, &gap[i]),
                   MP_OK, "%s", mp_last_error());
      cr_assert_eq(mp_pool_alloc_movable(pool, MiB, (mp_stream_t)a, &keep[i]),
                   MP_OK, "%s", mp_last_error());
    }
    for (int i = 0; i < 4; i++)
      cr_assert_eq(mp_handle_free(gap[i]), MP_OK);
  }
  /* A second segment, idle: what the trim gives back. */
  cr_assert_eq(mp_pool_alloc(pool, 8 * MiB, (mp_stream_t)a, &idle), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(pool, idle), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, (mp_stream_t)a), MP_OK);

  capture_t beside;
  capture_start(&beside);
  cr_assert_eq(capcu.begin(c, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  size_t moved = 77;
  mp_status_t st = mp_pool_defragment(pool, (mp_stream_t)c, &moved);
  char why[512];
  snprintf(why, sizeof why, "%s", mp_last_error());
  size_t before = reserved(pool);
  mp_status_t trim = mp_pool_trim(pool, 0);
  size_t after = reserved(pool);
  char trim_why[512];
  snprintf(trim_why, sizeof trim_why, "%s", mp_last_error());
  CUgraph g = NULL;
  CUresult end = capcu.end(c, &g);
  if (g != NULL)
    cr_assert_eq(capcu.graph_destroy(g), CUDA_SUCCESS);
  capture_finish(&beside);

  if (fragmented) {
    cr_expect_eq(st, MP_EBUSY, "defragment on a captured stream: %d", st);
    cr_expect_neq(strstr(why, "captur"), NULL, "%s", why);
  } else {
    cr_expect_eq(st, MP_OK, "%s", why);
  }
  cr_expect_eq(moved, 0);
  cr_expect_eq(end, CUDA_SUCCESS, "the capture was invalidated (%d)", end);
  cr_expect_eq(trim, MP_OK, "the trim after it: %s", trim_why);
  cr_expect_lt(after, before, "the trim gave nothing back (%zu)", after);
  cr_assert_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());

  /* Once the capture is over, the blocks move on another stream. */
  if (fragmented) {
    cr_assert_eq(mp_pool_defragment(pool, (mp_stream_t)a, &moved), MP_OK, "%s",
                 mp_last_error());
    cr_expect_eq(moved, 4 * MiB, "moved %zu", moved);
    cr_assert_eq(mp_stream_synchronize(dev, (mp_stream_t)a), MP_OK);
    for (int i = 0; i < 4; i++)
      cr_assert_eq(mp_handle_free(keep[i]), MP_OK);
  }
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_forget(dev, (mp_stream_t)a), MP_OK);
  cr_assert_eq(mp_stream_forget(dev, (mp_stream_t)c), MP_OK);
  cr_assert_eq(capcu.destroy(a), CUDA_SUCCESS);
  cr_assert_eq(capcu.destroy(c), CUDA_SUCCESS);
  cr_assert_eq(capcu.pop(NULL), CUDA_SUCCESS);
  cr_assert_eq(capcu.release(0), CUDA_SUCCESS);
  mp_device_close(dev);
}

Test(cuda_defrag_captured_stream,
     with_blocks_to_move_is_ebusy_and_changes_nothing, .init = load_driver) {
  defragment_on_a_captured_stream(true);
}

Test(cuda_defrag_captured_stream,
     with_nothing_to_move_leaves_the_stream_unknown, .init = load_driver) {
  defragment_on_a_captured_stream(false);
}
