/* Growth past the peak (the virtual range, default config) first gives
 * back as much free memory as it maps, not only what it lifts reserved
 * past the peak: where a trim left reserved below its peak, the free
 * chunks scattered among live blocks make way for the new memory
 * (vrange.c, mp__vrange_grow; history.md, 2026-12-06 helper-251). Under a
 * split limit or map_piece only what passes the peak goes back. On the
 * synchronous fake device, 2 MiB granule: every 2 MiB block is one chunk. */
#include <criterion/criterion.h>
#include <stdint.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

/* Six 2 MiB blocks, one chunk each (12 MiB, the peak); the top one freed
 * and trimmed (10 MiB reserved), then v[1] and v[3] freed: 4 MiB free in
 * two chunks between live blocks. A 4 MiB request fits neither, so it maps
 * 4 MiB at the top, 2 MiB past the peak. Returns the unmaps so far. */
static unsigned two_free_chunks_below_the_peak(mp_pool_t *p, mp_device_t *dev,
                                               void *v[6]) {
  for (int i = 0; i < 6; i++)
    cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &v[i]), MP_OK);
  for (int i = 1; i < 6; i++)
    cr_assert_eq((uintptr_t)v[i], (uintptr_t)v[i - 1] + 2 * MiB);
  cr_assert_eq(stats(p).peak_reserved_bytes, 12 * MiB);
  cr_assert_eq(mp_pool_free(p, v[5]), MP_OK);
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK);
  cr_assert_eq(stats(p).reserved_bytes, 10 * MiB);
  cr_assert_eq(mp_pool_free(p, v[1]), MP_OK);
  cr_assert_eq(mp_pool_free(p, v[3]), MP_OK);
  return fake_of(dev)->unmaps;
}

static void finish(mp_pool_t *p, mp_device_t *dev, void *v[6], void *x) {
  check(p);
  mp_pool_free(p, v[0]);
  mp_pool_free(p, v[2]);
  mp_pool_free(p, v[4]);
  mp_pool_free(p, x);
  fake_pool_finish(p, dev);
}

Test(pool_growth_past_peak, gives_back_as_much_free_memory_as_it_maps) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  mp_pool_t *p = make_pool(dev, NULL);
  void *v[6], *x;
  unsigned unmaps = two_free_chunks_below_the_peak(p, dev, v);
  cr_assert_eq(mp_pool_alloc(p, 4 * MiB, NULL, &x), MP_OK);
  cr_expect_eq((uintptr_t)x, (uintptr_t)v[4] + 2 * MiB, "at the top");
  mp_stats_t s = stats(p);
  cr_expect_eq(fake_of(dev)->unmaps, unmaps + 2,
               "both free chunks went back, not only v[1]'s");
  cr_expect_eq(s.reserved_bytes, 10 * MiB,
               "12 MiB when only what passes the peak went back");
  cr_expect_eq(s.peak_reserved_bytes, 12 * MiB);
  finish(p, dev, v, x);
}

Test(pool_growth_past_peak, gives_back_only_what_passes_it_under_map_piece) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  mp_pool_t *p = make_pool(dev, "map_piece=2M");
  void *v[6], *x;
  unsigned unmaps = two_free_chunks_below_the_peak(p, dev, v);
  cr_assert_eq(mp_pool_alloc(p, 4 * MiB, NULL, &x), MP_OK);
  mp_stats_t s = stats(p);
  cr_expect_eq(fake_of(dev)->unmaps, unmaps + 1, "v[1]'s chunk alone");
  cr_expect_eq(s.reserved_bytes, 12 * MiB);
  cr_expect_eq(s.peak_reserved_bytes, 12 * MiB);
  finish(p, dev, v, x);
}
