/* Defragmentation's staging buffer (defrag.c) counts against the pool's
 * max_bytes while it lives: growth meanwhile (the lock is dropped for the
 * synchronization and while the copies still read the buffer) gets only
 * what the cap leaves beside it, so the device never holds more than the
 * cap for the pool; once the buffer is freed its room is the pool's again.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

typedef struct grow_arg {
  mp_pool_t *pool;
  mp_stream_t s;
  size_t bytes;
  void *p;
  mp_status_t st;
  bool ran;
} grow_arg_t;

/* At the staging buffer's free, as another thread would while the
 * defragmenting one waits for its copies: takes what the cap has left. */
static void grow_to_the_cap(void *ctx) {
  grow_arg_t *g = ctx;
  g->ran = true;
  g->st = mp_pool_alloc(g->pool, g->bytes, g->s, &g->p);
}

/* A pool capped at 8 MiB on dev with a 1 MiB movable block 4 KiB above its
 * segment's start, the 4 KiB below it free: a slide by a gap under 1/64 of
 * the block, which wants a 1 MiB staging buffer. The block in *big, its
 * destination (the segment's start) returned. */
static char *slide_ready(mp_device_t *dev, mp_pool_t **pool, mp_stream_t *s,
                         mp_handle_t **big) {
  *pool = make_pool(dev, "virtual=0,max_bytes=8M,segment_bytes=2M,align=512");
  cr_assert_eq(mp_stream_create(dev, s), MP_OK);
  mp_handle_t *small;
  cr_assert_eq(mp_pool_alloc_movable(*pool, 4096, *s, &small), MP_OK);
  cr_assert_eq(mp_pool_alloc_movable(*pool, MiB, *s, big), MP_OK);
  char *low = mp_handle_ptr(small);
  cr_assert_eq((char *)mp_handle_ptr(*big), low + 4096);
  cr_assert_eq(mp_handle_free(small), MP_OK);
  return low;
}

Test(pool_defrag_staging,
     growth_beside_the_staging_buffer_stays_under_the_cap) {
  const size_t cap = 8 * MiB;
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  fake_dev_t *f = fake_of(dev);
  mp_pool_t *pool;
  mp_stream_t s;
  mp_handle_t *big;
  char *low = slide_ready(dev, &pool, &s, &big);
  cr_assert_eq(stats(pool).reserved_bytes, 2 * MiB);
  grow_arg_t g = {.pool = pool, .s = s, .bytes = cap - 2 * MiB};
  f->on_free = grow_to_the_cap;
  f->on_free_ctx = &g;
  size_t moved = 0;
  cr_assert_eq(mp_pool_defragment(pool, s, &moved), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(moved, MiB);
  cr_assert_eq((char *)mp_handle_ptr(big), low);
  cr_assert(g.ran, "no staging buffer was freed: the test proves nothing");
  cr_expect_leq(f->peak, cap,
                "the device held %zu bytes for a pool capped at %zu", f->peak,
                cap);
  /* Only what the cap left beside the buffer could be had then. */
  cr_expect_eq(g.st, MP_ELIMIT, "the allocation beside the buffer: %s",
               mp_status_string(g.st));
  /* The buffer gone, its room is the pool's again. */
  if (g.st == MP_OK)
    cr_assert_eq(mp_pool_free(pool, g.p), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, cap - 2 * MiB, s, &g.p), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(pool, g.p), MP_OK);
  cr_assert_eq(mp_handle_free(big), MP_OK);
  cr_assert_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  fake_close(dev);
}

/* The fake device whose stream synchronizes fail while refuse_stream_syncs
 * (as a wait CUDA refuses: a stream in capture, a host function). */
static bool refuse_stream_syncs;
static unsigned stream_syncs_refused;
static mp__backend_t refusing_backend;

static mp_status_t refusing_stream_sync(mp_device_t *dev, mp_stream_t s) {
  (void)dev;
  (void)s;
  if (!refuse_stream_syncs)
    return MP_OK;
  stream_syncs_refused++;
  return mp__fail(MP_EDRIVER, "fake: no stream wait here");
}

/* A stream synchronize that fails after the copies still gives the staging
 * buffer back (mp_device_free synchronizes the device itself before the
 * memory goes) and its room under the cap: the device holds only the
 * pool's segments after. Failed before: the buffer stayed allocated, no
 * longer counted anywhere (a leak of the device's memory). */
Test(pool_defrag_staging, a_failed_sync_still_frees_the_staging_buffer) {
  const size_t cap = 8 * MiB;
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  refusing_backend = *dev->ops;
  refusing_backend.stream_synchronize = refusing_stream_sync;
  dev->ops = &refusing_backend;
  fake_dev_t *f = fake_of(dev);
  mp_pool_t *pool;
  mp_stream_t s;
  mp_handle_t *big;
  (void)slide_ready(dev, &pool, &s, &big);
  size_t held = f->used, allocs = f->allocs;
  cr_assert_eq(held, 2 * MiB);
  refuse_stream_syncs = true;
  size_t moved = 0;
  cr_expect_eq(mp_pool_defragment(pool, s, &moved), MP_EDRIVER,
               "the failed wait is the caller's to know: %s", mp_last_error());
  refuse_stream_syncs = false;
  cr_assert_gt(f->allocs, allocs, "no staging buffer: the test proves nothing");
  cr_assert_gt(stream_syncs_refused, 0);
  cr_expect_eq(f->used, held,
               "the device holds %zu bytes, the pool's segments %zu", f->used,
               held);
  /* Its room under the cap is the pool's again. */
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, cap - 2 * MiB, s, &p), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_handle_free(big), MP_OK);
  cr_assert_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  fake_close(dev);
}

/* The staging buffer a slide uses is a device allocation and free: the
 * pool's device call counts (stats.h: "calls into the driver") say so. */
Test(pool_defrag_staging, the_staging_buffer_counts_as_device_calls) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  fake_dev_t *f = fake_of(dev);
  mp_pool_t *pool =
      make_pool(dev, "virtual=0,max_bytes=8M,segment_bytes=2M,align=512");
  mp_handle_t *small, *big;
  cr_assert_eq(mp_pool_alloc_movable(pool, 4096, NULL, &small), MP_OK);
  cr_assert_eq(mp_pool_alloc_movable(pool, MiB, NULL, &big), MP_OK);
  cr_assert_eq(mp_handle_free(small), MP_OK);
  mp_stats_t b = stats(pool);
  unsigned allocs = f->allocs, frees = f->frees;
  size_t moved = 0;
  cr_assert_eq(mp_pool_defragment(pool, NULL, &moved), MP_OK);
  cr_assert_eq(moved, MiB);
  mp_stats_t a = stats(pool);
  cr_assert_gt(f->allocs - allocs, 0, "the slide used no staging buffer");
  cr_expect_eq(a.device_alloc_count - b.device_alloc_count, f->allocs - allocs);
  cr_expect_eq(a.device_free_count - b.device_free_count, f->frees - frees);
  cr_assert_eq(mp_handle_free(big), MP_OK);
  fake_pool_finish(pool, dev);
}

/* slide_ready's pool, defragmented with the staging buffer's free
 * refused (the device keeps it): the block moved, the buffer still held. */
static mp_pool_t *refused_slide(mp_device_t *dev, mp_stream_t *s,
                                mp_handle_t **big) {
  fake_dev_t *f = fake_of(dev);
  mp_pool_t *pool;
  (void)slide_ready(dev, &pool, s, big);
  size_t held = f->used;
  unsigned allocs = f->allocs;
  f->refuse_frees = 1; /* the staging buffer's free */
  size_t moved = 0;
  cr_expect_eq(mp_pool_defragment(pool, *s, &moved), MP_EDRIVER,
               "the refused free is the caller's to know");
  cr_assert_eq(moved, MiB);
  cr_assert_gt(f->allocs, allocs, "no staging buffer: the test proves nothing");
  cr_assert_eq(f->used, held + MiB, "the device still holds the buffer");
  return pool;
}

/* A staging buffer whose free the device refuses is kept, booked against
 * the cap, and freed again later: here by mp_pool_trim, which gives its
 * room under the cap back. Before, the buffer was held by nobody: its
 * bytes stayed booked for good and the device kept it past the destroy. */
Test(pool_defrag_staging, a_refused_free_of_the_staging_buffer_is_tried_again) {
  const size_t cap = 8 * MiB;
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  fake_dev_t *f = fake_of(dev);
  mp_stream_t s;
  mp_handle_t *big;
  mp_pool_t *pool = refused_slide(dev, &s, &big);
  void *p;
  cr_expect_eq(mp_pool_alloc(pool, cap - 2 * MiB, s, &p), MP_ELIMIT,
               "the kept buffer counts against the cap");
  mp_stats_t before = stats(pool);
  unsigned frees = f->frees;
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(f->used, stats(pool).reserved_bytes,
               "the device holds %zu bytes, the pool reserves %zu", f->used,
               (size_t)stats(pool).reserved_bytes);
  cr_expect_eq(stats(pool).device_free_count - before.device_free_count,
               f->frees - frees);
  cr_assert_eq(mp_pool_alloc(pool, cap - 2 * MiB, s, &p), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_handle_free(big), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(f->used, 0, "the device still holds %zu bytes", f->used);
  fake_close(dev);
}

/* A destroy that finds a kept staging buffer whose free is refused again
 * fails with the pool as it was; its next try frees everything. */
Test(pool_defrag_staging, a_destroy_frees_a_kept_staging_buffer_first) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  fake_dev_t *f = fake_of(dev);
  mp_stream_t s;
  mp_handle_t *big;
  mp_pool_t *pool = refused_slide(dev, &s, &big);
  cr_assert_eq(mp_handle_free(big), MP_OK);
  size_t used = f->used;
  f->refuse_frees = 1;
  cr_expect_eq(mp_pool_destroy(pool), MP_EDRIVER, "the destroy went on");
  cr_expect_neq(strstr(mp_last_error(), "staging"), NULL, "%s",
                mp_last_error());
  cr_expect_eq(f->used, used, "the refused destroy gave memory back");
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(f->used, 0, "the device still holds %zu bytes", f->used);
  fake_close(dev);
}
