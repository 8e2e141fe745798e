/* The address map every pointer table of the library is built on: found,
 * replaced, removed and iterated exactly as a plain array of the same
 * entries says, through growth and backward-shift deletion. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "internal.h"

typedef struct entry {
  uintptr_t key;
  size_t val;
} entry_t;

Test(ptrmap, empty_map_finds_nothing_and_zero_is_never_a_key) {
  mp__ptrmap_t m;
  mp__ptrmap_init(&m, sizeof(entry_t));
  cr_expect_null(mp__ptrmap_find(&m, 0x1000));
  cr_expect_not(mp__ptrmap_take(&m, 0x1000, NULL));
  cr_expect_null(mp__ptrmap_put(&m, 0));
  cr_expect_eq(m.count, 0);
  mp__ptrmap_destroy(&m);
}

Test(ptrmap, put_returns_the_existing_entry_for_a_known_key) {
  mp__ptrmap_t m;
  mp__ptrmap_init(&m, sizeof(entry_t));
  entry_t *e = mp__ptrmap_put(&m, 0x4000);
  cr_assert_not_null(e);
  cr_expect_eq(e->key, 0x4000);
  cr_expect_eq(e->val, 0, "a new entry is zeroed past its key");
  e->val = 7;
  entry_t *again = mp__ptrmap_put(&m, 0x4000);
  cr_expect_eq(again, e);
  cr_expect_eq(again->val, 7);
  cr_expect_eq(m.count, 1);
  entry_t out = {0};
  cr_expect(mp__ptrmap_take(&m, 0x4000, &out));
  cr_expect_eq(out.key, 0x4000);
  cr_expect_eq(out.val, 7);
  cr_expect_null(mp__ptrmap_find(&m, 0x4000));
  cr_expect_eq(m.count, 0);
  mp__ptrmap_destroy(&m);
}

/* Page-aligned keys in a few dense runs collide in their low bits, which is
 * where linear probing and backward-shift deletion go wrong if they do. */
Test(ptrmap, agrees_with_a_reference_through_growth_and_removals) {
  enum { N = 5000 };
  uintptr_t *keys = malloc(N * sizeof *keys);
  bool *live = calloc(N, sizeof *live);
  cr_assert(keys != NULL && live != NULL);
  for (size_t i = 0; i < N; i++)
    keys[i] = ((uintptr_t)(i % 7) << 40) + (uintptr_t)(i + 1) * 4096;
  mp__ptrmap_t m;
  mp__ptrmap_init(&m, sizeof(entry_t));
  srand(12345);
  size_t nlive = 0;
  for (int step = 0; step < 40000; step++) {
    size_t i = (size_t)rand() % N;
    if (rand() % 3 != 0) {
      entry_t *e = mp__ptrmap_put(&m, keys[i]);
      cr_assert_not_null(e);
      if (!live[i])
        nlive++;
      live[i] = true;
      e->val = i;
    } else {
      entry_t out;
      bool took = mp__ptrmap_take(&m, keys[i], &out);
      cr_assert_eq(took, live[i], "step %d key %zu", step, i);
      if (took) {
        cr_assert_eq(out.val, i);
        live[i] = false;
        nlive--;
      }
    }
  }
  cr_expect_eq(m.count, nlive);
  for (size_t i = 0; i < N; i++) {
    entry_t *e = mp__ptrmap_find(&m, keys[i]);
    cr_expect_eq(e != NULL, live[i], "key %zu", i);
    if (e != NULL)
      cr_expect_eq(e->val, i);
  }
  size_t seen = 0;
  for (size_t k = 0; k < m.cap; k++) {
    entry_t *e = mp__ptrmap_at(&m, k);
    if (e != NULL) {
      cr_expect(live[e->val]);
      seen++;
    }
  }
  cr_expect_eq(seen, nlive, "iteration visits every entry once");
  mp__ptrmap_destroy(&m);
  free(keys);
  free(live);
}

Test(ptrmap, reserve_makes_the_next_puts_infallible) {
  mp__ptrmap_t m;
  mp__ptrmap_init(&m, sizeof(entry_t));
  cr_assert(mp__ptrmap_reserve(&m, 100));
  size_t cap = m.cap;
  cr_expect_geq(cap, 200);
  for (uintptr_t k = 1; k <= 100; k++)
    cr_assert_not_null(mp__ptrmap_put(&m, k * 512));
  cr_expect_eq(m.cap, cap, "no growth after a reserve");
  cr_expect_not(mp__ptrmap_reserve(&m, SIZE_MAX / 4),
                "an absurd reservation fails");
  cr_expect_eq(m.count, 100);
  cr_expect_not_null(mp__ptrmap_find(&m, 512 * 50));
  mp__ptrmap_destroy(&m);
}
