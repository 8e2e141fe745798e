/* Defragmentation when the device refuses a copy part-way (defrag.c): the
 * call fails, every handle still names its block's data, whole, and the
 * pool is consistent (mp_pool_check) with its counts as before. */
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
