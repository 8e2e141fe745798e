/* test_pool_arenas_pausable_range_full.c - a pausable pool with arenas
 * (pausable=1, arenas=2) whose arena's virtual range has no place left for
 * a request under the cap (the range reserved for the cap of the moment
 * where the address space could not hold the device's size, the cap
 * raised after) fails MP_ENOMEM with a message that says the arena's
 * virtual range is full, as test_pool_pausable_range_full.c checks for a
 * pool without arenas. Before, the arenas' message asked the pool, which
 * has no range of its own, and read as the device out of memory ("out of
 * device memory: asked 36.00 MiB; the pool's 2 arenas reserved ...") on a
 * 1 GiB device with room under the cap (arena.c). */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "pool_fakedev.h"

#define MiB ((size_t)1 << 20)

/* A request of `asked` after 6 MiB live, the device's capacity lowered to
 * capacity (0: 1 GiB kept), fails MP_ENOMEM; full: its message names the
 * arena's full range (32 MiB), else the device's refusal alone. */
static void ask(size_t asked, size_t capacity, bool full) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 2 * MiB);
  fake_of(dev)->max_reserve = 64 * MiB; /* 2 x 1 GiB does not fit */
  mp_pool_t *p = make_pool(dev, "max_bytes=16M,pausable=1,arenas=2");
  void *live, *x = NULL;
  cr_assert_eq(mp_pool_alloc(p, 6 * MiB, NULL, &live), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_set_max_fraction(p, 1.0), MP_OK, "%s", mp_last_error());
  if (capacity != 0)
    fake_of(dev)->capacity = capacity;
  mp_status_t st = mp_pool_alloc(p, asked, NULL, &x);
  const char *e = mp_last_error();
  cr_expect_eq(st, MP_ENOMEM, "%s: %s", mp_status_name(st), e);
  cr_expect_eq(strstr(e, "the arena's virtual range of 32.00 MiB is full") !=
                   NULL,
               full, "the arena's full range named or not (%d): %s", full, e);
  cr_expect_eq(strstr(e, "pausable=0 allows plain segments)") != NULL, full,
               "what to configure, the note whole: %s", e);
  cr_expect(strstr(e, "out of device memory") != NULL, "%s", e);
  fake_of(dev)->capacity = (size_t)1 << 30;
  cr_expect_eq(fake_of(dev)->used, 6 * MiB, "a plain segment was taken");
  cr_expect_eq(mp_pool_free(p, live), MP_OK, "%s", mp_last_error());
  fake_pool_finish(p, dev);
}

Test(pool_arenas_pausable_range_full, a_full_range_says_so) {
  ask(36 * MiB, 0, true);
}

/* The device out of memory with room in the range is still the device's
 * answer, not the range's. */
Test(pool_arenas_pausable_range_full, a_device_out_of_memory_is_no_full_range) {
  ask(16 * MiB, 10 * MiB, false);
}
