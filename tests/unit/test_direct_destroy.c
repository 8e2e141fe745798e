/* test_direct_destroy.c - mp_direct_destroy when the device refuses some
 * of the frees (pool_fakedev.h's refuse_frees): the allocator stays, holding
 * exactly the blocks that are still the device's, live or deferred, and a
 * later destroy releases them. It used to free itself with them, their
 * memory lost. */
#include <criterion/criterion.h>

#include <mempool/mempool.h>

#include "pool_fakedev.h"

Test(direct_destroy, blocks_the_device_refuses_stay_for_a_later_destroy) {
  mp_device_t *dev = fake_open((size_t)64 << 20, 0);
  fake_dev_t *f = fake_of(dev);
  mp_direct_t *d;
  cr_assert_eq(mp_direct_create(dev, &d), MP_OK);
  void *p[6];
  for (int i = 0; i < 6; i++)
    cr_assert_eq(mp_direct_alloc(d, (size_t)(i + 1) << 16, NULL, &p[i]), MP_OK);
  for (int i = 0; i < 6; i += 2) /* deferred: 1, 3, 5 x 64 KiB */
    cr_assert_eq(mp_direct_free(d, p[i]), MP_OK);
  f->refuse_frees = 2;
  cr_assert_eq(mp_direct_destroy(d), MP_EDRIVER);
  cr_assert_eq(f->frees, 4);
  /* What is left is what the device still holds, and is consistent. */
  mp_stats_t s;
  cr_assert_eq(mp_direct_get_stats(d, &s), MP_OK);
  cr_expect_eq(s.reserved_bytes, f->used);
  cr_expect_eq(s.live_blocks + s.free_blocks, 2);
  cr_expect_eq(s.allocated_bytes + s.free_bytes, s.reserved_bytes);
  /* A live one that stayed can still be freed; a session releases the
   * deferred ones. */
  for (int i = 1; i < 6; i += 2)
    (void)mp_direct_free(d, p[i]);
  cr_assert_eq(mp_direct_free_session(d), MP_OK);
  cr_assert_eq(mp_direct_get_stats(d, &s), MP_OK);
  cr_expect_eq(s.reserved_bytes, 0);
  cr_assert_eq(mp_direct_destroy(d), MP_OK);
  cr_expect_eq(f->used, 0);
  fake_close(dev);
}
