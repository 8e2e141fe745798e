/* A pause of a pool with arenas refused in a later arena (no page-locked
 * memory left for its content) changes nothing (status.h): the free plain
 * segments of an arena paused before it are still the pool's. Each arena
 * gave its own back to the device as it paused (pause.c,
 * mp__pause_plain_release), and the undo (mp__resume_one) maps an arena's
 * chunks back but cannot bring back a segment the device took: the
 * refused pause had given memory back, and the figures said one segment
 * fewer. They go back once every arena is paused
 * (mp__arenas_plain_release). There, a free the device refuses undoes the
 * whole pause, the arena keeping the segment in its figures. White-box: it
 * looks at the arenas. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../support/device_helpers.h"
#include "../support/pool_helpers.h"
#include "arena_workers.h"
#include "flaky_unmap.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)
#define KiB ((size_t)1 << 10)

static unsigned host_allocs;

/* The second page-locked allocation (the second arena's copy of its
 * content) fails. */
static mp_status_t second_host_alloc_fails(mp_device_t *d, size_t bytes,
                                           void **out) {
  if (++host_allocs == 2)
    return mp__fail(MP_ENOMEM, "fake host_alloc #2 of %zu bytes fails", bytes);
  return flaky_host_alloc(d, bytes, out);
}

static bool free_refused;

static mp_status_t free_maybe_refused(mp_device_t *d, void *ptr) {
  if (free_refused)
    return mp__fail(MP_EDRIVER, "fake driver: free of %p refused", ptr);
  return fake_backend.free(d, ptr);
}

static size_t plain_segments(mp_pool_t *a) {
  size_t n = 0;
  mp__pool_lock(a);
  for (const mp__segment_t *g = a->segs; g != NULL; g = g->next)
    n += g->kind != MP__SEG_VIRTUAL;
  mp__pool_unlock(a);
  return n;
}

/* The arena's own figures, under its lock. */
static mp_stats_t arena_st(mp_pool_t *a) {
  mp__pool_lock(a);
  mp_stats_t s = a->st;
  mp__pool_unlock(a);
  return s;
}

static mp_device_t *fdev;
static mp_pool_t *pool, *a0, *a1;
static job_t a, b, big;
static worker_t *w0;
static mp_stats_t was, was0;

/* Two arenas, each with a live block; arena 0 (the first to pause) filled
 * up to a cap that is no whole number of 2 MiB granules, where growth takes
 * a plain segment of the request's size, which it frees. */
static void setup(void) {
  fdev = flaky_open(0);
  flaky_backend.host_alloc = second_host_alloc_fails;
  flaky_backend.free = free_maybe_refused;
  host_allocs = 0;
  free_refused = false;
  pool = make_pool(fdev, "arenas=2,max_bytes=21M");
  a = (job_t){.pool = pool, .bytes = 2 * MiB, .tag = 0xa0, .count = 1};
  b = (job_t){.pool = pool, .bytes = 2 * MiB, .tag = 0xb0, .count = 1};
  two_arenas(pool, &a, &b);
  w0 = arena_holding(pool, a.ptrs[0]) == 0 ? &wa : &wb;
  a0 = mp__arena_at(pool, 0);
  a1 = mp__arena_at(pool, 1);
  big = (job_t){.pool = pool, .bytes = 16 * MiB, .tag = 0xc0, .count = 1};
  cr_assert_eq(on_worker(w0, &big, ALLOC), MP_OK, "%s", big.why);
  job_t small = {.pool = pool, .bytes = 256 * KiB, .tag = 0xd0, .count = 1};
  cr_assert_eq(on_worker(w0, &small, ALLOC), MP_OK, "%s", small.why);
  cr_assert_eq(arena_holding(pool, small.ptrs[0]), 0);
  cr_assert_eq(on_worker(w0, &small, FREE), MP_OK, "%s", small.why);
  cr_assert_eq(plain_segments(a0), 1, "the test needs a free plain segment");
  cr_assert_eq(plain_segments(a1), 0);
  was = stats(pool);
  was0 = arena_st(a0);
}

/* After a refused pause: every arena runs, with what it held before. */
static void expect_unchanged(void) {
  cr_assert(!mp__pool_is_paused(a0) && !mp__pool_is_paused(a1) &&
                !mp__pool_is_paused(pool),
            "the undo resumed the first arena");
  cr_expect_eq(plain_segments(a0), 1,
               "the refused pause gave the first arena's free plain "
               "segment back to the device");
  mp_stats_t now = stats(pool), now0 = arena_st(a0);
  cr_expect_eq(now.reserved_bytes, was.reserved_bytes, "%zu, was %zu",
               now.reserved_bytes, was.reserved_bytes);
  cr_expect_eq(now.segment_count, was.segment_count, "%zu, was %zu",
               (size_t)now.segment_count, (size_t)was.segment_count);
  cr_expect_eq(now0.reserved_bytes, was0.reserved_bytes);
  cr_expect_eq(now0.segment_count, was0.segment_count);
  expect_kept(&a);
  expect_kept(&b);
  check(pool);
}

/* A pause that goes through gives the segment back, the resume's figures
 * without it; then everything is freed. */
static void pause_then_finish(void) {
  host_allocs = 2;
  free_refused = false;
  cr_assert_eq(mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(plain_segments(a0), 0);
  cr_assert_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  mp_stats_t now0 = arena_st(a0);
  cr_expect_eq(now0.reserved_bytes, was0.reserved_bytes - 256 * KiB);
  cr_expect_eq(now0.segment_count, was0.segment_count - 1);
  expect_kept(&a);
  expect_kept(&b);
  check(pool);
  worker_t *w1 = w0 == &wa ? &wb : &wa;
  job_t *j0 = w0 == &wa ? &a : &b, *j1 = w0 == &wa ? &b : &a;
  cr_expect_eq(on_worker(w0, j0, FREE), MP_OK, "%s", j0->why);
  cr_expect_eq(on_worker(w1, j1, FREE), MP_OK, "%s", j1->why);
  cr_expect_eq(on_worker(w0, &big, FREE), MP_OK, "%s", big.why);
  check(pool);
  worker_stop(&wa);
  worker_stop(&wb);
  fake_pool_finish(pool, fdev);
}

Test(pool_arenas_pause_refused_keeps_plain_segments, gives_none_back) {
  setup();
  cr_assert_eq(mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT), MP_ENOMEM, "%s",
               mp_last_error());
  cr_assert_eq(host_allocs, 2, "the second arena's copy was refused");
  expect_unchanged();
  pause_then_finish();
}

/* The device refuses the segment's free once every arena is paused: the
 * pause is undone, the segment still arena 0's, in its figures. */
Test(pool_arenas_pause_refused_keeps_plain_segments, free_refused_undoes) {
  setup();
  host_allocs = 2; /* no host allocation refused */
  free_refused = true;
  mp_status_t st = mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT);
  free_refused = false;
  cr_assert_eq(st, MP_EBUSY, "%s", mp_last_error());
  cr_expect(strstr(mp_last_error(), "could not be given back") != NULL, "%s",
            mp_last_error());
  expect_unchanged();
  pause_then_finish();
}
