/* The live map: open addressing, linear probing, backward-shift removal
 * (block.c). Probe runs that wrap past the table's end are where the
 * removal's "may this entry move into the hole" rule is easiest to get
 * wrong. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "pool/pool_internal.h"

#define NREC 48 /* below a quarter of the first table (256 slots) */

static mp_pool_t *map_pool(void) {
  mp_pool_t *p = calloc(1, sizeof *p);
  cr_assert_not_null(p);
  cr_assert(mp__map_reserve(p, 1));
  cr_assert_eq(p->map_cap, 256);
  return p;
}

/* n block addresses whose home slot is one of the table's last `span`
 * slots: inserted together, their probe run wraps past the end. */
static void addrs_near_the_end(const mp_pool_t *p, uintptr_t *out, size_t n,
                               size_t span) {
  size_t k = 0;
  for (uintptr_t a = 512; k < n; a += 512)
    if (mp__map_slot(p, a) >= p->map_cap - span)
      out[k++] = a;
}

/* Every record not yet removed is found at its address, every removed
 * one is not, and the occupied slots are exactly map_count. */
static void expect_map_holds(const mp_pool_t *p, mp__block_t *recs,
                             const bool *gone) {
  size_t live = 0;
  for (size_t i = 0; i < NREC; i++) {
    mp__block_t *f = mp__map_find(p, recs[i].addr);
    if (gone[i]) {
      cr_expect_null(f, "removed block %zu still found", i);
    } else {
      cr_expect_eq(f, &recs[i], "block %zu not found after a removal", i);
      live++;
    }
  }
  size_t used = 0;
  for (size_t s = 0; s < p->map_cap; s++)
    used += p->map[s].addr != 0;
  cr_expect_eq(p->map_count, live);
  cr_expect_eq(used, live);
}

static void remove_in_order(size_t span, size_t step) {
  mp_pool_t *p = map_pool();
  static mp__block_t recs[NREC];
  uintptr_t a[NREC];
  bool gone[NREC] = {false};
  addrs_near_the_end(p, a, NREC, span);
  for (size_t i = 0; i < NREC; i++) {
    recs[i].addr = a[i];
    cr_assert(mp__map_insert(p, &recs[i]));
  }
  expect_map_holds(p, recs, gone);
  /* step is coprime to NREC: every record once, in a scrambled order. */
  for (size_t k = 0, i = 0; k < NREC; k++, i = (i + step) % NREC) {
    mp__map_remove(p, &recs[i]);
    gone[i] = true;
    expect_map_holds(p, recs, gone);
  }
  free(p->map);
  free(p);
}

Test(pool_live_map, removal_keeps_a_run_wrapping_past_the_end_findable) {
  remove_in_order(4, 7);
  remove_in_order(4, 41);
}

Test(pool_live_map, removal_keeps_runs_of_mixed_homes_findable) {
  remove_in_order(32, 5);
  remove_in_order(128, 11);
}

Test(pool_live_map, removing_an_absent_block_changes_nothing) {
  mp_pool_t *p = map_pool();
  static mp__block_t recs[NREC];
  uintptr_t a[NREC];
  bool gone[NREC] = {false};
  addrs_near_the_end(p, a, NREC, 4);
  for (size_t i = 0; i < NREC; i++) {
    recs[i].addr = a[i];
    if (i + 1 < NREC)
      cr_assert(mp__map_insert(p, &recs[i]));
  }
  gone[NREC - 1] = true; /* never inserted */
  mp__map_remove(p, &recs[NREC - 1]);
  expect_map_holds(p, recs, gone);
  free(p->map);
  free(p);
}
