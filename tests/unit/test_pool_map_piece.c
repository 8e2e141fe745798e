/* map_piece: growth in the virtual range maps at most map_piece per device
 * mapping, so memory goes back (trim, the reclaim before growing past the
 * peak) a piece at a time, where one mapping per growth goes back only once
 * all of it is free. On the synchronous fake device, which checks that
 * every unmap matches one map exactly. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

/* Device maps an 8 MiB allocation takes under opts. */
static unsigned maps_for_8m(const char *opts) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  mp_pool_t *p = make_pool(dev, opts);
  void *a;
  cr_assert_eq(mp_pool_alloc(p, 8 * MiB, NULL, &a), MP_OK, "%s",
               mp_last_error());
  memset(a, 0x5a, 8 * MiB); /* one block across the pieces */
  unsigned maps = fake_of(dev)->maps;
  cr_expect_eq(stats(p).reserved_bytes, 8 * MiB);
  cr_expect_eq(stats(p).device_alloc_count, maps);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  fake_pool_finish(p, dev);
  return maps;
}

Test(pool_map_piece, a_growth_maps_one_mapping_per_piece) {
  cr_expect_eq(maps_for_8m(NULL), 1);
  cr_expect_eq(maps_for_8m("map_piece=2M"), 4);
  /* Rounded up to the granule: 3 MiB pieces are 4 MiB. */
  cr_expect_eq(maps_for_8m("map_piece=3M"), 2);
  cr_expect_eq(maps_for_8m("map_piece=64M"), 1);
}

/* An 8 MiB growth freed, 2 MiB of it used again, then a trim: what is
 * reserved after. */
static size_t reserved_after_trim(const char *opts, unsigned *unmaps) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  mp_pool_t *p = make_pool(dev, opts);
  void *a, *b;
  cr_assert_eq(mp_pool_alloc(p, 8 * MiB, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &b), MP_OK);
  cr_assert_eq(b, a, "best fit takes the low end of the free block");
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK);
  size_t r = stats(p).reserved_bytes;
  *unmaps = fake_of(dev)->unmaps;
  memset(b, 0x5a, 2 * MiB); /* still mapped */
  check(p);
  cr_assert_eq(mp_pool_free(p, b), MP_OK);
  fake_pool_finish(p, dev);
  return r;
}

Test(pool_map_piece, trim_gives_back_the_free_pieces_of_a_partly_used_growth) {
  unsigned unmaps;
  cr_expect_eq(reserved_after_trim(NULL, &unmaps), 8 * MiB,
               "one mapping cannot go back while 2 MiB of it is used");
  cr_expect_eq(unmaps, 0);
  cr_expect_eq(reserved_after_trim("map_piece=2M", &unmaps), 2 * MiB);
  cr_expect_eq(unmaps, 3);
}

/* A and B (8 MiB each), A freed and 2 MiB of it used again, then 12 MiB:
 * the peak reserved. */
static size_t peak_after_growth(const char *opts) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  mp_pool_t *p = make_pool(dev, opts);
  void *a, *b, *c, *d;
  cr_assert_eq(mp_pool_alloc(p, 8 * MiB, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 8 * MiB, NULL, &b), MP_OK);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &c), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 12 * MiB, NULL, &d), MP_OK);
  memset(d, 0x5a, 12 * MiB);
  size_t peak = stats(p).peak_reserved_bytes;
  cr_expect_eq(stats(p).allocated_bytes, 22 * MiB);
  check(p);
  cr_assert_eq(mp_pool_free(p, b), MP_OK);
  cr_assert_eq(mp_pool_free(p, c), MP_OK);
  cr_assert_eq(mp_pool_free(p, d), MP_OK);
  fake_pool_finish(p, dev);
  return peak;
}

Test(pool_map_piece, growth_past_the_peak_first_gives_back_free_pieces) {
  cr_expect_eq(peak_after_growth(NULL), 28 * MiB);
  /* The three free pieces of A's growth go back before the 12 MiB are
   * mapped: the peak is what is live. */
  cr_expect_eq(peak_after_growth("map_piece=2M"), 22 * MiB);
}

Test(pool_map_piece, a_piece_the_device_refuses_fails_the_growth_cleanly) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  mp_pool_t *p = make_pool(dev, "map_piece=2M");
  fake_dev_t *f = fake_of(dev);
  f->fail_after = f->allocs + 3; /* the third piece and every later call */
  void *a;
  cr_expect_eq(mp_pool_alloc(p, 8 * MiB, NULL, &a), MP_ENOMEM);
  cr_expect_eq(f->maps, 2);
  /* The two pieces mapped before the refusal were the pool's free memory;
   * the out-of-memory ladder's trim gave them back. */
  check(p);
  cr_expect_eq(stats(p).allocated_bytes, 0);
  cr_expect_eq(stats(p).reserved_bytes, f->used);
  cr_expect_eq(f->bad_unmaps, 0);
  f->fail_after = 0;
  cr_assert_eq(mp_pool_alloc(p, 8 * MiB, NULL, &a), MP_OK, "%s",
               mp_last_error());
  memset(a, 0x5a, 8 * MiB);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  fake_pool_finish(p, dev);
}

Test(pool_map_piece, bad_values_are_refused_and_change_nothing) {
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_assert_eq(mp_pool_config_parse(&cfg, "map_piece=6M"), MP_OK);
  cr_expect_eq(cfg.map_piece, 6 * MiB);
  cr_expect_eq(mp_pool_config_parse(&cfg, "map_piece=lots"), MP_EINVAL);
  cr_expect_neq(strstr(mp_last_error(), "map_piece"), NULL, "%s",
                mp_last_error());
  cr_expect_eq(cfg.map_piece, 6 * MiB);
  /* A config for the header before map_piece: the option is past it. */
  mp_pool_config_t old;
  cr_assert_eq(
      mp_pool_config_init_sized(&old, offsetof(mp_pool_config_t, map_piece)),
      MP_OK);
  cr_expect_eq(mp_pool_config_parse(&old, "map_piece=2M"), MP_EINVAL);
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  mp_pool_t *p = NULL;
  cfg.map_piece = SIZE_MAX;
  cr_expect_eq(mp_pool_create(dev, &cfg, &p), MP_EINVAL);
  cr_expect_null(p);
  cr_expect_neq(strstr(mp_last_error(), "map_piece"), NULL, "%s",
                mp_last_error());
  fake_close(dev);
}

/* Pieces are mappings of the virtual range: with virtual=0 the option
 * would do nothing, so the pair is refused, by create and by name; on a
 * device without virtual memory (the pool falls back to plain segments)
 * it is taken and does nothing. */
Test(pool_map_piece, map_piece_with_virtual_off_is_refused) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  expect_create_refused(dev, "virtual=0,map_piece=4M",
                        "map_piece=4194304 needs virtual=1");
  mp_pool_t *p = make_pool(dev, "virtual=0,map_piece=0");
  cr_expect_eq(mp_pool_destroy(p), MP_OK);
  fake_close(dev);
  mp_device_t *plain;
  cr_assert_eq(mp_device_open("host:vmm=0", &plain), MP_OK);
  p = make_pool(plain, "map_piece=4M");
  void *a;
  cr_assert_eq(mp_pool_alloc(p, 8 * MiB, NULL, &a), MP_OK);
  cr_expect_null(p->vseg, "plain segments only");
  memset(a, 0x3c, 8 * MiB);
  cr_expect_eq(mp_pool_free(p, a), MP_OK);
  cr_expect_eq(mp_pool_destroy(p), MP_OK);
  mp_device_close(plain);
}

static size_t holes_of(mp_pool_t *p) {
  return p->vseg ? p->vseg->nholes : 0;
}

/* The block holding address a. */
static mp__block_t *block_at(mp_pool_t *p, void *a) {
  for (mp__block_t *b = p->vseg->first; b; b = b->next)
    if (b->addr <= (uintptr_t)a && (uintptr_t)a < b->addr + b->size)
      return b;
  return NULL;
}

/* Live 2 MiB a, a hole of `hole` bytes where b was, live 2 MiB c. */
static mp_pool_t *hole_between(mp_device_t **dev, const char *opts, size_t hole,
                               void **a, void **b, void **c) {
  *dev = fake_open((size_t)1 << 30, 2 * MiB);
  mp_pool_t *p = make_pool(*dev, opts);
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, a), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, hole, NULL, b), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, c), MP_OK);
  cr_assert_eq(mp_pool_free(p, *b), MP_OK);
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK);
  cr_assert_eq(holes_of(p), 1);
  return p;
}

Test(pool_map_piece, pieces_fill_a_hole_from_its_free_neighbour_below) {
  mp_device_t *dev;
  void *a, *b, *c, *x;
  mp_pool_t *p = hole_between(&dev, "map_piece=2M", 8 * MiB, &a, &b, &c);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  unsigned maps = fake_of(dev)->maps;
  cr_assert_eq(mp_pool_alloc(p, 10 * MiB, NULL, &x), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(x, a, "a's free 2 MiB and the whole hole");
  cr_expect_eq(fake_of(dev)->maps - maps, 4);
  cr_expect_eq(holes_of(p), 0);
  memset(x, 1, 10 * MiB);
  check(p);
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  cr_expect_eq(block_at(p, x)->size, 10 * MiB, "one free block");
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK);
  cr_expect_eq(stats(p).reserved_bytes, 2 * MiB);
  cr_assert_eq(mp_pool_free(p, c), MP_OK);
  fake_pool_finish(p, dev);
}

/* A hole with a free block above it: the growth lies against the hole's
 * top edge, so the first piece splits the hole and the last takes the
 * upper part of it. */
static void against_a_holes_top_edge(const char *opts, unsigned want_maps) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  mp_pool_t *p = make_pool(dev, opts);
  void *a, *b, *c, *d, *x;
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 16 * MiB, NULL, &b), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &c), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &d), MP_OK);
  cr_assert_eq(mp_pool_free(p, b), MP_OK);
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK);
  cr_assert_eq(mp_pool_free(p, c), MP_OK);
  unsigned maps = fake_of(dev)->maps;
  cr_assert_eq(mp_pool_alloc(p, 6 * MiB, NULL, &x), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(fake_of(dev)->maps - maps, want_maps, "%s", opts);
  check(p);
  memset(x, 1, 6 * MiB);
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  mp__block_t *f = block_at(p, x);
  cr_expect_eq(f->addr + f->size, (uintptr_t)c + 2 * MiB,
               "the growth and c's block are one free block");
  check(p);
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK);
  cr_expect_eq(stats(p).reserved_bytes, 4 * MiB);
  cr_expect_eq(holes_of(p), 1);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  cr_assert_eq(mp_pool_free(p, d), MP_OK);
  fake_pool_finish(p, dev);
}

Test(pool_map_piece, pieces_against_a_holes_top_edge) {
  against_a_holes_top_edge("map_piece=2M", 2);
  /* A growth step of 8 MiB: four pieces, the first splitting the hole. */
  against_a_holes_top_edge("map_piece=2M,segment_bytes=8M", 4);
}

Test(pool_map_piece, pieces_in_a_hole_without_free_neighbours) {
  mp_device_t *dev;
  void *a, *b, *c, *x;
  mp_pool_t *p =
      hole_between(&dev, "map_piece=2M,max_bytes=24M", 16 * MiB, &a, &b, &c);
  /* No room at the top: the range ends where its span does. (A range of
   * twice the cap never runs out in a layout this small; before it was
   * the cap's size, and the cap alone left no room.) */
  size_t va = p->vseg->va_size;
  p->vseg->va_size = p->vseg->span;
  cr_assert_eq(mp_pool_alloc(p, 6 * MiB, NULL, &x), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(x, b);
  check(p);
  p->vseg->va_size = va;
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  cr_expect_eq(block_at(p, x)->size, 6 * MiB);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  cr_assert_eq(mp_pool_free(p, c), MP_OK);
  fake_pool_finish(p, dev);
}

/* One growth of bytes under opts: its chunks, one per device map, n of
 * them, the first and the last of these sizes, one block across them. */
static void one_growth(const char *opts, size_t bytes, size_t n, size_t first,
                       size_t last) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  mp_pool_t *p = make_pool(dev, opts);
  void *x;
  cr_assert_eq(mp_pool_alloc(p, bytes, NULL, &x), MP_OK);
  cr_expect_eq(fake_of(dev)->maps, n, "%s", opts);
  cr_assert_eq(p->vseg->nchunks, n, "%s", opts);
  cr_expect_eq(p->vseg->chunks[0].size, first, "%s", opts);
  cr_expect_eq(p->vseg->chunks[n - 1].size, last, "%s", opts);
  memset(x, 1, bytes);
  check(p);
  cr_assert_eq(mp_pool_free(p, x), MP_OK);
  fake_pool_finish(p, dev);
}

Test(pool_map_piece, a_piece_size_that_does_not_divide_the_growth) {
  one_growth("map_piece=4M", 6 * MiB, 2, 4 * MiB, 2 * MiB);
}

Test(pool_map_piece, more_pieces_than_the_chunk_table_held) {
  /* The chunk table starts at 16 and doubles. */
  one_growth("map_piece=2M", 64 * MiB, 32, 2 * MiB, 2 * MiB);
}

/* Without the out-of-memory ladder: a growth whose third piece the device
 * refuses fails, and the two pieces mapped before it go back (grow.c,
 * mp__grow_undo): reserved is what it was, the two maps and their two
 * unmaps counted. Until 2026-12-07 they stayed the pool's free memory,
 * and the ladder's last growth left a failed allocation holding them
 * (test_pool_growth_refused_midway_maps_nothing). */
Test(pool_map_piece, a_refused_piece_gives_back_the_pieces_before_it) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  mp_pool_t *p = make_pool(dev, "map_piece=2M");
  fake_dev_t *f = fake_of(dev);
  void *a;
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &a), MP_OK);
  f->fail_after = f->allocs + 3;
  mp__pool_lock(p);
  mp__block_t *fresh = NULL;
  mp_status_t st = mp__segment_grow(p, 8 * MiB, 0, &fresh);
  mp__pool_unlock(p);
  cr_expect_neq(st, MP_OK);
  check(p);
  cr_expect_null(fresh);
  cr_expect_eq(stats(p).reserved_bytes, 2 * MiB);
  cr_expect_eq(stats(p).device_alloc_count, 3);
  cr_expect_eq(stats(p).device_free_count, 2);
  cr_expect_eq(stats(p).free_bytes, 0);
  cr_expect_eq(f->used, 2 * MiB);
  f->fail_after = 0;
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  fake_pool_finish(p, dev);
}

/* Trim over many pieces, every other one still holding a live block: each
 * free piece goes back, in one walk of the range. */
Test(pool_map_piece, trim_gives_back_every_free_piece_of_many) {
  enum { N = 512 };
  mp_device_t *dev = fake_open((size_t)4 << 30, 2 * MiB);
  mp_pool_t *p = make_pool(dev, "map_piece=2M");
  void *big, *v[N];
  cr_assert_eq(mp_pool_alloc(p, N * MiB, NULL, &big), MP_OK);
  cr_assert_eq(mp_pool_free(p, big), MP_OK);
  for (size_t i = 0; i < N; i++)
    cr_assert_eq(mp_pool_alloc(p, MiB, NULL, &v[i]), MP_OK);
  for (size_t i = 0; i < N; i++)
    if (i % 4 != 0)
      cr_assert_eq(mp_pool_free(p, v[i]), MP_OK);
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK);
  check(p);
  /* Every fourth MiB is live: every other 2 MiB piece holds one. */
  cr_expect_eq(stats(p).reserved_bytes, N / 2 * MiB);
  cr_expect_eq(fake_of(dev)->unmaps, N / 4);
  for (size_t i = 0; i < N; i += 4)
    cr_assert_eq(mp_pool_free(p, v[i]), MP_OK);
  fake_pool_finish(p, dev);
}
