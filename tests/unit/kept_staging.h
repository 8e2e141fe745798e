/* kept_staging.h - a pool that keeps a defragmentation staging buffer
 * (defrag.c): the slide of a 1 MiB movable block 4 KiB up, whose staging
 * buffer's free the fake device (pool_fakedev.h) refuses, bare. */
#ifndef MEMPOOL_TEST_KEPT_STAGING_H
#define MEMPOOL_TEST_KEPT_STAGING_H

#include "pool/pool_internal.h"
#include "pool_fakedev.h"

/* Defragments p, a plain pool with segment_bytes=2M and align=512 on dev,
 * with the staging buffer's free refused; returns the moved block. */
static inline mp_handle_t *kept_staging_buffer(mp_pool_t *p, mp_device_t *dev) {
  mp_handle_t *h[2];
  size_t sizes[2] = {4096, (size_t)1 << 20}, moved = 0;
  for (int i = 0; i < 2; i++)
    cr_assert_eq(mp_pool_alloc_movable(p, sizes[i], NULL, &h[i]), MP_OK);
  cr_assert_eq(mp_handle_free(h[0]), MP_OK);
  fake_of(dev)->refuse_frees = 1;
  cr_assert_eq(mp_pool_defragment(p, NULL, &moved), MP_EDRIVER, "%s",
               mp_last_error());
  cr_assert_eq(p->nstage_kept, 1, "no staging buffer kept");
  return h[1];
}

#endif /* MEMPOOL_TEST_KEPT_STAGING_H */
