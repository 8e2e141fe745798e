/* A stray (vrange.c) is a mapping the pool made but could not unmap: a
 * peer's access to it was refused, then its unmap too. It holds device
 * memory until the device takes it back, so reserved_bytes (and its peak)
 * counts it, as does the cap, and growth never maps over it: it is
 * unmapped first, and where the device still refuses, growth maps around
 * it. White-box, on the fake device (flaky_unmap.h) whose unmaps of one
 * range (stuck_at) are refused until unstuck. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "flaky_unmap.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

/* Unmaps of the granule at stuck are refused (0: none). */
static uintptr_t stuck;
static mp__backend_t stuck_backend;

static mp_status_t stuck_vm_unmap(mp_device_t *dev, void *addr, size_t bytes) {
  if (stuck != 0 && (uintptr_t)addr == stuck)
    return mp__fail(MP_EDRIVER, "fake vm_unmap: %p is stuck", addr);
  return flaky_vm_unmap(dev, addr, bytes);
}

/* The flaky device with the stuck granule, its peer, and a pool that has
 * the peer and one 2 MiB block (*held). */
static mp_pool_t *stuck_pool(mp_device_t **dev, mp_device_t **peer,
                             const char *opts, void **held) {
  *dev = flaky_open(0);
  stuck_backend = flaky_backend;
  stuck_backend.vm_unmap = stuck_vm_unmap;
  (*dev)->ops = &stuck_backend;
  stuck = 0;
  *peer = flaky_peer_open();
  (*peer)->ops = &stuck_backend; /* a device of the pool's kind */
  mp_pool_t *p = make_pool(*dev, opts);
  cr_assert_eq(mp_pool_set_access(p, *peer), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, held), MP_OK);
  return p;
}

/* A stray of one granule at a (flaky_map_directly): the map is refused
 * to the peer, and its unmap, and every unmap there until unstuck. */
static void stray_at(mp_pool_t *p, uintptr_t a) {
  stuck = a;
  access_fail_at = access_calls + 1;
  mp_status_t st = flaky_map_directly(p, a, 2 * MiB);
  cr_assert_eq(st, MP_EDRIVER, "%s", mp_last_error());
}

static uintptr_t top_of(const mp_pool_t *p) {
  return p->vseg->base + p->vseg->span;
}

/* The pool's reserved bytes are the device's, and the pool checks. */
static void expect_device_held(mp_pool_t *p, mp_device_t *dev) {
  cr_expect_eq(stats(p).reserved_bytes, fake_of(dev)->used,
               "the pool %zu bytes, the device %zu", stats(p).reserved_bytes,
               fake_of(dev)->used);
  check(p);
}

/* A block of n bytes in *out, not on the stray at a (one granule). */
static void alloc_around(mp_pool_t *p, mp_device_t *dev, size_t n, uintptr_t a,
                         void **out) {
  cr_assert_eq(mp_pool_alloc(p, n, NULL, out), MP_OK, "%s", mp_last_error());
  uintptr_t b = (uintptr_t)*out;
  cr_expect(b + n <= a || b >= a + 2 * MiB, "%p is on the stray at %p", *out,
            (void *)a);
  expect_device_held(p, dev);
}

/* Unsticks the stray, frees the n blocks v[i], and as fake_pool_finish
 * (the device holds nothing after destroy). */
static void finish(mp_pool_t *p, mp_device_t *dev, mp_device_t *peer,
                   void *const *v, int n) {
  stuck = 0;
  for (int i = 0; i < n; i++)
    cr_assert_eq(mp_pool_free(p, v[i]), MP_OK);
  fake_pool_finish(p, dev);
  fake_close(peer);
}

/* A growth's map refused to the peer and then its unmap: the stray holds
 * device memory, and the stats say so (reserved and its peak, as the
 * device's own figure) until a trim unmaps it, nothing of it free to
 * serve. Before, reserved read 2 MiB while the device held 4. */
Test(pool_stray_mappings, a_stray_counts_in_reserved_bytes_until_unmapped) {
  mp_device_t *dev, *peer;
  void *v;
  mp_pool_t *p = stuck_pool(&dev, &peer, NULL, &v);
  stuck = top_of(p);
  access_fail_at = access_calls + 1;
  void *x;
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &x), MP_EDRIVER);
  cr_assert_eq(fake_of(dev)->used, 4 * MiB, "the stray is mapped");
  mp_stats_t s = stats(p);
  cr_expect_eq(s.reserved_bytes, 4 * MiB, "reserved %zu, the device 4 MiB",
               s.reserved_bytes);
  cr_expect_eq(s.peak_reserved_bytes, 4 * MiB);
  cr_expect_eq(s.free_bytes, 0, "a stray serves nothing: %zu free",
               s.free_bytes);
  check(p);
  cr_expect_eq(mp_pool_trim(p, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(p).reserved_bytes, 4 * MiB, "refused again, still held");
  stuck = 0;
  cr_expect_eq(mp_pool_trim(p, 0), MP_OK, "%s", mp_last_error());
  s = stats(p);
  cr_expect_eq(fake_of(dev)->used, 2 * MiB, "the trim unmapped the stray");
  cr_expect_eq(s.reserved_bytes, 2 * MiB);
  cr_expect_eq(s.peak_reserved_bytes, 4 * MiB);
  finish(p, dev, peer, &v, 1);
}

/* The stray lies at the top, where the next growth would map, and the
 * device keeps refusing its unmap: the growth maps above it, leaving it
 * in a hole of its own. Before, every growth chose that place again and
 * failed (MP_EDRIVER, "still mapped"): the pool could not grow at all. */
Test(pool_stray_mappings, growth_maps_around_a_stray_at_the_top) {
  mp_device_t *dev, *peer;
  void *v[2];
  mp_pool_t *p = stuck_pool(&dev, &peer, NULL, &v[0]);
  uintptr_t a = top_of(p);
  stray_at(p, a);
  alloc_around(p, dev, 2 * MiB, a, &v[1]);
  cr_expect_eq(fake_of(dev)->used, 6 * MiB);
  finish(p, dev, peer, v, 2);
}

/* The stray lies in a hole whose free neighbour makes it growth's best
 * place (2 MiB to map there, 4 at the top): the growth maps at the top
 * instead. Before: MP_EDRIVER, "still mapped". */
Test(pool_stray_mappings, growth_maps_around_a_stray_in_a_hole) {
  mp_device_t *dev, *peer;
  void *v[5];
  mp_pool_t *p = stuck_pool(&dev, &peer, NULL, &v[0]);
  for (int i = 1; i < 4; i++)
    cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &v[i]), MP_OK);
  cr_assert_eq(p->vseg->nchunks, 4, "the test needs four chunks");
  uintptr_t a = (uintptr_t)v[1];
  cr_assert_eq(mp_pool_free(p, v[1]), MP_OK);
  cr_assert_eq(mp_pool_trim(p, 0), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(p, v[2]), MP_OK);
  cr_assert_eq(p->vseg->nholes, 1, "a hole where v[1] was");
  stray_at(p, a);
  alloc_around(p, dev, 4 * MiB, a, &v[4]);
  v[1] = v[3];
  v[2] = v[4];
  finish(p, dev, peer, v, 3);
}

/* The growth's step (segment_bytes=8M: 8 MiB mapped for a 2 MiB request)
 * would cover a stray 4 MiB above the top: it maps only what the request
 * needs. Before, the step mapped over it: MP_EDRIVER, "still mapped". */
Test(pool_stray_mappings, a_growth_step_stops_short_of_a_stray) {
  mp_device_t *dev, *peer;
  void *v[2];
  mp_pool_t *p = stuck_pool(&dev, &peer, "segment_bytes=8M", &v[0]);
  cr_assert_eq(mp_pool_free(p, v[0]), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 8 * MiB, NULL, &v[0]), MP_OK);
  cr_assert_eq(stats(p).free_bytes, 0, "the test needs no free memory");
  uintptr_t a = top_of(p) + 4 * MiB;
  stray_at(p, a);
  alloc_around(p, dev, 2 * MiB, a, &v[1]);
  finish(p, dev, peer, v, 2);
}

/* A stray counts against max_bytes: with 2 MiB held, a stray of 2 and a
 * cap of 6, one more 2 MiB block fits and the next is MP_ELIMIT, the
 * device never holding more than the cap. Before, the pool mapped a
 * third granule beside the stray: the device held 8 MiB under a 6 MiB
 * cap. */
Test(pool_stray_mappings, a_stray_counts_against_the_cap) {
  mp_device_t *dev, *peer;
  void *v[3];
  mp_pool_t *p = stuck_pool(&dev, &peer, "max_bytes=6M", &v[0]);
  stray_at(p, top_of(p) + 4 * MiB);
  cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &v[1]), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_alloc(p, 2 * MiB, NULL, &v[2]), MP_ELIMIT);
  cr_expect_eq(fake_of(dev)->used, 6 * MiB);
  expect_device_held(p, dev);
  finish(p, dev, peer, v, 2);
}

/* mp_pool_mem_info: a stray is no idle cache, and it holds room under
 * the cap as the live blocks do: with 2 MiB held, a stray of 2 and a cap
 * of 6, 2 MiB are free. Before, 4 (the cap less the live blocks). */
Test(pool_stray_mappings, mem_info_leaves_a_stray_out_of_free) {
  mp_device_t *dev, *peer;
  void *v;
  mp_pool_t *p = stuck_pool(&dev, &peer, "max_bytes=6M", &v);
  stray_at(p, top_of(p) + 4 * MiB);
  size_t free_b = 0, total = 0;
  cr_assert_eq(mp_pool_mem_info(p, &free_b, &total), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(free_b, 2 * MiB, "free %zu", free_b);
  cr_expect_eq(total, 6 * MiB);
  finish(p, dev, peer, &v, 1);
}
