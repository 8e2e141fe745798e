/* vm_release takes a reservation with nothing mapped in it (backend.h); the
 * host device refuses one that still has mappings with MP_EBUSY (host.c).
 * The cuda backend did not look: it handed the range to cuMemAddressFree,
 * whose cuda.h text says nothing of mappings (a driver may free the range
 * under them; the fake refuses with CUDA_ERROR_INVALID_VALUE), and answered
 * whatever the driver said. Now it refuses as the host device does, before
 * the driver is asked, and changes nothing: the mapping and the reservation
 * stay, and are unmapped and released as any other. */
#include <stdlib.h>
#include <string.h>

#include "../../support/device_helpers.h"
#include "device/backend.h"
#include "fakecuda_test.h"

#define G ((size_t)64 << 10)

Test(cuda_vm_release_mapped, a_reservation_with_a_mapping_is_busy) {
  setenv("FAKECUDA_DEVICE", "granularity=64K,capacity=64M", 1);
  mp_device_t *dev = open_dev("cuda");
  char *base = NULL, *other = NULL;
  cr_assert_eq(mp__device_vm_reserve(dev, 4 * G, (void **)&base), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp__device_vm_reserve(dev, 4 * G, (void **)&other), MP_OK, "%s",
               mp_last_error());
  /* A mapping at the end of one reservation, none at its start. */
  cr_assert_eq(mp__device_vm_map(dev, base + 3 * G, G), MP_OK, "%s",
               mp_last_error());
  long long frees = fk_calls("cuMemAddressFree");
  mp_status_t st = mp__device_vm_release(dev, base, 4 * G);
  cr_expect_eq(st, MP_EBUSY, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect_eq(mp_last_status(), MP_EBUSY);
  cr_expect(strstr(mp_last_error(), "vm_release") != NULL &&
                strstr(mp_last_error(), "mapped") != NULL,
            "%s", mp_last_error());
  cr_expect_eq(fk_calls("cuMemAddressFree"), frees,
               "the driver was asked to free a range still mapped");
  /* Nothing changed: the mapping is still there and still the device's. */
  cr_expect_eq(mp_memset_async(dev, base + 3 * G, 0x5a, G, NULL), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_device_synchronize(dev), MP_OK, "%s", mp_last_error());
  /* Another reservation, with nothing mapped in it, is released. */
  cr_expect_eq(mp__device_vm_release(dev, other, 4 * G), MP_OK, "%s",
               mp_last_error());
  /* Unmapped, the reservation is released, once. */
  cr_assert_eq(mp__device_vm_unmap(dev, base + 3 * G, G), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp__device_vm_release(dev, base, 4 * G), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(fk_calls("cuMemAddressFree") - frees, 2);
  mp_device_close(dev);
  cr_expect_eq(fk_calls("cuMemAddressFree") - frees, 2,
               "close freed a reservation released already");
}

/* A chunk left mapped by a refused undo (vm_map's cuMemSetAccess refused,
 * then its cuMemUnmap) is a mapping too. */
Test(cuda_vm_release_mapped, a_chunk_left_by_a_refused_undo_is_a_mapping) {
  setenv("FAKECUDA_DEVICE", "granularity=64K,capacity=64M", 1);
  mp_device_t *dev = open_dev("cuda");
  char *base = NULL;
  cr_assert_eq(mp__device_vm_reserve(dev, 2 * G, (void **)&base), MP_OK, "%s",
               mp_last_error());
  fk_refuse("cuMemSetAccess", CUDA_ERROR_UNKNOWN, 1);
  fk_refuse("cuMemUnmap", CUDA_ERROR_UNKNOWN, 1);
  cr_assert_neq(mp__device_vm_map(dev, base, G), MP_OK);
  long long frees = fk_calls("cuMemAddressFree");
  mp_status_t st = mp__device_vm_release(dev, base, 2 * G);
  cr_expect_eq(st, MP_EBUSY, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect_eq(fk_calls("cuMemAddressFree"), frees);
  cr_assert_eq(mp__device_vm_unmap(dev, base, G), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp__device_vm_release(dev, base, 2 * G), MP_OK, "%s",
               mp_last_error());
  mp_device_close(dev);
}
