/* mp_pool_freeze moves blocks with copies on a stream of its own, which it
 * waits for and destroys: the blocks it moved keep no claim on that
 * stream's slot in the pool's stream table after it returns. Before, each
 * moved block named the destroyed stream as a use for as long as it lived,
 * so every freeze that moved a block kept one more slot (a stream record
 * of some 256 bytes, and a stream the pool never reused). White-box: it
 * reads the stream table. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"

#define KiB    ((size_t)1 << 10)
#define MiB    ((size_t)1 << 20)
#define ROUNDS 12

static uint32_t streams_of(mp_pool_t *pool) {
  mp__pool_lock(pool);
  uint32_t n = pool->nstreams;
  mp__pool_unlock(pool);
  return n;
}

Test(pool_freeze_streams, freezes_that_move_blocks_keep_no_stream_slots) {
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host:capacity=256M", &dev), MP_OK, "%s",
               mp_last_error());
  mp_pool_t *pool = make_pool(dev, "virtual=0,segment_bytes=32M,align=512");
  mp_handle_t *kept[ROUNDS];
  uint32_t after_first = 0;
  for (int i = 0; i < ROUNDS; i++) {
    /* The streams' work done and known so (a trim synchronizes them):
     * the space the last freeze left is reusable at once, and so is its
     * destroyed stream's slot, whatever the timing of the host device's
     * stream threads (on a busy machine under TSan the hole went elsewhere
     * or the next freeze took a new slot). */
    cr_assert_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
    /* A hole under a movable block: the freeze slides it down. */
    mp_handle_t *hole;
    cr_assert_eq(mp_pool_alloc_movable(pool, 64 * KiB, NULL, &hole), MP_OK);
    cr_assert_eq(mp_pool_alloc_movable(pool, MiB, NULL, &kept[i]), MP_OK);
    memset(mp_handle_ptr(kept[i]), i + 1, MiB);
    uintptr_t was = (uintptr_t)mp_handle_ptr(kept[i]);
    cr_assert_eq(mp_handle_free(hole), MP_OK);
    cr_assert_eq(mp_pool_freeze(pool), MP_OK, "%s", mp_last_error());
    cr_assert_neq((uintptr_t)mp_handle_ptr(kept[i]), was,
                  "round %d: the freeze moved nothing (set-up)", i);
    if (i == 0)
      after_first = streams_of(pool);
  }
  cr_expect_leq(streams_of(pool), after_first,
                "%u stream slots after %d freezes, %u after the first",
                streams_of(pool), ROUNDS, after_first);
  for (int i = 0; i < ROUNDS; i++) {
    unsigned char *p = mp_handle_ptr(kept[i]);
    cr_expect(p[0] == i + 1 && p[MiB - 1] == i + 1, "block %d lost its bytes",
              i);
  }
  check(pool);
  for (int i = 0; i < ROUNDS; i++)
    cr_assert_eq(mp_handle_free(kept[i]), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}
