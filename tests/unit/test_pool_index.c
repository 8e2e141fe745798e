/* The free index: TLSF size classes, bitmaps and per-class best fit. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "pool/pool_internal.h"

/* n records from the pool's own slabs: mp__index_check_class accepts only
 * links to those. */
static mp__block_t **index_records(mp_pool_t *p, size_t n) {
  mp__block_t **v = calloc(n, sizeof *v);
  for (size_t i = 0; i < n; i++)
    cr_assert_not_null(v[i] = mp__rec_new(p));
  return v;
}

static mp_pool_t *index_pool(void) {
  mp_pool_t *p = calloc(1, sizeof *p);
  p->cfg.align = 512;
  return p;
}

Test(pool_index, small_sizes_have_one_class_each) {
  mp_pool_t *p = index_pool();
  for (size_t u = 1; u < MP__SL_COUNT; u++) {
    unsigned fl, sl;
    mp__class_of(p, u * 512, &fl, &sl);
    cr_expect_eq(fl, 0);
    cr_expect_eq(sl, u);
  }
  mp__rec_release_all(p);
  free(p);
}

Test(pool_index, classes_rise_with_size_and_stay_narrow) {
  mp_pool_t *p = index_pool();
  unsigned pfl = 0, psl = 0;
  size_t class_lo = 512;
  for (size_t u = 1; u < (1u << 16); u++) {
    unsigned fl, sl;
    mp__class_of(p, u * 512, &fl, &sl);
    cr_assert(fl < MP__FL_COUNT && sl < MP__SL_COUNT);
    cr_assert(fl * MP__SL_COUNT + sl >= pfl * MP__SL_COUNT + psl,
              "class must not fall as size rises (u=%zu)", u);
    if (fl != pfl || sl != psl)
      class_lo = u * 512;
    /* Every size in a class is within 1/32 of the class's smallest. */
    cr_assert(u * 512 - class_lo <= class_lo / MP__SL_COUNT + 512);
    pfl = fl;
    psl = sl;
  }
  mp__rec_release_all(p);
  free(p);
}

/* TLSF's mapping, written out: below 32 units a class per unit; above,
 * fl = floor(log2(units)) - 4 and sl the next 5 bits below the top one. */
Test(pool_index, class_is_the_tlsf_mapping) {
  mp_pool_t *p = index_pool();
  for (unsigned k = 0; k < 55; k++)
    for (uint64_t d = 0; d < 70; d++) {
      uint64_t u = ((uint64_t)1 << k) + d * (k > 12 ? (1ull << (k - 12)) : 1);
      unsigned fl, sl, efl, esl;
      mp__class_of(p, (size_t)u * 512, &fl, &sl);
      if (u < MP__SL_COUNT) {
        efl = 0;
        esl = (unsigned)u;
      } else {
        unsigned top = 63u - (unsigned)__builtin_clzll(u);
        efl = top - 4;
        esl = (unsigned)(u >> (top - 5)) - MP__SL_COUNT;
      }
      cr_assert(fl == efl && sl == esl, "units %llu: (%u,%u), expected (%u,%u)",
                (unsigned long long)u, fl, sl, efl, esl);
    }
  mp__rec_release_all(p);
  free(p);
}

/* A size between two units has the class of the unit below it, at every
 * scale (the class is taken on the size itself, not on its units). */
Test(pool_index, bytes_below_the_unit_do_not_change_the_class) {
  mp_pool_t *p = index_pool();
  for (unsigned k = 9; k < 63; k++)
    for (uint64_t d = 0; d < 40; d++) {
      size_t base = ((size_t)1 << k) + (size_t)d * 512 * (k > 20 ? k : 1);
      base &= ~(size_t)511;
      unsigned fl, sl;
      mp__class_of(p, base, &fl, &sl);
      const size_t extra[] = {1, 17, 255, 256, 511};
      for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        unsigned fl2, sl2;
        mp__class_of(p, base + extra[i], &fl2, &sl2);
        cr_assert(fl2 == fl && sl2 == sl,
                  "size %zu: (%u,%u), its unit %zu: (%u,%u)", base + extra[i],
                  fl2, sl2, base, fl, sl);
      }
    }
  for (size_t b = 0; b < 512; b++) {
    unsigned fl, sl;
    mp__class_of(p, b, &fl, &sl);
    cr_assert(fl == 0 && sl == 0, "size %zu: (%u,%u)", b, fl, sl);
  }
  mp__rec_release_all(p);
  free(p);
}

static size_t brute_best(mp__block_t **v, size_t n, const bool *in,
                         size_t want) {
  size_t best = n;
  for (size_t i = 0; i < n; i++) {
    if (!in[i] || v[i]->size < want)
      continue;
    if (best == n || v[i]->size < v[best]->size ||
        (v[i]->size == v[best]->size && v[i]->addr < v[best]->addr))
      best = i;
  }
  return best;
}

Test(pool_index, best_fit_is_smallest_then_lowest_address) {
  mp_pool_t *p = index_pool();
  enum { N = 3000 };
  mp__block_t **v = index_records(p, N);
  bool *in = calloc(N, sizeof *in);
  srand(7);
  for (size_t i = 0; i < N; i++) {
    /* Few distinct sizes, so ties on size are common. */
    v[i]->size = (size_t)(1 + rand() % 400) * 512 * (rand() % 3 ? 1 : 64);
    v[i]->addr = (uintptr_t)(i + 1) * ((uintptr_t)1 << 30) -
                 (uintptr_t)(rand() % 1000) * 4096;
  }
  size_t count = 0;
  for (int step = 0; step < 20000; step++) {
    size_t i = (size_t)rand() % N;
    if (in[i]) {
      mp__index_remove(p, v[i]);
      in[i] = false;
      count--;
    } else {
      mp__index_insert(p, v[i]);
      in[i] = true;
      count++;
    }
    p->st.free_blocks = count;
    size_t want = (size_t)(1 + rand() % 400) * 512 * (rand() % 4 ? 1 : 64);
    size_t b = brute_best(v, N, in, want);
    mp__block_t *got = mp__index_best_fit(p, want);
    if (b == N)
      cr_assert_null(got, "want %zu: nothing fits, got %zu", want,
                     got ? got->size : 0);
    else
      cr_assert_eq(got, v[b], "want %zu: expected size %zu got %zu", want,
                   v[b]->size, got ? got->size : 0);
  }
  /* The bitmaps and treaps agree with what was inserted. */
  size_t total = 0;
  for (unsigned fl = 0; fl < MP__FL_COUNT; fl++)
    for (unsigned sl = 0; sl < MP__SL_COUNT; sl++) {
      size_t n = 0, by = 0;
      cr_assert(mp__index_check_class(p, fl, sl, mp__rec_owned, &n, &by));
      cr_assert_eq(n > 0, ((p->sl_bitmap[fl] >> sl) & 1) == 1);
      total += n;
    }
  cr_expect_eq(total, count);
  free(v);
  free(in);
  mp__rec_release_all(p);
  free(p);
}

Test(pool_index, next_walks_every_free_block_in_size_order) {
  mp_pool_t *p = index_pool();
  enum { N = 500 };
  mp__block_t **v = index_records(p, N);
  for (size_t i = 0; i < N; i++) {
    v[i]->size = (size_t)(1 + (i * 7919) % 2000) * 512;
    v[i]->addr = (uintptr_t)(N - i) << 24;
    mp__index_insert(p, v[i]);
  }
  size_t n = 0, prev = 0;
  for (mp__block_t *b = mp__index_best_fit(p, 512); b != NULL;
       b = mp__index_next(p, b)) {
    cr_assert(b->size >= prev);
    prev = b->size;
    n++;
  }
  cr_expect_eq(n, N);
  cr_expect_eq(mp__index_largest(p)->size, prev);
  for (size_t i = 0; i < N; i++)
    mp__index_remove(p, v[i]);
  cr_expect_eq(p->fl_bitmap, 0);
  cr_expect_null(mp__index_best_fit(p, 512));
  free(v);
  mp__rec_release_all(p);
  free(p);
}
