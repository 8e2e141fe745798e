/* test_pool_pausable_range_full.c - a pausable pool (pausable=1) whose
 * virtual range has no place left for a request under its cap (the range
 * reserved for the cap of the moment where the address space could not
 * hold the device's size, the cap raised after) takes no plain segment:
 * the allocation fails MP_ENOMEM, as the out-of-memory ladder's trim
 * expects, and its message says the pool's virtual range is full. Before,
 * it read as the device out of memory ("out of device memory: asked 36.00
 * MiB, reserved 6.00 MiB") on a 1 GiB device with room under the cap. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

/* A 1 GiB device, 2 MiB granules, whose address space holds 64 MiB: a
 * pool capped at 16 MiB reserves a range of 32 MiB, then its cap goes to
 * the device's size. 6 MiB live. */
static mp_pool_t *raised_cap_pool(mp_device_t **dev, const char *opts,
                                  void **live) {
  *dev = fake_open((size_t)1 << 30, 2 * MiB);
  fake_of(*dev)->max_reserve = 64 * MiB; /* 2 x 1 GiB does not fit */
  mp_pool_t *p = make_pool(*dev, opts);
  cr_assert_eq(mp_pool_alloc(p, 6 * MiB, NULL, live), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_set_max_fraction(p, 1.0), MP_OK, "%s", mp_last_error());
  return p;
}

/* What the range still holds is served, and the pool, with no plain
 * segment, still pauses (its content not kept); then it goes. */
static void served_then_finish(mp_pool_t *p, mp_device_t *dev, void *live) {
  void *x;
  cr_expect_eq(mp_pool_alloc(p, 16 * MiB, NULL, &x), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_pause(p, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_resume(p), MP_OK, "%s", mp_last_error());
  void *ptrs[] = {x, live};
  for (size_t i = 0; i < 2; i++)
    cr_expect_eq(mp_pool_free(p, ptrs[i]), MP_OK, "%s", mp_last_error());
  fake_pool_finish(p, dev);
}

Test(pool_pausable_range_full, a_full_range_says_so) {
  mp_device_t *dev;
  void *live, *x = NULL;
  mp_pool_t *p = raised_cap_pool(&dev, "max_bytes=16M,pausable=1", &live);
  mp_status_t st = mp_pool_alloc(p, 36 * MiB, NULL, &x);
  const char *e = mp_last_error();
  cr_expect_eq(st, MP_ENOMEM, "%s: %s", mp_status_name(st), e);
  cr_expect(strstr(e, "virtual range") != NULL && strstr(e, "full") != NULL,
            "no word of the full range: %s", e);
  cr_expect(strstr(e, "32.00 MiB") != NULL, "the range's size: %s", e);
  cr_expect(strstr(e, "pausable=0 allows plain segments)") != NULL,
            "what to configure, the note whole: %s", e);
  cr_expect_eq(fake_of(dev)->used, 6 * MiB, "a plain segment was taken");
  served_then_finish(p, dev, live);
}

/* The device out of memory with room in the range is still the device's
 * answer, not the range's. */
Test(pool_pausable_range_full, a_device_out_of_memory_is_no_full_range) {
  mp_device_t *dev;
  void *live, *x = NULL;
  mp_pool_t *p = raised_cap_pool(&dev, "max_bytes=16M,pausable=1", &live);
  fake_of(dev)->capacity = 10 * MiB;
  mp_status_t st = mp_pool_alloc(p, 16 * MiB, NULL, &x);
  const char *e = mp_last_error();
  cr_expect_eq(st, MP_ENOMEM, "%s: %s", mp_status_name(st), e);
  cr_expect(strstr(e, "out of device memory") != NULL, "%s", e);
  cr_expect(strstr(e, "virtual range") == NULL, "%s", e);
  fake_of(dev)->capacity = (size_t)1 << 30;
  served_then_finish(p, dev, live);
}
