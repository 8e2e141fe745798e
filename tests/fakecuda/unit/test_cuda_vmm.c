/* The cuda backend's virtual memory services (reserve, map, unmap, release),
 * run on the fake driver: each map is cuMemCreate + cuMemMap +
 * cuMemSetAccess, and each unmap gives back exactly the handle behind it. */
#include <stdlib.h>
#include <string.h>

#include "../../support/device_helpers.h"
#include "device/backend.h"
#include "fakecuda_test.h"

#define G ((size_t)64 << 10)

static mp_device_t *open_cuda(void) {
  setenv("FAKECUDA_DEVICE", "granularity=64K,capacity=64M", 1);
  return open_dev("cuda");
}

Test(cuda_vmm, granularity_is_the_drivers) {
  mp_device_t *dev = open_cuda();
  size_t g = 0;
  cr_assert_eq(mp__device_vm_granularity(dev, &g), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(g, G);
  cr_assert_eq(fk_calls("cuMemGetAllocationGranularity"), 1);
  mp_device_close(dev);
}

Test(cuda_vmm, map_write_read_unmap_release) {
  mp_device_t *dev = open_cuda();
  char *base = NULL;
  cr_assert_eq(mp__device_vm_reserve(dev, 4 * G, (void **)&base), MP_OK, "%s",
               mp_last_error());
  cr_assert_not_null(base);
  cr_assert_eq(mp__device_vm_map(dev, base, G), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp__device_vm_map(dev, base + G, 2 * G), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(fk_calls("cuMemCreate"), 2);
  cr_assert_eq(fk_calls("cuMemMap"), 2);
  cr_assert_eq(fk_calls("cuMemSetAccess"), 2);

  unsigned char *h = NULL;
  cr_assert_eq(mp_device_host_alloc(dev, 3 * G, (void **)&h), MP_OK);
  cr_assert_eq(mp_memset_async(dev, base, 0x11, 3 * G, NULL), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_memcpy_async(dev, h, base, 3 * G, NULL), MP_OK);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_assert_eq(h[0], 0x11);
  cr_assert_eq(h[3 * G - 1], 0x11);

  /* CUDA cannot unmap part of a mapping, nor what was never mapped. */
  cr_assert_eq(mp__device_vm_unmap(dev, base + G, G), MP_EINVAL);
  cr_assert_eq(mp__device_vm_unmap(dev, base + 3 * G, G), MP_EINVAL);
  cr_assert_eq(fk_calls("cuMemUnmap"), 0, "reached the driver");

  cr_assert_eq(mp__device_vm_unmap(dev, base + G, 2 * G), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(fk_calls("cuMemUnmap"), 1);
  cr_assert_eq(fk_calls("cuMemRelease"), 1);
  cr_assert_eq(mp__device_vm_unmap(dev, base + G, 2 * G), MP_EINVAL,
               "unmapped twice");
  cr_assert_eq(mp__device_vm_unmap(dev, base, G), MP_OK, "%s", mp_last_error());
  cr_assert_eq(fk_calls("cuMemRelease"), 2);

  cr_assert_eq(mp__device_vm_release(dev, base, 2 * G), MP_EINVAL,
               "released with the wrong size");
  cr_assert_eq(mp__device_vm_release(dev, base, 4 * G), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp__device_vm_release(dev, base, 4 * G), MP_EINVAL,
               "released twice");
  cr_assert_eq(fk_calls("cuMemAddressFree"), 1);
  mp_device_host_free(dev, h);
  mp_device_close(dev);
}

/* Memory beyond the device's is refused by cuMemCreate, which allocates it
 * (cuda.h: CUDA_ERROR_OUT_OF_MEMORY), so nothing is mapped; a map whose
 * cuMemMap is refused (over a mapping) releases the handle it made. */
Test(cuda_vmm, mapping_beyond_capacity_is_enomem_and_undone) {
  mp_device_t *dev = open_cuda();
  char *base = NULL;
  const size_t big = (size_t)128 << 20;
  cr_assert_eq(mp__device_vm_reserve(dev, big, (void **)&base), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp__device_vm_map(dev, base, big), MP_ENOMEM);
  cr_assert_neq(mp_last_error()[0], '\0');
  cr_assert_eq(fk_calls("cuMemCreate"), 1);
  cr_assert_eq(fk_calls("cuMemMap"), 0, "memory never created was mapped");
  cr_assert_eq(mp__device_vm_map(dev, base, G), MP_OK, "%s", mp_last_error());
  cr_assert_neq(mp__device_vm_map(dev, base, G), MP_OK, "mapped twice");
  cr_assert_eq(fk_calls("cuMemCreate"), 3);
  cr_assert_eq(fk_calls("cuMemRelease"), 1,
               "the handle of the refused cuMemMap was kept");
  cr_assert_eq(mp__device_vm_unmap(dev, base, G), MP_OK);
  cr_assert_eq(fk_calls("cuMemRelease"), 2);
  cr_assert_eq(mp__device_vm_release(dev, base, big), MP_OK);
  mp_device_close(dev);
}

Test(cuda_vmm, close_unmaps_and_frees_what_was_left) {
  mp_device_t *dev = open_cuda();
  char *base = NULL;
  cr_assert_eq(mp__device_vm_reserve(dev, 4 * G, (void **)&base), MP_OK);
  cr_assert_eq(mp__device_vm_map(dev, base, G), MP_OK);
  cr_assert_eq(mp__device_vm_map(dev, base + 2 * G, G), MP_OK);
  mp_device_close(dev);
  cr_assert_eq(fk_calls("cuMemUnmap"), 2);
  cr_assert_eq(fk_calls("cuMemRelease"), 2);
  cr_assert_eq(fk_calls("cuMemAddressFree"), 1);
}

Test(cuda_vmm, without_vmm_support_is_enotsup) {
  setenv("FAKECUDA_NO_VMM", "1", 1);
  mp_device_t *dev = NULL;
  cr_assert_eq(mp_device_open("cuda", &dev), MP_OK, "%s", mp_last_error());
  size_t g = 0;
  void *base = NULL;
  cr_assert_eq(mp__device_vm_granularity(dev, &g), MP_ENOTSUP);
  cr_assert_eq(mp__device_vm_reserve(dev, G, &base), MP_ENOTSUP);
  cr_assert_eq(mp__device_vm_map(dev, &g, G), MP_ENOTSUP);
  cr_assert_eq(fk_calls("cuMemAddressReserve"), 0);
  /* Plain allocations still work. */
  void *p = NULL;
  cr_assert_eq(mp_device_alloc(dev, 4096, &p), MP_OK);
  cr_assert_eq(mp_device_free(dev, p), MP_OK);
  mp_device_close(dev);
}
