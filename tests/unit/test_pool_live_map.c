/* The live map: open addressing, linear probing, backward-shift removal
 * (block.c). Probe runs that go on past the last home slot (into the
 * slots after it, mp__map_slots) are where the removal's "may this entry
 * move into the hole" rule is easiest to get wrong. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "pool/pool_internal.h"

#define NREC  48 /* below an eighth of the first table (512 home slots) */
#define NFULL 64 /* an eighth: as many as the first table takes */

static mp_pool_t *map_pool(void) {
  mp_pool_t *p = calloc(1, sizeof *p);
  cr_assert_not_null(p);
  cr_assert(mp__map_reserve(p, 1));
  cr_assert_eq(p->map_cap, 512);
  return p;
}

/* n block addresses whose home slot is one of the table's last `span`
 * home slots: inserted together, their probe run goes past the last. */
static void addrs_near_the_end(const mp_pool_t *p, uintptr_t *out, size_t n,
                               size_t span) {
  size_t k = 0;
  for (uintptr_t a = 512; k < n; a += 512)
    if (mp__map_slot(p, a) >= p->map_cap - span)
      out[k++] = a;
}

/* Every record not yet removed is found at its address, every removed
 * one is not, and the occupied slots are exactly mp__map_count. */
static void expect_map_holds(const mp_pool_t *p, mp__block_t *recs,
                             const bool *gone, size_t n) {
  size_t live = 0;
  for (size_t i = 0; i < n; i++) {
    mp__block_t *f = mp__map_find(p, recs[i].addr);
    if (gone[i]) {
      cr_expect_null(f, "removed block %zu still found", i);
    } else {
      cr_expect_eq(f, &recs[i], "block %zu not found after a removal", i);
      live++;
    }
  }
  size_t used = 0;
  for (size_t s = 0; s < mp__map_slots(p->map_cap); s++)
    used += p->map[s].addr != 0;
  cr_expect_eq(mp__map_count(p), live);
  cr_expect_eq(used, live);
  /* The last slot ends every probe run. */
  cr_expect_eq(p->map[mp__map_slots(p->map_cap) - 1].addr, 0);
}

/* n records (n <= NFULL), homes in the last `span` home slots, removed
 * in the order i, i + step, ... (step coprime to n: each once). */
static void remove_in_order(size_t n, size_t span, size_t step) {
  mp_pool_t *p = map_pool();
  static mp__block_t recs[NFULL];
  uintptr_t a[NFULL];
  bool gone[NFULL] = {false};
  addrs_near_the_end(p, a, n, span);
  for (size_t i = 0; i < n; i++) {
    recs[i].addr = a[i];
    cr_assert(mp__map_insert(p, &recs[i]));
  }
  expect_map_holds(p, recs, gone, n);
  for (size_t k = 0, i = 0; k < n; k++, i = (i + step) % n) {
    mp__map_remove(p, &recs[i]);
    gone[i] = true;
    expect_map_holds(p, recs, gone, n);
  }
  free(p->map);
  free(p);
}

Test(pool_live_map, removal_keeps_a_run_past_the_last_home_slot_findable) {
  remove_in_order(NREC, 4, 7);
  remove_in_order(NREC, 4, 41);
}

Test(pool_live_map, removal_keeps_runs_of_mixed_homes_findable) {
  remove_in_order(NREC, 32, 5);
  remove_in_order(NREC, 128, 11);
}

/* The longest run the table can hold: as many entries as it takes, all
 * at home in the last home slot, reach the next-to-last slot of all. */
Test(pool_live_map, a_full_table_run_from_the_last_home_slot_stays_inside) {
  mp_pool_t *p = map_pool();
  static mp__block_t more;
  remove_in_order(NFULL, 1, 13);
  remove_in_order(NFULL, 1, 63);
  /* An eighth is all the first table takes: one more grows it. */
  uintptr_t a[NFULL];
  static mp__block_t recs[NFULL];
  addrs_near_the_end(p, a, NFULL, 1);
  for (size_t i = 0; i < NFULL; i++) {
    recs[i].addr = a[i];
    cr_assert(mp__map_insert(p, &recs[i]));
  }
  cr_expect_eq(p->map_cap, 512);
  cr_expect_neq(p->map[mp__map_slots(512) - 2].addr, 0, "the run's end");
  bool gone[NFULL] = {false};
  expect_map_holds(p, recs, gone, NFULL);
  more.addr = a[NFULL - 1] + 512; /* above every other */
  cr_assert(mp__map_insert(p, &more));
  cr_expect_eq(p->map_cap, 1024);
  cr_expect_eq(mp__map_count(p), NFULL + 1);
  cr_expect_eq(mp__map_find(p, more.addr), &more);
  for (size_t i = 0; i < NFULL; i++)
    cr_expect_eq(mp__map_find(p, recs[i].addr), &recs[i]);
  free(p->map);
  free(p);
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
  expect_map_holds(p, recs, gone, NREC);
  free(p->map);
  free(p);
}

/* A new pool's map (mp__map_init) holds no table of its own: every
 * lookup misses without a test of map_cap, and the first insert grows a
 * table of 512 home slots (the shared empty one is read-only: a write to
 * it would crash here). */
Test(pool_live_map, a_new_pools_map_finds_nothing_and_grows_on_first_insert) {
  mp_pool_t *p = calloc(1, sizeof *p);
  cr_assert_not_null(p);
  mp__map_init(p);
  cr_expect_eq(p->map_cap, 0);
  for (uintptr_t a = 512; a < 512 * 1000; a += 512)
    cr_expect_null(mp__map_find(p, a));
  static mp__block_t rec, other;
  rec.addr = 512 * 77;
  other.addr = 512 * 78;
  mp__map_remove(p, &other); /* absent: changes nothing */
  cr_assert(mp__map_insert(p, &rec));
  cr_expect_eq(p->map_cap, 512);
  cr_expect_eq(mp__map_count(p), 1);
  cr_expect_eq(mp__map_find(p, rec.addr), &rec);
  cr_expect_null(mp__map_find(p, other.addr));
  free(p->map);
  free(p);
}
