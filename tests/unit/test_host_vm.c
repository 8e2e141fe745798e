/* Virtual memory of the host device (the pool's internal service): reserve,
 * map, unmap, release, and every misuse the pool could commit. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "device/backend.h"

#include "../support/device_helpers.h"
#include "../support/mapped_bytes.h"

#define MiB ((size_t)1 << 20)

Test(host_vm, granularity_defaults_to_2m_and_follows_the_spec) {
  mp_device_t *dev = open_dev("host");
  size_t g = 0;
  cr_assert_eq(mp__device_vm_granularity(dev, &g), MP_OK);
  cr_expect_eq(g, 2 * MiB);
  mp_device_close(dev);
  dev = open_dev("host:granularity=64K");
  cr_assert_eq(mp__device_vm_granularity(dev, &g), MP_OK);
  cr_expect_eq(g, (size_t)64 << 10);
  mp_device_close(dev);
}

Test(host_vm, reserve_map_write_unmap_release) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  char *base = NULL;
  cr_assert_eq(mp__device_vm_reserve(dev, 32 * MiB, (void **)&base), MP_OK);
  cr_expect_eq((uintptr_t)base % (2 * MiB), 0, "granule-aligned base");
  cr_expect_eq(free_bytes(dev), 64 * MiB, "a reservation is not memory");
  cr_assert_eq(mp__device_vm_map(dev, base + 2 * MiB, 4 * MiB), MP_OK);
  cr_expect_eq(free_bytes(dev), 60 * MiB);
  memset(base + 2 * MiB, 0x7e, 4 * MiB);
  /* A second mapping next to the first; the first keeps its data. */
  cr_assert_eq(mp__device_vm_map(dev, base + 6 * MiB, 2 * MiB), MP_OK);
  memset(base + 6 * MiB, 0x11, 2 * MiB);
  cr_expect_eq(base[2 * MiB], 0x7e);
  cr_expect_eq(base[6 * MiB - 1], 0x7e);
  cr_expect_eq(base[6 * MiB], 0x11);
  cr_expect_eq(free_bytes(dev), 58 * MiB);
  cr_assert_eq(mp__device_vm_unmap(dev, base + 2 * MiB, 4 * MiB), MP_OK);
  cr_expect_eq(free_bytes(dev), 62 * MiB);
  cr_expect_eq(base[6 * MiB], 0x11);
  /* Mapped again, the range starts from fresh pages. */
  cr_assert_eq(mp__device_vm_map(dev, base + 2 * MiB, 2 * MiB), MP_OK);
  cr_expect_eq(base[2 * MiB], 0);
  cr_assert_eq(mp__device_vm_unmap(dev, base + 2 * MiB, 2 * MiB), MP_OK);
  cr_assert_eq(mp__device_vm_unmap(dev, base + 6 * MiB, 2 * MiB), MP_OK);
  cr_assert_eq(mp__device_vm_release(dev, base, 32 * MiB), MP_OK);
  cr_expect_eq(free_bytes(dev), 64 * MiB);
  mp_device_close(dev);
}

Test(host_vm, device_copies_work_on_mapped_memory) {
  mp_device_t *dev = open_dev("host");
  char *base = NULL;
  cr_assert_eq(mp__device_vm_reserve(dev, 8 * MiB, (void **)&base), MP_OK);
  cr_assert_eq(mp__device_vm_map(dev, base, 4 * MiB), MP_OK);
  cr_assert_eq(mp_memset_async(dev, base, 3, 2 * MiB, NULL), MP_OK);
  cr_assert_eq(mp_memcpy_async(dev, base + 2 * MiB, base, 2 * MiB, NULL),
               MP_OK);
  /* vm_unmap synchronizes first, so the copy has finished before it. */
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_expect_eq(base[4 * MiB - 1], 3);
  mp_device_close(dev); /* releases the mapping and the reservation */
}

Test(host_vm, copies_may_touch_only_mapped_virtual_memory) {
  mp_device_t *dev = open_dev("host");
  char *base = NULL;
  static char host_buf[64];
  cr_assert_eq(mp__device_vm_reserve(dev, 8 * MiB, (void **)&base), MP_OK);
  cr_assert_eq(mp__device_vm_map(dev, base + 2 * MiB, 4 * MiB), MP_OK);
  char *m = base + 2 * MiB;
  cr_expect_eq(mp_memset_async(dev, m, 1, 4 * MiB, NULL), MP_OK);
  cr_expect_eq(mp_memcpy_async(dev, host_buf, m + 4 * MiB - 64, 64, NULL),
               MP_OK);
  cr_expect_eq(mp_memset_async(dev, m, 2, 4 * MiB + 1, NULL), MP_EINVAL,
               "runs past the mapping");
  cr_expect_eq(mp_memset_async(dev, m - 1, 2, 2, NULL), MP_EINVAL,
               "starts before the mapping");
  cr_expect_eq(mp_memset_async(dev, base, 2, 16, NULL), MP_EINVAL,
               "never mapped");
  cr_expect_eq(mp_memcpy_async(dev, host_buf, base + 7 * MiB, 16, NULL),
               MP_EINVAL, "source not mapped");
  cr_expect_eq(mp_memcpy_async(dev, base + 6 * MiB, host_buf, 16, NULL),
               MP_EINVAL, "destination not mapped");
  cr_expect_eq(mp_memset_async(dev, base - 4096, 2, 8192, NULL), MP_EINVAL,
               "crosses the start of the reservation");
  cr_expect_eq(mp_memset_async(dev, base + 8 * MiB - 1, 2, 2, NULL), MP_EINVAL,
               "crosses the end of the reservation");
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_expect_eq(host_buf[63], 1);
  cr_expect_eq(m[4 * MiB - 1], 1, "rejected work never ran");
  cr_assert_eq(mp__device_vm_unmap(dev, m, 4 * MiB), MP_OK);
  cr_expect_eq(mp_memset_async(dev, m, 0, 1, NULL), MP_EINVAL,
               "unmapped again");
  mp_device_close(dev);
}

Test(host_vm, misuse_is_einval_and_changes_nothing) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  char *base = NULL, *other = NULL;
  void *dummy = NULL;
  cr_expect_eq(mp__device_vm_reserve(dev, 0, &dummy), MP_EINVAL);
  cr_expect_eq(mp__device_vm_reserve(dev, 3 * MiB, &dummy), MP_EINVAL);
  cr_expect_eq(mp__device_vm_reserve(dev, SIZE_MAX - MiB + 1, &dummy),
               MP_EINVAL);
  cr_assert_eq(mp__device_vm_reserve(dev, 16 * MiB, (void **)&base), MP_OK);
  cr_assert_eq(mp__device_vm_reserve(dev, 4 * MiB, (void **)&other), MP_OK);
  cr_assert_eq(mp__device_vm_map(dev, base + 4 * MiB, 4 * MiB), MP_OK);
  size_t before = free_bytes(dev);

  int x = 0;
  cr_expect_eq(mp__device_vm_map(dev, base + 4096, 2 * MiB), MP_EINVAL,
               "misaligned address");
  cr_expect_eq(mp__device_vm_map(dev, base, MiB), MP_EINVAL, "misaligned size");
  cr_expect_eq(mp__device_vm_map(dev, base, 0), MP_EINVAL, "zero size");
  cr_expect_eq(mp__device_vm_map(dev, base + 14 * MiB, 4 * MiB), MP_EINVAL,
               "runs past the reservation");
  cr_expect_eq(mp__device_vm_map(dev, base + 16 * MiB, 2 * MiB), MP_EINVAL,
               "just past the end");
  cr_expect_eq(mp__device_vm_map(dev, &x, 2 * MiB), MP_EINVAL,
               "outside any reservation");
  cr_expect_eq(mp__device_vm_map(dev, base + 6 * MiB, 4 * MiB), MP_EINVAL,
               "overlaps a mapping");
  cr_expect_eq(mp__device_vm_map(dev, base + 2 * MiB, 4 * MiB), MP_EINVAL,
               "overlaps a mapping from below");
  cr_expect_eq(mp__device_vm_map(dev, base + 4 * MiB, 4 * MiB), MP_EINVAL,
               "mapped twice");
  cr_expect_eq(mp__device_vm_map(dev, base + 14 * MiB, 4 * MiB), MP_EINVAL,
               "straddles into the next reservation");

  cr_expect_eq(mp__device_vm_unmap(dev, base + 4 * MiB, 2 * MiB), MP_EINVAL,
               "part of a mapping");
  cr_expect_eq(mp__device_vm_unmap(dev, base + 6 * MiB, 2 * MiB), MP_EINVAL,
               "tail of a mapping");
  cr_expect_eq(mp__device_vm_unmap(dev, base, 2 * MiB), MP_EINVAL,
               "never mapped");
  cr_expect_eq(mp__device_vm_release(dev, base, 8 * MiB), MP_EINVAL,
               "wrong size");
  cr_expect_eq(mp__device_vm_release(dev, base + 2 * MiB, 14 * MiB), MP_EINVAL,
               "not the base");
  cr_expect_eq(mp__device_vm_release(dev, &x, 2 * MiB), MP_EINVAL);
  cr_expect_eq(mp__device_vm_release(dev, base, 16 * MiB), MP_EBUSY,
               "still mapped");
  cr_expect_eq(free_bytes(dev), before);

  /* Nothing above disturbed the mapping. */
  base[4 * MiB] = 9;
  cr_assert_eq(mp__device_vm_unmap(dev, base + 4 * MiB, 4 * MiB), MP_OK);
  cr_expect_eq(mp__device_vm_unmap(dev, base + 4 * MiB, 4 * MiB), MP_EINVAL,
               "unmapped twice");
  cr_assert_eq(mp__device_vm_release(dev, base, 16 * MiB), MP_OK);
  cr_expect_eq(mp__device_vm_release(dev, base, 16 * MiB), MP_EINVAL,
               "released twice");
  cr_expect_eq(mp__device_vm_map(dev, base, 2 * MiB), MP_EINVAL,
               "released range");
  cr_assert_eq(mp__device_vm_release(dev, other, 4 * MiB), MP_OK);
  mp_device_close(dev);
}

Test(host_vm, capacity_counts_mapped_bytes) {
  mp_device_t *dev = open_dev("host:capacity=6M");
  char *base = NULL;
  void *p = NULL;
  cr_assert_eq(mp__device_vm_reserve(dev, 64 * MiB, (void **)&base), MP_OK);
  cr_assert_eq(mp__device_vm_map(dev, base, 4 * MiB), MP_OK);
  cr_expect_eq(mp__device_vm_map(dev, base + 4 * MiB, 4 * MiB), MP_ENOMEM);
  cr_expect_eq(mp_device_alloc(dev, 3 * MiB, &p), MP_ENOMEM,
               "plain and mapped memory share the capacity");
  cr_assert_eq(mp__device_vm_map(dev, base + 4 * MiB, 2 * MiB), MP_OK);
  cr_expect_eq(free_bytes(dev), 0);
  cr_assert_eq(mp__device_vm_unmap(dev, base, 4 * MiB), MP_OK);
  cr_expect_eq(mp__device_vm_map(dev, base + 8 * MiB, 4 * MiB), MP_OK,
               "unmapping gave the capacity back");
  mp_device_close(dev);
}

Test(host_vm, fail_after_counts_vm_map) {
  mp_device_t *dev = open_dev("host:fail_after=2");
  char *base = NULL;
  void *p = NULL;
  cr_assert_eq(mp__device_vm_reserve(dev, 8 * MiB, (void **)&base), MP_OK,
               "reserving is not an allocation");
  cr_assert_eq(mp_device_alloc(dev, 4096, &p), MP_OK);
  cr_expect_eq(mp__device_vm_map(dev, base, 2 * MiB), MP_ENOMEM);
  cr_expect_eq(mp__device_vm_unmap(dev, base, 2 * MiB), MP_EINVAL,
               "the failed map mapped nothing");
  cr_expect_eq(mp__device_vm_release(dev, base, 8 * MiB), MP_OK);
  mp_device_close(dev);
}

Test(host_vm, vmm_0_is_enotsup) {
  mp_device_t *dev = open_dev("host:vmm=0");
  size_t g = 0;
  void *p = NULL;
  cr_expect_eq(mp__device_vm_granularity(dev, &g), MP_ENOTSUP);
  cr_expect_eq(mp__device_vm_reserve(dev, 2 * MiB, &p), MP_ENOTSUP);
  cr_expect_eq(mp__device_vm_map(dev, &g, 2 * MiB), MP_ENOTSUP);
  cr_expect_eq(mp__device_vm_unmap(dev, &g, 2 * MiB), MP_ENOTSUP);
  cr_expect_eq(mp__device_vm_release(dev, &g, 2 * MiB), MP_ENOTSUP);
  cr_expect_eq(mp_device_alloc(dev, 2 * MiB, &p), MP_OK,
               "plain allocations still work");
  cr_expect_eq(mp_device_free(dev, p), MP_OK);
  mp_device_close(dev);
}

Test(host_vm, many_reservations_are_found_by_address) {
  mp_device_t *dev = open_dev("host:granularity=64K");
  enum { N = 40 };
  char *r[N];
  size_t g = (size_t)64 << 10;
  for (int i = 0; i < N; i++)
    cr_assert_eq(
        mp__device_vm_reserve(dev, g * (size_t)(1 + i % 3), (void **)&r[i]),
        MP_OK);
  for (int i = 0; i < N; i++) {
    cr_assert_eq(mp__device_vm_map(dev, r[i], g), MP_OK, "i=%d: %s", i,
                 mp_last_error());
    r[i][g - 1] = (char)i;
  }
  for (int i = 0; i < N; i += 2) {
    cr_expect_eq(r[i][g - 1], (char)i);
    cr_assert_eq(mp__device_vm_unmap(dev, r[i], g), MP_OK);
    cr_assert_eq(mp__device_vm_release(dev, r[i], g * (size_t)(1 + i % 3)),
                 MP_OK);
  }
  for (int i = 1; i < N; i += 2)
    cr_expect_eq(r[i][g - 1], (char)i);
  mp_device_close(dev);
}

Test(host_vm, close_releases_reservations_and_mappings) {
  const size_t resv = (size_t)8 << 30;
  mp_device_t *dev = open_dev("host");
  char *a = NULL, *b = NULL;
  cr_assert_eq(mp__device_vm_reserve(dev, resv, (void **)&a), MP_OK);
  cr_assert_eq(mp__device_vm_reserve(dev, resv, (void **)&b), MP_OK);
  cr_assert_eq(mp__device_vm_map(dev, a, 4 * MiB), MP_OK);
  a[0] = 1;
  size_t during = mapped_bytes();
  mp_device_close(dev);
  size_t after = mapped_bytes();
  cr_expect_leq(after + 2 * resv, during + 64 * MiB,
                "mapped: %zu before close, %zu after", during, after);
}
