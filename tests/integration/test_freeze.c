/* test_freeze.c - mp_pool_freeze on the host device: the movable blocks
 * live at the freeze are packed into one tight range at the bottom, their
 * data intact when the call returns; every block live then is fenced off
 * from later defragmentation, which works above the fence; frozen blocks
 * may still be freed. mp_pool_check passes after every operation. */
#include <string.h>

#include "movable_fixture.h"

static void setup(void) {
  open_pool("host:capacity=512M", NULL);
}

static void teardown(void) {
  close_pool();
}

TestSuite(freeze, .init = setup, .fini = teardown);

static int by_address(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)mp_handle_ptr(*(mp_handle_t *const *)a);
  uintptr_t y = (uintptr_t)mp_handle_ptr(*(mp_handle_t *const *)b);
  return x < y ? -1 : x > y;
}

/* Weights of a "model": sizes are multiples of the default alignment (512),
 * so a tight packing leaves no byte between them. */
enum { LAYERS = 20 };
static size_t layer_size(unsigned i) {
  return (size_t)(1 + i % 5) * 64 * 1024;
}

static void load_model(mp_handle_t **w, mp_handle_t **scratch) {
  for (unsigned i = 0; i < LAYERS; i++) {
    w[i] = movable(layer_size(i), i);
    scratch[i] = movable(48 * 1024, 500 + i);
  }
  for (unsigned i = 0; i < LAYERS; i++)
    cr_assert_eq(mp_handle_free(scratch[i]), MP_OK);
  check();
}

Test(freeze, packs_live_movable_blocks_into_one_tight_range) {
  mp_handle_t *w[LAYERS], *scratch[LAYERS];
  load_model(w, scratch);
  uintptr_t lowest_before = UINTPTR_MAX;
  for (unsigned i = 0; i < LAYERS; i++)
    if ((uintptr_t)mp_handle_ptr(w[i]) < lowest_before)
      lowest_before = (uintptr_t)mp_handle_ptr(w[i]);

  cr_assert_eq(mp_pool_freeze(pool), MP_OK, "%s", mp_last_error());
  check();
  /* The copies are complete when freeze returns: read with no sync first. */
  mp_handle_t *sorted[LAYERS];
  memcpy(sorted, w, sizeof w);
  qsort(sorted, LAYERS, sizeof sorted[0], by_address);
  size_t total = 0;
  for (unsigned i = 0; i < LAYERS; i++)
    total += layer_size(i);
  uintptr_t lo = (uintptr_t)mp_handle_ptr(sorted[0]);
  uintptr_t hi = 0;
  for (unsigned i = 0; i < LAYERS; i++) {
    unsigned tag = 0;
    while (w[tag] != sorted[i])
      tag++;
    uintptr_t end = (uintptr_t)mp_handle_ptr(sorted[i]) + layer_size(tag);
    hi = end > hi ? end : hi;
  }
  cr_assert_eq(hi - lo, total, "tight: %zu bytes span %zu", total,
               (size_t)(hi - lo));
  cr_assert_leq(lo, lowest_before, "packed towards the bottom");
  for (unsigned i = 0; i < LAYERS; i++)
    expect_pattern(mp_handle_ptr(w[i]), layer_size(i), i);
  for (unsigned i = 0; i < LAYERS; i++)
    cr_assert_eq(mp_handle_free(w[i]), MP_OK);
  check();
}

Test(freeze, frozen_blocks_never_move_again) {
  mp_handle_t *w[LAYERS], *scratch[LAYERS];
  load_model(w, scratch);
  cr_assert_eq(mp_pool_freeze(pool), MP_OK, "%s", mp_last_error());
  void *at[LAYERS];
  uintptr_t fence = 0;
  for (unsigned i = 0; i < LAYERS; i++) {
    at[i] = mp_handle_ptr(w[i]);
    uintptr_t end = (uintptr_t)at[i] + layer_size(i);
    fence = end > fence ? end : fence;
  }
  /* Unloading part of the model leaves holes below the fence. */
  cr_assert_eq(mp_handle_free(w[3]), MP_OK);
  cr_assert_eq(mp_handle_free(w[11]), MP_OK);
  w[3] = w[11] = NULL;
  check();

  /* A fragmented KV cache above the frozen weights. */
  enum { KV = 30 };
  mp_handle_t *kv[KV];
  void *kv_at[KV];
  for (unsigned i = 0; i < KV; i++) {
    kv[i] = movable(96 * 1024, 100 + i);
    kv_at[i] = mp_handle_ptr(kv[i]);
  }
  for (unsigned i = 0; i < KV; i += 2)
    cr_assert_eq(mp_handle_free(kv[i]), MP_OK);
  size_t moved;
  cr_assert_eq(mp_pool_defragment(pool, stream, &moved), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, stream), MP_OK);
  check();
  cr_assert_gt(moved, 0, "the KV cache above the fence was compacted");

  for (unsigned i = 0; i < LAYERS; i++) {
    if (w[i] == NULL)
      continue;
    cr_assert_eq(mp_handle_ptr(w[i]), at[i], "frozen layer %u moved", i);
    expect_pattern(at[i], layer_size(i), i);
  }
  for (unsigned i = 1; i < KV; i += 2) {
    /* Allocations may reuse the holes below the fence; defragmentation
     * moves nothing into, out of or within that space. */
    if ((uintptr_t)kv_at[i] < fence)
      cr_assert_eq(mp_handle_ptr(kv[i]), kv_at[i], "kv %u below the fence", i);
    else
      cr_assert_geq((uintptr_t)mp_handle_ptr(kv[i]), fence,
                    "defragmentation works above the fence");
    expect_pattern(mp_handle_ptr(kv[i]), 96 * 1024, 100 + i);
    cr_assert_eq(mp_handle_free(kv[i]), MP_OK);
  }
  for (unsigned i = 0; i < LAYERS; i++)
    if (w[i] != NULL)
      cr_assert_eq(mp_handle_free(w[i]), MP_OK);
  check();
}

Test(freeze, freeing_the_top_frozen_block_does_not_lower_the_fence) {
  mp_handle_t *w[LAYERS], *scratch[LAYERS];
  load_model(w, scratch);
  cr_assert_eq(mp_pool_freeze(pool), MP_OK, "%s", mp_last_error());
  unsigned top = 0;
  uintptr_t fence = 0;
  for (unsigned i = 0; i < LAYERS; i++) {
    uintptr_t end = (uintptr_t)mp_handle_ptr(w[i]) + layer_size(i);
    if (end > fence) {
      fence = end;
      top = i;
    }
  }
  /* Blocks made after the freeze, the lower one freed: the upper one has
   * free space below it reaching down to the top frozen block. */
  mp_handle_t *gap = movable(96 * 1024, 200), *late = movable(96 * 1024, 201);
  cr_assert_geq((uintptr_t)mp_handle_ptr(gap), fence);
  void *late_at = mp_handle_ptr(late);
  cr_assert_eq(mp_handle_free(gap), MP_OK);
  cr_assert_eq(mp_handle_free(w[top]), MP_OK);
  w[top] = NULL;
  check();
  size_t moved = 0;
  cr_assert_eq(mp_pool_defragment(pool, stream, &moved), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_stream_synchronize(dev, stream), MP_OK);
  check();
  cr_expect_geq((uintptr_t)mp_handle_ptr(late), fence,
                "defragmentation moved a block below the fence");
  /* It may slide down to the fence, no further. */
  cr_expect_leq((uintptr_t)mp_handle_ptr(late), (uintptr_t)late_at);
  expect_pattern(mp_handle_ptr(late), 96 * 1024, 201);
  cr_assert_eq(mp_handle_free(late), MP_OK);
  for (unsigned i = 0; i < LAYERS; i++)
    if (w[i] != NULL)
      cr_assert_eq(mp_handle_free(w[i]), MP_OK);
  check();
}

/* The top frozen block freed joins the free space just above the fence
 * into one free block that starts below it: the part above the fence is
 * still space defragmentation closes (pool.h: it works above the fence),
 * so a block above slides down to the fence itself. */
Test(freeze, a_freed_top_frozen_block_does_not_stop_compaction_at_the_fence) {
  mp_handle_t *low = movable(256 * 1024, 1), *top = movable(256 * 1024, 2);
  cr_assert_eq(mp_pool_freeze(pool), MP_OK, "%s", mp_last_error());
  uintptr_t fence = (uintptr_t)mp_handle_ptr(top) + 256 * 1024;
  mp_handle_t *gap = movable(96 * 1024, 3), *late = movable(96 * 1024, 4);
  cr_assert_eq((uintptr_t)mp_handle_ptr(gap), fence);
  cr_assert_eq((uintptr_t)mp_handle_ptr(late), fence + 96 * 1024);
  cr_assert_eq(mp_handle_free(gap), MP_OK);
  cr_assert_eq(mp_handle_free(top), MP_OK);
  check();
  size_t moved = defragment();
  cr_expect_eq(moved, 96 * 1024);
  cr_expect_eq((uintptr_t)mp_handle_ptr(late), fence,
               "the block above stayed at %p, the fence is at %p",
               mp_handle_ptr(late), (void *)fence);
  expect_pattern(mp_handle_ptr(late), 96 * 1024, 4);
  expect_pattern(mp_handle_ptr(low), 256 * 1024, 1);
  /* The space below the fence stays free, and still serves allocations. */
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, 256 * 1024, stream, &p), MP_OK);
  cr_expect_eq((uintptr_t)p, fence - 256 * 1024);
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_handle_free(late), MP_OK);
  cr_assert_eq(mp_handle_free(low), MP_OK);
  check();
}

Test(freeze, raw_blocks_are_frozen_in_place_and_still_freeable) {
  void *raw[4];
  mp_handle_t *h[4];
  for (unsigned i = 0; i < 4; i++) {
    cr_assert_eq(mp_pool_alloc(pool, 32768, stream, &raw[i]), MP_OK);
    fill(raw[i], 32768, 40 + i);
    h[i] = movable(16384, i);
  }
  cr_assert_eq(mp_handle_free(h[0]), MP_OK);
  cr_assert_eq(mp_pool_free(pool, raw[1]), MP_OK);
  cr_assert_eq(mp_pool_freeze(pool), MP_OK, "%s", mp_last_error());
  check();
  for (unsigned i = 0; i < 4; i++) {
    if (i != 1)
      expect_pattern(raw[i], 32768, 40 + i);
    if (i != 0)
      expect_pattern(mp_handle_ptr(h[i]), 16384, i);
  }
  for (unsigned i = 0; i < 4; i++) {
    if (i != 1)
      cr_assert_eq(mp_pool_free(pool, raw[i]), MP_OK);
    if (i != 0)
      cr_assert_eq(mp_handle_free(h[i]), MP_OK);
  }
  check();
  mp_stats_t s;
  cr_assert_eq(mp_pool_get_stats(pool, &s), MP_OK);
  cr_assert_eq(s.live_blocks, 0);
  cr_assert_eq(s.allocated_bytes, 0);
}

Test(freeze, freezing_twice_or_empty_is_ok) {
  cr_assert_eq(mp_pool_freeze(pool), MP_OK, "empty pool: %s", mp_last_error());
  mp_handle_t *a = movable(8192, 1);
  cr_assert_eq(mp_pool_freeze(pool), MP_OK);
  void *pa = mp_handle_ptr(a);
  cr_assert_eq(mp_pool_freeze(pool), MP_OK);
  cr_assert_eq(mp_handle_ptr(a), pa);
  expect_pattern(pa, 8192, 1);
  cr_assert_eq(mp_handle_free(a), MP_OK);
  check();
}

Test(freeze, bad_input_is_einval) {
  cr_assert_eq(mp_pool_freeze(NULL), MP_EINVAL);
  cr_assert_neq(strstr(mp_last_error(), "mp_pool_freeze"), NULL, "%s",
                mp_last_error());
}
