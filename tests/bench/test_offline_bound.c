/* The offline reference (bench/core/offline.c) on workloads small enough to
 * place by hand: where each allocation goes, the highest end, and the
 * granule figures built on them. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "mpbench.h"

#define MiB ((size_t)1 << 20)
#define G   (2 * MiB) /* CUDA's granule */

static uint32_t alloc(mpb_workload_t *w, size_t size) {
  uint32_t slot;
  cr_assert_eq(mpb_workload_alloc(w, size, 0, &slot), MP_OK, "%s",
               mp_last_error());
  return slot;
}

static void release(mpb_workload_t *w, uint32_t slot) {
  cr_assert_eq(mpb_workload_free_slot(w, slot), MP_OK, "%s", mp_last_error());
}

/* Appends the events of a script to w: "+a3" allocates block a of 3 MiB,
 * "-a" frees it (one letter a block, sizes in whole MiB). */
static void script(mpb_workload_t *w, const char *s) {
  uint32_t slot[26];
  for (const char *p = s; *p != '\0'; p++) {
    if (*p == '+') {
      char *end;
      size_t mib = strtoul(p + 2, &end, 10);
      slot[p[1] - 'a'] = alloc(w, mib * MiB);
      p = end - 1;
    } else if (*p == '-') {
      release(w, slot[p[1] - 'a']);
      p++;
    }
  }
}

static void place(const mpb_workload_t *w, size_t *offset, size_t n,
                  mpb_offline_t *o) {
  cr_assert_eq(mpb_offline_place(w, 512, G, offset, n, o), MP_OK, "%s",
               mp_last_error());
}

Test(offline_bound, disjoint_lifetimes_share_offset_zero) {
  mpb_workload_t w;
  mpb_workload_init(&w, "disjoint");
  script(&w, "+a3 -a +b5 -b");
  size_t off[2] = {7, 7};
  mpb_offline_t o;
  place(&w, off, 2, &o);
  cr_expect_eq(o.items, 2);
  cr_expect_eq(off[0], 0);
  cr_expect_eq(off[1], 0);
  cr_expect_eq(o.high, 5 * MiB);
  cr_expect_eq(o.peak_live, 5 * MiB);
  mpb_workload_free(&w);
}

Test(offline_bound, three_that_live_together_sit_side_by_side) {
  mpb_workload_t w;
  mpb_workload_init(&w, "together");
  script(&w, "+a1 +b3 +c2 -b -a -c");
  size_t off[3];
  mpb_offline_t o;
  place(&w, off, 3, &o);
  /* Largest first, each at the lowest offset free: 3, then 2, then 1. */
  cr_expect_eq(off[1], 0);
  cr_expect_eq(off[2], 3 * MiB);
  cr_expect_eq(off[0], 5 * MiB);
  cr_expect_eq(o.high, 6 * MiB);
  cr_expect_eq(o.peak_live, 6 * MiB);
  mpb_workload_free(&w);
}

/* a (1 MiB) and b (2 MiB) live together, a goes, then c (2 MiB) comes:
 * allocated in event order by first fit, a takes 0, b 1 MiB, and c finds
 * only a 1 MiB hole below b, so it goes above: 5 MiB for 4 live. Largest
 * first puts b at 0 and c above it, and a where c will be: 4 MiB, which
 * is peak live, so optimal. */
Test(offline_bound, greedy_by_size_reaches_peak_where_first_fit_does_not) {
  mpb_workload_t w;
  mpb_workload_init(&w, "hand");
  script(&w, "+a1 +b2 -a +c2 -b -c");
  size_t off[3];
  mpb_offline_t o;
  place(&w, off, 3, &o);
  cr_expect_eq(o.high_by[0], 4 * MiB, "size order: %zu", o.high_by[0]);
  cr_expect_eq(o.high_by[3], 5 * MiB, "start order: %zu", o.high_by[3]);
  cr_expect_str_eq(mpb_offline_orders[0], "size");
  cr_expect_str_eq(mpb_offline_orders[3], "start");
  cr_expect_eq(o.high, 4 * MiB);
  cr_expect_eq(o.order, 0);
  cr_expect_eq(off[1], 0);
  cr_expect_eq(off[0], 2 * MiB);
  cr_expect_eq(off[2], 2 * MiB);
  cr_expect_eq(o.peak_live, 4 * MiB);
  cr_expect_eq(o.rounds, 0, "at the granule bound already");
  cr_expect_float_eq(o.ratio, 1.0, 1e-12);
  cr_expect_float_eq(o.raw, 1.0, 1e-12);
  cr_expect_eq(o.mapped, 4 * MiB);
  mpb_workload_free(&w);
}

Test(offline_bound, granule_bound_rounds_peak_live_up_to_whole_granules) {
  mpb_workload_t w;
  mpb_workload_init(&w, "odd");
  size_t live = 3 * MiB + 1; /* two granules needed, 4 MiB */
  release(&w, alloc(&w, live));
  mpb_offline_t o;
  place(&w, NULL, 0, &o);
  cr_expect_eq(o.peak_live, live);
  cr_expect_float_eq(o.bound, (double)(4 * MiB) / (double)live, 1e-12);
  /* The one block, rounded to 512 B as the pool rounds it. */
  cr_expect_eq(o.high, 3 * MiB + 512);
  cr_expect_float_eq(o.raw, (double)(3 * MiB + 512) / (double)live, 1e-12);
  cr_expect_float_eq(o.ratio, o.bound, 1e-12);
  cr_expect_eq(o.mapped, 4 * MiB);

  /* Whole granules: the bound is 1. */
  mpb_workload_t x;
  mpb_workload_init(&x, "even");
  script(&x, "+a4 -a");
  place(&x, NULL, 0, &o);
  cr_expect_float_eq(o.bound, 1.0, 1e-12);
  cr_expect_float_eq(o.ratio, 1.0, 1e-12);
  mpb_workload_free(&w);
  mpb_workload_free(&x);
}

/* With 1 MiB granules and whole-MiB blocks every offset is a granule's,
 * so the granules live blocks touch are the live bytes: the unmapping
 * figure is peak live, whatever the range's highest end (here sizes and
 * lifetimes where no greedy order reaches peak live; an exact placement
 * could). Counting must drop a granule when its last block goes. */
Test(offline_bound, unmapping_counts_only_granules_with_a_live_block) {
  mpb_workload_t w;
  mpb_workload_init(&w, "unmap");
  /* b + c + d: 6 MiB, the peak */
  script(&w, "+a1 +b2 -a +c1 +d3 -d +e1 -b +f3 -f -e -c");
  mpb_offline_t o;
  cr_assert_eq(mpb_offline_place(&w, 512, MiB, NULL, 0, &o), MP_OK);
  cr_expect_eq(o.peak_live, 6 * MiB);
  cr_expect_geq(o.high, 6 * MiB);
  cr_expect_eq(o.mapped, 6 * MiB);
  cr_expect_float_eq(o.mapped_ratio, 1.0, 1e-12);
  cr_expect_float_eq(o.bound, 1.0, 1e-12);
  mpb_workload_free(&w);
}

Test(offline_bound, a_paused_tenants_blocks_leave_the_range_to_the_other) {
  mpb_workload_t w;
  mpb_workload_init(&w, "turns");
  w.tenant = 0;
  uint32_t x = alloc(&w, 6 * MiB);
  cr_assert_eq(mpb_workload_turn(&w, MPB_PAUSE, 0), MP_OK);
  w.tenant = 1;
  uint32_t y = alloc(&w, 4 * MiB);
  cr_assert_eq(mpb_workload_turn(&w, MPB_PAUSE, 1), MP_OK);
  cr_assert_eq(mpb_workload_turn(&w, MPB_RESUME, 0), MP_OK);
  w.tenant = 0;
  release(&w, x);
  w.tenant = 1;
  cr_assert_eq(mpb_workload_turn(&w, MPB_RESUME, 1), MP_OK);
  release(&w, y);
  size_t off[3];
  mpb_offline_t o;
  place(&w, off, 3, &o);
  /* x before its pause, y until its pause, x again, y again: never two at
   * once, all at 0. */
  cr_expect_eq(o.items, 4);
  cr_expect_eq(o.peak_live, 6 * MiB);
  cr_expect_eq(o.high, 6 * MiB);
  cr_expect_eq(off[0], 0);
  cr_expect_eq(off[1], 0);
  cr_expect_eq(off[2], 0);
  mpb_workload_free(&w);
}

Test(offline_bound, streams_graphs_and_empty_allocations_are_ignored) {
  mpb_workload_t w;
  mpb_workload_init(&w, "streams");
  uint32_t s, z;
  cr_assert_eq(mpb_workload_alloc(&w, 2 * MiB, 1, &s), MP_OK);
  cr_assert_eq(mpb_workload_graph(&w, MPB_CAPTURE_BEGIN, 1), MP_OK);
  cr_assert_eq(mpb_workload_alloc(&w, 0, 1, &z), MP_OK);
  cr_assert_eq(mpb_workload_graph(&w, MPB_CAPTURE_END, 1), MP_OK);
  release(&w, z);
  release(&w, s);
  /* Freed on stream 1, taken at once on stream 0: the caught-up case. */
  release(&w, alloc(&w, 2 * MiB));
  mpb_offline_t o;
  place(&w, NULL, 0, &o);
  cr_expect_eq(o.items, 2);
  cr_expect_eq(o.high, 2 * MiB);
  mpb_workload_free(&w);
}

Test(offline_bound, bad_alignment_or_granule_is_einval) {
  mpb_workload_t w;
  mpb_workload_init(&w, "bad");
  release(&w, alloc(&w, MiB));
  mpb_offline_t o;
  cr_expect_eq(mpb_offline_place(&w, 384, G, NULL, 0, &o), MP_EINVAL);
  cr_expect_eq(mpb_offline_place(&w, 512, 0, NULL, 0, &o), MP_EINVAL);
  mpb_workload_free(&w);
}

/* Thousands of events (many time buckets), lifetimes across them: no two
 * blocks that live at once overlap, and the highest end is the highest
 * block's. */
Test(offline_bound, no_two_blocks_that_live_at_once_overlap) {
  mpb_workload_t w;
  cr_assert_eq(
      mpb_workload_generate("random:n=3000,max_size=1M,max_live=24M", &w),
      MP_OK, "%s", mp_last_error());
  size_t n = 0;
  for (size_t i = 0; i < w.n; i++)
    n += w.ev[i].op == MPB_ALLOC;
  size_t *off = calloc(n, sizeof *off), *t0 = calloc(n, sizeof *t0),
         *t1 = calloc(n, sizeof *t1), *size = calloc(n, sizeof *size);
  size_t *open = calloc(w.nslots, sizeof *open); /* slot -> allocation */
  cr_assert(off && t0 && t1 && size && open);
  for (size_t i = 0, k = 0; i < w.n; i++) {
    const mpb_event_t *e = &w.ev[i];
    if (e->op == MPB_ALLOC) {
      t0[k] = i;
      size[k] = (e->size + 511) / 512 * 512;
      open[e->slot] = k++;
    } else if (e->op == MPB_FREE) {
      t1[open[e->slot]] = i;
    }
  }
  mpb_offline_t o;
  place(&w, off, n, &o);
  cr_assert_eq(o.items, n);
  size_t high = 0;
  for (size_t a = 0; a < n; a++) {
    if (off[a] + size[a] > high)
      high = off[a] + size[a];
    for (size_t b = a + 1; b < n && t0[b] < t1[a]; b++)
      cr_assert(off[a] + size[a] <= off[b] || off[b] + size[b] <= off[a],
                "blocks %zu [%zu, %zu) and %zu [%zu, %zu) overlap", a, off[a],
                off[a] + size[a], b, off[b], off[b] + size[b]);
  }
  cr_expect_eq(o.high, high);
  cr_expect_geq(o.high, o.peak_live);
  cr_expect_leq(o.mapped, (o.high + G - 1) / G * G);
  free(off);
  free(t0);
  free(t1);
  free(size);
  free(open);
  mpb_workload_free(&w);
}

/* Sizes a trace allows (live bytes within a size_t) are placed without
 * anything per granule of the range: a 4 EiB block needed a 2^41-entry
 * array and a walk over each granule (out of host memory, or an abort
 * under ASan; a 1 PiB one took minutes). */
Test(offline_bound, exabyte_blocks_are_placed_without_a_granule_walk) {
  mpb_workload_t w;
  mpb_workload_init(&w, "huge");
  size_t big = (size_t)1 << 62;
  uint32_t a = alloc(&w, big);
  uint32_t b = alloc(&w, 3 * MiB);
  release(&w, a);
  release(&w, b);
  size_t off[2];
  mpb_offline_t o;
  place(&w, off, 2, &o);
  cr_expect_eq(o.high, big + 3 * MiB);
  cr_expect_eq(o.peak_live, big + 3 * MiB);
  cr_expect_eq(o.mapped, big + 4 * MiB);
  cr_expect_float_eq(o.raw, 1.0, 1e-12);
  mpb_workload_free(&w);
}

/* Live bytes within a size_t can still be placed past its end by a
 * greedy order: a (2^62) and b (2^63) live together, a goes, c
 * (2^63 - 2^61) comes: in event order c finds only a 2^62 hole below b
 * and goes above it, ending at 2^64 + 2^61. Such an end is refused, not
 * wrapped into a small one. */
Test(offline_bound, a_placement_past_the_address_space_is_einval) {
  mpb_workload_t w;
  mpb_workload_init(&w, "wraps");
  uint32_t a = alloc(&w, (size_t)1 << 62);
  uint32_t b = alloc(&w, (size_t)1 << 63);
  release(&w, a);
  uint32_t c = alloc(&w, ((size_t)1 << 63) - ((size_t)1 << 61));
  release(&w, b);
  release(&w, c);
  mpb_offline_t o;
  cr_expect_eq(mpb_offline_place(&w, 512, G, NULL, 0, &o), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "address space") != NULL, "%s",
            mp_last_error());
  mpb_workload_free(&w);
}
