/* test_direct_refused_free.c - a block whose device free a session's
 * release is refused goes back into the session, for a later one to
 * retry. Putting it back needs room in the block map and the deferred
 * list, and the session runs without the mutex: other calls meanwhile may
 * use up the room its blocks left. Where growing them then ran out of host
 * memory, the block was lost to the allocator (its memory the device's
 * until it closed: direct.h said so). The room is now kept for the blocks
 * of the sessions in flight, so putting one back allocates nothing. */
#include <criterion/criterion.h>

#include <mempool/mempool.h>

#include "internal.h"
#include "pool_fakedev.h"

#define NFILL 64

static mp_direct_t *d;
static void *fill[NFILL];

/* The session's first device free (before the fake refuses it): other
 * allocations take the room the session's blocks left in the map, then
 * the host runs out of memory. */
static void take_the_room(void *ctx) {
  (void)ctx;
  for (int i = 0; i < NFILL; i++)
    cr_assert_eq(mp_direct_alloc(d, 4096, NULL, &fill[i]), MP_OK, "%s",
                 mp_last_error());
  mp__fault_host_every(true);
}

Test(direct_refused_free, a_refused_block_is_kept_when_host_memory_runs_out) {
  mp_device_t *dev = fake_open((size_t)64 << 20, 0);
  fake_dev_t *f = fake_of(dev);
  cr_assert_eq(mp_direct_create(dev, &d), MP_OK);
  void *p[3];
  for (int i = 0; i < 3; i++)
    cr_assert_eq(mp_direct_alloc(d, (size_t)(i + 1) << 16, NULL, &p[i]), MP_OK);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(mp_direct_free(d, p[i]), MP_OK);
  f->on_free = take_the_room;
  f->refuse_frees = 1;
  mp_status_t st = mp_direct_free_session(d);
  mp__fault_host_every(false);
  cr_expect_eq(st, MP_EDRIVER, "%s", mp_last_error());
  cr_assert_eq(f->frees, 2, "the other two blocks went");
  /* The refused block is still the allocator's: counted, and released by
   * the next session. */
  mp_stats_t s;
  cr_assert_eq(mp_direct_get_stats(d, &s), MP_OK);
  cr_expect_eq(s.reserved_bytes, f->used);
  cr_expect_eq(s.free_blocks, 1);
  cr_expect_eq(s.live_blocks, NFILL);
  cr_assert_eq(mp_direct_free_session(d), MP_OK, "%s", mp_last_error());
  for (int i = 0; i < NFILL; i++)
    cr_assert_eq(mp_direct_free(d, fill[i]), MP_OK);
  cr_assert_eq(mp_direct_destroy(d), MP_OK, "%s", mp_last_error());
  cr_expect_eq(f->used, 0, "%zu bytes lost to the allocator", f->used);
  fake_close(dev);
}
