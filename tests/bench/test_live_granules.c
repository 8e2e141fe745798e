/* The granules an allocator's live blocks touch (mpb_touched_t, the "live
 * granules" column of `mpbench bound`): each granule counted once however
 * many blocks lie in it, released when its last block goes, the most at
 * once kept; and, from a pool's replay, a figure below the pool's own
 * ratio where its free memory is whole granules it could not join. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "mpbench.h"

#define MiB ((size_t)1 << 20)
#define G   (2 * MiB)

static void block(mpb_touched_t *t, uint8_t op, uintptr_t at, size_t size) {
  mpb_event_t e = {.size = size, .op = op};
  mpb_touched_on_block(t, 0, &e, (void *)at);
}

Test(live_granules, a_granule_counts_once_and_goes_with_its_last_block) {
  mpb_touched_t t;
  mpb_touched_init(&t, G);
  block(&t, MPB_ALLOC, 1 * G, 2 * G);      /* granules 1 and 2 */
  block(&t, MPB_ALLOC, 1 * G + MiB, 4096); /* in granule 1 too */
  block(&t, MPB_ALLOC, 3 * G - 1, 2);      /* the end of 2, start of 3 */
  cr_expect_eq(t.now, 3);
  block(&t, MPB_FREE, 1 * G, 2 * G); /* 1 and 2 keep a block each */
  cr_expect_eq(t.now, 3);
  block(&t, MPB_FREE, 1 * G + MiB, 4096);
  cr_expect_eq(t.now, 2);
  block(&t, MPB_FREE, 3 * G - 1, 2);
  cr_expect_eq(t.now, 0);
  cr_expect_eq(mpb_touched_peak_bytes(&t), 3 * G);
  mpb_touched_free(&t);
}

Test(live_granules, the_peak_is_the_most_at_once_not_every_granule_seen) {
  mpb_touched_t t;
  mpb_touched_init(&t, G);
  /* 3000 blocks one after another, each alone in a granule of its own. */
  for (uintptr_t g = 1; g <= 3000; g++) {
    block(&t, MPB_ALLOC, g * G + 512, 1024);
    block(&t, MPB_ALLOC, (g + 1) * G + 512, 1024);
    block(&t, MPB_FREE, g * G + 512, 1024);
    block(&t, MPB_FREE, (g + 1) * G + 512, 1024);
  }
  cr_expect_eq(t.now, 0);
  cr_expect_eq(mpb_touched_peak_bytes(&t), 2 * G);
  /* A free of a block never seen counts nothing. */
  block(&t, MPB_FREE, 9000 * G, G);
  cr_expect_eq(t.now, 0);
  mpb_touched_free(&t);
}

Test(live_granules, a_petabyte_block_counts_its_granules_without_a_walk) {
  mpb_touched_t t;
  mpb_touched_init(&t, G);
  const size_t pib = (size_t)1 << 50;
  block(&t, MPB_ALLOC, G + 4096, pib); /* granule 1 to 2^29 + 1 */
  block(&t, MPB_ALLOC, G, 4096);       /* shares granule 1 */
  cr_expect_eq(t.now, pib / G + 1);
  block(&t, MPB_FREE, G + 4096, pib);
  cr_expect_eq(t.now, 1);
  block(&t, MPB_FREE, G, 4096);
  cr_expect_eq(t.now, 0);
  cr_expect_eq(mpb_touched_peak_bytes(&t), pib + G);
  mpb_touched_free(&t);
}

/* A 6 MiB block, freed, is cut into a, b, c of 2 MiB; a and c go and d of
 * 4 MiB comes: the pool holds a and c, whole granules around a live b in
 * one mapping it cannot give back, and grows for d. Its live blocks never
 * touch more than 3 granules: what it would hold if a's and c's memory
 * could be mapped again for d. */
Test(live_granules, free_granules_the_pool_could_not_join_are_not_counted) {
  mpb_workload_t w;
  mpb_workload_init(&w, "holes");
  uint32_t x, a, b, c, d;
  cr_assert_eq(mpb_workload_alloc(&w, 3 * G, 0, &x), MP_OK);
  cr_assert_eq(mpb_workload_free_slot(&w, x), MP_OK);
  cr_assert_eq(mpb_workload_alloc(&w, G, 0, &a), MP_OK);
  cr_assert_eq(mpb_workload_alloc(&w, G, 0, &b), MP_OK);
  cr_assert_eq(mpb_workload_alloc(&w, G, 0, &c), MP_OK);
  cr_assert_eq(mpb_workload_free_slot(&w, a), MP_OK);
  cr_assert_eq(mpb_workload_free_slot(&w, c), MP_OK);
  cr_assert_eq(mpb_workload_alloc(&w, 2 * G, 0, &d), MP_OK);
  cr_assert_eq(mpb_workload_free_slot(&w, d), MP_OK);
  cr_assert_eq(mpb_workload_free_slot(&w, b), MP_OK);
  mpb_touched_t t;
  mpb_touched_init(&t, G);
  mpb_replay_opts_t o = {.device_spec = "host:capacity=1G",
                         .on_block = mpb_touched_on_block,
                         .on_block_ctx = &t};
  mpb_result_t *r = malloc(sizeof *r); /* big: the plot series */
  cr_assert_not_null(r);
  cr_assert_eq(mpb_replay(&w, "pool", &o, r), MP_OK, "%s", mp_last_error());
  cr_assert(r->completed, "%s", r->error);
  cr_expect_eq(r->peak_live, 3 * G);
  cr_expect_gt(r->peak_reserved, 3 * G, "the pool joined a and c after all");
  cr_expect_eq(mpb_touched_peak_bytes(&t), 3 * G);
  cr_expect_eq(t.now, 0);
  free(r);
  mpb_touched_free(&t);
  mpb_workload_free(&w);
}
