/* The slots of destroyed streams are reused once their work is done, also
 * when the first slots in the forgotten list are held for good: a live
 * block allocated on a stream the program destroyed keeps its slot (the
 * block names it). mp__slot_new looked at the first eight forgotten slots
 * only, always the same ones, so with eight such blocks no slot was ever
 * reused again: every new stream took a new slot, the table (and every
 * walk over it: syncs, frees after all streams) grew with each stream the
 * program made and destroyed, until 65535 streams were refused with
 * MP_ENOMEM. White-box (the table's size). Found by a review, 2026-12-07. */
#include <criterion/criterion.h>
#include <stdint.h>

#include "../support/device_helpers.h"
#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"

enum { HELD = 12, ROUNDS = 64 };

static uint32_t slots(mp_pool_t *pool) {
  mp__pool_lock(pool);
  uint32_t n = pool->nstreams;
  mp__pool_unlock(pool);
  return n;
}

/* A stream made, used for one block (allocated, freed), waited for and
 * destroyed, and the marker its forget recorded reached (the device
 * synchronize waits for a destroyed stream's work too): its slot will do
 * for the next stream. */
static void one_stream(mp_device_t *dev, mp_pool_t *pool) {
  mp_stream_t t;
  void *p = NULL;
  cr_assert_eq(mp_stream_create(dev, &t), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, 4096, t, &p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, t), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, t), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_device_synchronize(dev), MP_OK, "%s", mp_last_error());
}

Test(pool_stream_slots_reused_past_held_ones, the_table_stays_small) {
  mp_device_t *dev = open_dev("host");
  mp_pool_t *pool = make_pool(dev, NULL);
  /* A stream of the pool's own, live throughout. */
  mp_stream_t live;
  cr_assert_eq(mp_stream_create(dev, &live), MP_OK);
  void *own = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 4096, live, &own), MP_OK);
  /* HELD destroyed streams, each with a live block allocated on it. */
  void *held[HELD];
  for (int k = 0; k < HELD; k++) {
    mp_stream_t s;
    cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
    cr_assert_eq(mp_pool_alloc(pool, 4096, s, &held[k]), MP_OK, "%s",
                 mp_last_error());
    cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
    cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
  }
  uint32_t before = slots(pool);
  for (int r = 0; r < ROUNDS; r++)
    one_stream(dev, pool);
  /* Each round's stream is done and forgotten before the next is made: a
   * few slots more at most, not one per round. */
  uint32_t after = slots(pool);
  cr_expect_leq(after, before + 4,
                "%d streams made and destroyed one after another took %u "
                "new slots (%u before)",
                ROUNDS, after - before, before);
  for (int k = 0; k < HELD; k++)
    cr_assert_eq(mp_pool_free(pool, held[k]), MP_OK);
  cr_assert_eq(mp_pool_free(pool, own), MP_OK);
  check(pool);
  cr_assert_eq(mp_stream_synchronize(dev, live), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, live), MP_OK);
  mp_device_close(dev);
}
