/* Defragmentation when the device refuses a copy part-way (defrag.c): the
 * call fails, every handle still names its block's data, whole, the pool is
 * consistent (mp_pool_check) with its counts as before, and what the copies
 * queued still use goes to no other stream before they are done. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* The fake device whose copy #copy_fail_at (1-based; 0: none) fails. */
static unsigned copies, copy_fail_at;
static mp__backend_t copy_backend;

static mp_status_t failing_memcpy(mp_device_t *dev, void *d, const void *src,
                                  size_t n, mp_stream_t s) {
  if (++copies == copy_fail_at)
    return mp__fail(MP_EDRIVER, "fake: copy #%u refused", copies);
  return fake_memcpy(dev, d, src, n, s);
}

static mp_device_t *copy_fail_open(void) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  copy_backend = *dev->ops;
  copy_backend.memcpy_async = failing_memcpy;
  dev->ops = &copy_backend;
  copies = copy_fail_at = 0;
  return dev;
}

static void fill(mp_handle_t *h, size_t n, unsigned seed) {
  unsigned char *p = mp_handle_ptr(h);
  for (size_t i = 0; i < n; i++)
    p[i] = (unsigned char)(i * 7 + seed + i / 4096);
}

static bool intact(mp_handle_t *h, size_t n, unsigned seed) {
  unsigned char *p = mp_handle_ptr(h);
  for (size_t i = 0; i < n; i++)
    if (p[i] != (unsigned char)(i * 7 + seed + i / 4096))
      return false;
  return true;
}

/* A 64 KiB movable block slides down by a 4 KiB gap: 16 chunks of the
 * gap's size, each but the first overwriting source bytes already copied.
 * Refused at chunk k, the block must still hold its data at the address
 * its handle gives. */
Test(pool_defrag_faults, a_copy_refused_mid_slide_keeps_the_blocks_data) {
  for (unsigned k = 1; k <= 17; k++) {
    mp_device_t *dev = copy_fail_open();
    mp_pool_t *pool =
        make_pool(dev, "virtual=0,segment_bytes=2M,align=512,max_bytes=64M");
    mp_handle_t *small, *big;
    cr_assert_eq(mp_pool_alloc_movable(pool, 4 * KiB, NULL, &small), MP_OK);
    cr_assert_eq(mp_pool_alloc_movable(pool, 64 * KiB, NULL, &big), MP_OK);
    cr_assert_eq(mp_handle_free(small), MP_OK);
    fill(big, 64 * KiB, k);
    mp_stats_t before = stats(pool);
    copies = 0;
    copy_fail_at = k;
    size_t moved = 0;
    mp_status_t st = mp_pool_defragment(pool, NULL, &moved);
    copy_fail_at = 0;
    if (k <= 16)
      cr_expect_eq(st, MP_EDRIVER, "k=%u: %s", k, mp_status_string(st));
    cr_expect(intact(big, 64 * KiB, k), "k=%u: the block's data is lost", k);
    check(pool);
    mp_stats_t after = stats(pool);
    cr_expect_eq(after.allocated_bytes, before.allocated_bytes);
    cr_expect_eq(after.live_blocks, before.live_blocks);
    cr_assert_eq(mp_handle_free(big), MP_OK);
    fake_pool_finish(pool, dev);
  }
}

/* The same device, whose streams run behind: a copy queued on a stream
 * leaves it busy (its queries, and those of events recorded on it since,
 * say MP_EBUSY) until it is synchronized. The copies still run at once:
 * only what the pool may know of them is held back. */
typedef struct fev {
  mp_stream_t s;
  bool pending;
} fev_t;
static mp_stream_t busy;

static mp_status_t lazy_memcpy(mp_device_t *dev, void *d, const void *src,
                               size_t n, mp_stream_t s) {
  mp_status_t st = failing_memcpy(dev, d, src, n, s);
  if (st == MP_OK)
    busy = s;
  return st;
}
static mp_status_t lazy_event_create(mp_device_t *dev, mp_event_t *out) {
  (void)dev;
  *out = (mp_event_t)calloc(1, sizeof(fev_t));
  return *out ? MP_OK : MP_ENOMEM;
}
static mp_status_t lazy_event_record(mp_device_t *dev, mp_event_t e,
                                     mp_stream_t s) {
  (void)dev;
  ((fev_t *)e)->s = s;
  ((fev_t *)e)->pending = busy != NULL && s == busy;
  return MP_OK;
}
static mp_status_t lazy_event_query(mp_device_t *dev, mp_event_t e) {
  (void)dev;
  fev_t *v = (fev_t *)e;
  return v->pending && v->s == busy ? MP_EBUSY : MP_OK;
}
static mp_status_t lazy_event_sync(mp_device_t *dev, mp_event_t e) {
  (void)dev;
  if (((fev_t *)e)->s == busy)
    busy = NULL;
  return MP_OK;
}
static mp_status_t lazy_stream_query(mp_device_t *dev, mp_stream_t s) {
  (void)dev;
  return busy != NULL && s == busy ? MP_EBUSY : MP_OK;
}
static mp_status_t lazy_stream_sync(mp_device_t *dev, mp_stream_t s) {
  (void)dev;
  if (s == busy)
    busy = NULL;
  return MP_OK;
}
static mp_status_t lazy_sync(mp_device_t *dev) {
  (void)dev;
  busy = NULL;
  return MP_OK;
}

static mp_device_t *lazy_open(void) {
  mp_device_t *dev = copy_fail_open();
  copy_backend.memcpy_async = lazy_memcpy;
  copy_backend.event_create = lazy_event_create;
  copy_backend.event_record = lazy_event_record;
  copy_backend.event_query = lazy_event_query;
  copy_backend.event_synchronize = lazy_event_sync;
  copy_backend.stream_query = lazy_stream_query;
  copy_backend.stream_synchronize = lazy_stream_sync;
  copy_backend.synchronize = lazy_sync;
  busy = NULL;
  return dev;
}

/* Refused part-way, a slide has queued copies on the defragmenting stream
 * that write the free block below the movable one and read and write the
 * block itself (those it made and those that put its bytes back): neither
 * goes to another stream before that stream's work is done. Failed
 * before: another stream got the free block below at once, and after the
 * handle's free the block itself, while the copies were still queued. */
Test(pool_defrag_faults, a_refused_slides_copies_keep_its_memory_from_others) {
  for (int free_block = 0; free_block < 2; free_block++) {
    mp_device_t *dev = lazy_open();
    mp_pool_t *pool =
        make_pool(dev, "virtual=0,segment_bytes=2M,align=512,max_bytes=64M");
    mp_stream_t s, s2;
    cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
    cr_assert_eq(mp_stream_create(dev, &s2), MP_OK);
    mp_handle_t *small, *big;
    cr_assert_eq(mp_pool_alloc_movable(pool, 4 * KiB, NULL, &small), MP_OK);
    cr_assert_eq(mp_pool_alloc_movable(pool, 64 * KiB, NULL, &big), MP_OK);
    uintptr_t lo = (uintptr_t)mp_handle_ptr(small);
    uintptr_t hi = (uintptr_t)mp_handle_ptr(big) + 64 * KiB;
    cr_assert_eq(mp_handle_free(small), MP_OK);
    copies = 0;
    copy_fail_at = 5; /* chunks 1 to 4 copied, then put back */
    cr_assert_eq(mp_pool_defragment(pool, s, NULL), MP_EDRIVER, "%s",
                 mp_last_error());
    copy_fail_at = 0;
    cr_assert_eq((uintptr_t)mp_handle_ptr(big), lo + 4 * KiB);
    cr_assert_eq(busy, s, "the copies left no stream behind");
    size_t want = 4 * KiB;
    if (free_block) {
      cr_assert_eq(mp_handle_free(big), MP_OK);
      want = 64 * KiB;
    }
    void *q;
    cr_assert_eq(mp_pool_alloc(pool, want, s2, &q), MP_OK, "%s",
                 mp_last_error());
    cr_expect((uintptr_t)q + want <= lo || (uintptr_t)q >= hi,
              "%s: another stream got %p in [%p, %p) while the copies on "
              "the defragmenting stream still use it",
              free_block ? "after the handle's free" : "the free block below",
              q, (void *)lo, (void *)hi);
    check(pool);
    cr_assert_eq(mp_pool_free(pool, q), MP_OK);
    if (!free_block)
      cr_assert_eq(mp_handle_free(big), MP_OK);
    fake_pool_finish(pool, dev);
  }
}

/* An evacuation the device refuses at its second block: the first block
 * has moved (its handle names its new home, its data whole), the second
 * stays where it was, and the pool counts what moved. */
Test(pool_defrag_faults, an_evacuation_refused_part_way_counts_what_moved) {
  mp_device_t *dev = copy_fail_open();
  mp_pool_t *pool =
      make_pool(dev, "virtual=0,segment_bytes=2M,align=512,max_bytes=64M");
  void *raw;
  mp_handle_t *m[2], *x[2];
  cr_assert_eq(mp_pool_alloc(pool, MiB, NULL, &raw), MP_OK);
  for (int i = 0; i < 2; i++)
    cr_assert_eq(mp_pool_alloc_movable(pool, MiB / 2, NULL, &m[i]), MP_OK);
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(mp_pool_alloc_movable(pool, MiB / 4, NULL, &x[i]), MP_OK);
    fill(x[i], MiB / 4, 40 + (unsigned)i);
  }
  cr_assert_eq(stats(pool).segment_count, 2);
  uintptr_t x1 = (uintptr_t)mp_handle_ptr(x[1]);
  for (int i = 0; i < 2; i++)
    cr_assert_eq(mp_handle_free(m[i]), MP_OK);
  mp_stats_t before = stats(pool);
  copies = 0;
  copy_fail_at = 2;
  size_t moved = 0;
  cr_assert_eq(mp_pool_defragment(pool, NULL, &moved), MP_EDRIVER);
  copy_fail_at = 0;
  cr_assert_eq(copies, 2, "the test needs an evacuation of two blocks");
  cr_expect_eq(moved, MiB / 4);
  cr_expect_eq((uintptr_t)mp_handle_ptr(x[1]), x1);
  for (int i = 0; i < 2; i++)
    cr_expect(intact(x[i], MiB / 4, 40 + (unsigned)i), "block %d lost data", i);
  check(pool);
  mp_stats_t after = stats(pool);
  cr_expect_eq(after.moved_bytes - before.moved_bytes, moved,
               "the pool counts %llu bytes moved, the call %zu",
               (unsigned long long)(after.moved_bytes - before.moved_bytes),
               moved);
  cr_expect_eq(after.allocated_bytes, before.allocated_bytes);
  cr_expect_eq(after.live_blocks, before.live_blocks);
  for (int i = 0; i < 2; i++)
    cr_assert_eq(mp_handle_free(x[i]), MP_OK);
  cr_assert_eq(mp_pool_free(pool, raw), MP_OK);
  fake_pool_finish(pool, dev);
}

/* A slide down to a freeze's fence out of a free block that reaches below
 * it (the top frozen block freed) cuts that block at the fence first.
 * Refused before a chunk was copied (k = 1) or part-way (k = 2), the
 * block keeps its data where it was and the free space below it is whole
 * again (or kept apart where copies still use it): mp_pool_check passes
 * and a slide that is not refused reaches the fence. */
Test(pool_defrag_faults, a_refused_slide_to_the_fence_leaves_the_pool_whole) {
  for (unsigned k = 1; k <= 2; k++) {
    mp_device_t *dev = copy_fail_open();
    mp_pool_t *pool =
        make_pool(dev, "virtual=0,segment_bytes=2M,align=512,max_bytes=64M");
    mp_handle_t *top, *gap, *late;
    cr_assert_eq(mp_pool_alloc_movable(pool, 32 * KiB, NULL, &top), MP_OK);
    cr_assert_eq(mp_pool_freeze(pool), MP_OK, "%s", mp_last_error());
    uintptr_t fence = (uintptr_t)mp_handle_ptr(top) + 32 * KiB;
    cr_assert_eq(mp_pool_alloc_movable(pool, 32 * KiB, NULL, &gap), MP_OK);
    cr_assert_eq(mp_pool_alloc_movable(pool, 128 * KiB, NULL, &late), MP_OK);
    uintptr_t at = (uintptr_t)mp_handle_ptr(late);
    cr_assert_eq(at, fence + 32 * KiB);
    fill(late, 128 * KiB, k);
    cr_assert_eq(mp_handle_free(gap), MP_OK);
    cr_assert_eq(mp_handle_free(top), MP_OK);
    mp_stats_t before = stats(pool);
    copies = 0;
    copy_fail_at = k;
    cr_expect_eq(mp_pool_defragment(pool, NULL, NULL), MP_EDRIVER, "k=%u", k);
    copy_fail_at = 0;
    cr_expect_eq((uintptr_t)mp_handle_ptr(late), at, "k=%u", k);
    cr_expect(intact(late, 128 * KiB, k), "k=%u: the block's data is lost", k);
    check(pool);
    mp_stats_t after = stats(pool);
    cr_expect_eq(after.allocated_bytes, before.allocated_bytes);
    if (k == 1)
      cr_expect_eq(after.free_blocks, before.free_blocks, "k=1: not joined");
    cr_assert_eq(mp_pool_defragment(pool, NULL, NULL), MP_OK, "%s",
                 mp_last_error());
    cr_expect_eq((uintptr_t)mp_handle_ptr(late), fence, "k=%u", k);
    cr_expect(intact(late, 128 * KiB, k), "k=%u: the moved data", k);
    check(pool);
    cr_assert_eq(mp_handle_free(late), MP_OK);
    fake_pool_finish(pool, dev);
  }
}
