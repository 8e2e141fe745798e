/* test_pool_trim_unmap_refused.c - mp_pool_trim on a pool's virtual range
 * when the device refuses to unmap one free chunk (flaky_unmap.h): that
 * chunk stays mapped and the pool's, free; the chunks below it are still
 * unmapped; and the trim returns the device's status, saying what stays.
 * Before, the first refused unmap ended the trim, keeping every free chunk
 * below it mapped, and the trim said MP_OK. A trim keeping some bytes
 * picks chunks one by one: there the first refusal ended the picking,
 * keeping the other free chunks mapped, until 2026-12-07. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "flaky_unmap.h"

#define MiB ((size_t)1 << 20)

/* The chunk the device refuses to unmap, every time asked (NULL: none). */
static void *refused_chunk;

static mp_status_t refusing_vm_unmap(mp_device_t *dev, void *addr,
                                     size_t bytes) {
  if (refused_chunk != NULL && (char *)refused_chunk >= (char *)addr &&
      (char *)refused_chunk < (char *)addr + bytes)
    return mp__fail(MP_EDRIVER, "fake vm_unmap of %p refused", addr);
  return flaky_vm_unmap(dev, addr, bytes);
}

/* A pool whose range holds three free 2 MiB chunks, their addresses in b
 * (lowest first). */
static mp_pool_t *three_free_chunks(mp_device_t *dev, void *b[3]) {
  mp_pool_t *p = make_pool(dev, "segment_bytes=2M");
  for (size_t i = 0; i < 3; i++)
    cr_assert_eq(mp_pool_alloc(p, 2 * MiB, NULL, &b[i]), MP_OK, "%s",
                 mp_last_error());
  for (size_t i = 0; i < 3; i++)
    cr_assert_eq(mp_pool_free(p, b[i]), MP_OK);
  cr_assert_eq(fake_of(dev)->used, 6 * MiB);
  return p;
}

static void trim_all_and_destroy(mp_device_t *dev, mp_pool_t *p) {
  cr_expect_eq(mp_pool_trim(p, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(fake_of(dev)->used, 0);
  cr_expect_eq(stats(p).reserved_bytes, 0);
  check(p);
  cr_expect_eq(mp_pool_destroy(p), MP_OK, "%s", mp_last_error());
  fake_close(dev);
}

/* The device refuses the chunk holding b[k] at every try of a trim keeping
 * keep bytes free: only that one stays; the trim says so where more than
 * keep stays free (want), and once the device takes it a trim does. */
static void trim_with_chunk_refused(size_t k, size_t keep, mp_status_t want) {
  mp_device_t *dev = flaky_open(0);
  flaky_backend.vm_unmap = refusing_vm_unmap;
  void *b[3];
  mp_pool_t *p = three_free_chunks(dev, b);
  refused_chunk = b[k];
  mp_status_t st = mp_pool_trim(p, keep);
  refused_chunk = NULL;
  cr_expect_eq(st, want, "%s: %s", mp_status_name(st), mp_last_error());
  if (want != MP_OK)
    cr_expect(
        strstr(mp_last_error(), "mp_pool_trim: the device refused") != NULL &&
            strstr(mp_last_error(), "2.00 MiB free stays reserved") != NULL &&
            strstr(mp_last_error(), "fake vm_unmap") != NULL,
        "%s", mp_last_error());
  cr_expect_eq(fake_of(dev)->used, 2 * MiB,
               "%zu bytes still mapped: only the refused chunk may be",
               fake_of(dev)->used);
  cr_expect_eq(stats(p).reserved_bytes, 2 * MiB);
  check(p);
  trim_all_and_destroy(dev, p);
}

Test(pool_trim_unmap_refused, the_top_chunk_refused_keeps_none_below) {
  trim_with_chunk_refused(2, 0, MP_EDRIVER);
}

Test(pool_trim_unmap_refused, a_middle_chunk_refused_keeps_only_itself) {
  trim_with_chunk_refused(1, 0, MP_EDRIVER);
}

/* Refused once (a transient error): asked again in the same trim, it goes
 * too, and the trim is MP_OK. */
Test(pool_trim_unmap_refused, a_chunk_refused_once_goes_at_the_next_try) {
  mp_device_t *dev = flaky_open(0);
  void *b[3];
  mp_pool_t *p = three_free_chunks(dev, b);
  unmap_calls = 0;
  unmap_fail_at = 1;
  mp_status_t st = mp_pool_trim(p, 0);
  unmap_fail_at = 0;
  cr_expect_eq(st, MP_OK, "%s", mp_last_error());
  cr_expect_eq(fake_of(dev)->used, 0, "%zu bytes still mapped",
               fake_of(dev)->used);
  trim_all_and_destroy(dev, p);
}

/* A trim keeping some bytes picks chunks one by one: the refused one is
 * passed over and the others go. Keeping 2 MiB, the refused chunk is what
 * is kept, so the trim is MP_OK; keeping 1 MiB, it says the device refused. */
Test(pool_trim_unmap_refused, keeping_bytes_the_lowest_refused_others_go) {
  trim_with_chunk_refused(0, 2 * MiB, MP_OK);
}

Test(pool_trim_unmap_refused, keeping_bytes_the_middle_refused_others_go) {
  trim_with_chunk_refused(1, 2 * MiB, MP_OK);
}

Test(pool_trim_unmap_refused, keeping_less_than_the_refused_chunk_says_so) {
  trim_with_chunk_refused(0, 1 * MiB, MP_EDRIVER);
}
