/* test_pool_defrag_capturing_stream.c - mp_pool_defragment on a stream
 * being captured (mp_pool_graph_begin) changes nothing: with blocks to move
 * it is MP_EBUSY (copies queued on it would go into the graph, not run),
 * with none MP_OK. On a pool with arenas each arena marks the stream
 * capturing without using it, which leaves the arena free to wait for its
 * other streams; the call made the stream used in every arena made
 * (mp__stream_index), so a later defragment on another stream was refused
 * until mp_pool_graph_end. */
#include <criterion/criterion.h>

#include "../support/pool_helpers.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_defrag_capturing_stream, "host:capacity=64M");

/* Four movable MiB blocks on s with a MiB hole below each (the calling
 * thread's arena). */
static void fragment(mp_pool_t *p, mp_stream_t s, mp_handle_t *keep[4]) {
  mp_handle_t *gap[4];
  for (int i = 0; i < 4; i++) {
    cr_assert_eq(mp_pool_alloc_movable(p, MiB, s, &gap[i]), MP_OK, "%s",
                 mp_last_error());
    cr_assert_eq(mp_pool_alloc_movable(p, MiB, s, &keep[i]), MP_OK, "%s",
                 mp_last_error());
  }
  for (int i = 0; i < 4; i++)
    cr_assert_eq(mp_handle_free(gap[i]), MP_OK);
}

static void refused_on_the_captured_stream(bool fragmented_first) {
  mp_pool_t *p = make_pool(dev, "arenas=2");
  mp_stream_t s, other;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  cr_assert_eq(mp_stream_create(dev, &other), MP_OK);
  mp_handle_t *keep[4];
  if (fragmented_first) {
    fragment(p, other, keep);
  } else { /* the calling thread's arena made, compact */
    void *x;
    cr_assert_eq(mp_pool_alloc(p, MiB, other, &x), MP_OK, "%s",
                 mp_last_error());
    cr_assert_eq(mp_pool_free(p, x), MP_OK);
  }
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(p, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(p, g, s), MP_OK, "%s", mp_last_error());

  size_t moved = 77;
  if (fragmented_first) {
    cr_expect_eq(mp_pool_defragment(p, s, &moved), MP_EBUSY);
    cr_expect_neq(strstr(mp_last_error(), "captured"), NULL, "%s",
                  mp_last_error());
  } else {
    cr_expect_eq(mp_pool_defragment(p, s, &moved), MP_OK, "%s",
                 mp_last_error());
  }
  cr_expect_eq(moved, 0);
  if (!fragmented_first)
    fragment(p, other, keep);
  /* The arenas are as they were: a defragment on another stream runs. */
  mp_status_t st = mp_pool_defragment(p, other, &moved);
  cr_expect_eq(st, MP_OK, "%s", st != MP_OK ? mp_last_error() : "");
  cr_expect_eq(moved, 4 * MiB, "moved %zu", moved);
  cr_assert_eq(mp_stream_synchronize(dev, other), MP_OK);
  check(p);

  cr_assert_eq(mp_pool_graph_end(p, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  for (int i = 0; i < 4; i++)
    cr_assert_eq(mp_handle_free(keep[i]), MP_OK);
  check(p);
  cr_assert_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, other), MP_OK);
}

Test(pool_defrag_capturing_stream, refused_with_blocks_to_move) {
  refused_on_the_captured_stream(true);
}

Test(pool_defrag_capturing_stream, refused_on_a_compact_pool) {
  refused_on_the_captured_stream(false);
}

/* Nothing to move, MP_OK: the arena's idle memory still goes back at a
 * trim during the capture. */
Test(pool_defrag_capturing_stream, a_trim_after_it_still_gives_back) {
  mp_pool_t *p = make_pool(dev, "arenas=2");
  mp_stream_t s, other;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  cr_assert_eq(mp_stream_create(dev, &other), MP_OK);
  void *x;
  cr_assert_eq(mp_pool_alloc(p, 8 * MiB, other, &x), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(p, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(p, g, s), MP_OK, "%s", mp_last_error());
  size_t before = stats(p).reserved_bytes;
  cr_assert_eq(mp_pool_defragment(p, s, NULL), MP_OK, "%s", mp_last_error());
  mp_status_t st = mp_pool_trim(p, 0);
  cr_expect_eq(st, MP_OK, "%s", st != MP_OK ? mp_last_error() : "");
  cr_expect_lt(stats(p).reserved_bytes, before);
  check(p);
  cr_assert_eq(mp_pool_graph_end(p, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, other), MP_OK);
}
