/* The host device's copies follow CUDA's argument rules: the source and
 * the destination may not overlap (cuda_runtime_api.h, cudaMemcpyAsync:
 * "The memory areas may not overlap"). The host device copied them as
 * memmove does, so a caller that slid a block onto itself in one copy
 * (what defragmentation must not do) got the right bytes here and
 * garbage on a GPU. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/device_helpers.h"

#define KiB ((size_t)1 << 10)

Test(host_copies, overlapping_copies_are_einval_and_queue_nothing) {
  mp_device_t *dev = open_dev("host:capacity=16M");
  unsigned char *m = NULL;
  cr_assert_eq(mp_device_alloc(dev, 64 * KiB, (void **)&m), MP_OK);
  for (size_t i = 0; i < 64 * KiB; i++)
    m[i] = (unsigned char)(i * 7);
  unsigned char was[64 * KiB];
  memcpy(was, m, sizeof was);
  const struct {
    size_t dst, src, n;
  } bad[] = {
      {0, 1, 16 * KiB},      /* down by one byte */
      {4 * KiB, 0, 8 * KiB}, /* up by less than n */
      {8 * KiB, 8 * KiB, 1}, /* onto itself */
      {0, 32 * KiB - 1, 32 * KiB},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    mp_status_t st =
        mp_memcpy_async(dev, m + bad[i].dst, m + bad[i].src, bad[i].n, NULL);
    cr_expect_eq(st, MP_EINVAL, "copy %zu: %s", i, mp_status_name(st));
    if (st == MP_EINVAL)
      cr_expect(strstr(mp_last_error(), "overlap") != NULL, "%s",
                mp_last_error());
  }
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_expect_arr_eq(m, was, sizeof was, "a refused copy ran");
  /* Ranges that only touch are not overlapping. */
  cr_expect_eq(mp_memcpy_async(dev, m, m + 32 * KiB, 32 * KiB, NULL), MP_OK);
  cr_expect_eq(mp_memcpy_async(dev, m + 16 * KiB, m, 16 * KiB, NULL), MP_OK);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_expect_eq(m[0], was[32 * KiB]);
  cr_expect_eq(m[16 * KiB], was[32 * KiB]);
  cr_expect_eq(mp_device_free(dev, m), MP_OK);
  mp_device_close(dev);
}
