/* The cuda backend's vm_map is cuMemCreate + cuMemMap + cuMemSetAccess,
 * undone step by step when a step is refused. Where cuMemSetAccess is
 * refused and the undoing cuMemUnmap too, the chunk stays mapped: the map
 * fails saying so, and the chunk stays tracked with its handle, so that
 * vm_unmap (or close) unmaps it and releases exactly that handle. Before,
 * its handle was released under the mapping and the chunk forgotten:
 * vm_unmap said nothing was mapped there, and the reservation could never
 * be released (cuMemAddressFree refuses one with a mapping in it). The
 * refusals are the fake's (cuFakeRefuse): no GPU twin. */
#include <stdlib.h>
#include <string.h>

#include "../../support/device_helpers.h"
#include "device/backend.h"
#include "fakecuda_test.h"

#define G ((size_t)64 << 10)

Test(cuda_vm_map_refused_undo, the_chunk_left_mapped_stays_tracked) {
  setenv("FAKECUDA_DEVICE", "granularity=64K,capacity=64M", 1);
  mp_device_t *dev = open_dev("cuda");
  char *base = NULL;
  cr_assert_eq(mp__device_vm_reserve(dev, 4 * G, (void **)&base), MP_OK, "%s",
               mp_last_error());
  size_t free0 = free_bytes(dev);
  long long releases = fk_calls("cuMemRelease");
  fk_refuse("cuMemSetAccess", CUDA_ERROR_UNKNOWN, 1);
  fk_refuse("cuMemUnmap", CUDA_ERROR_UNKNOWN, 1);
  mp_status_t st = mp__device_vm_map(dev, base, G);
  cr_assert_neq(st, MP_OK, "the refused map succeeded");
  cr_expect(strstr(mp_last_error(), "stays mapped") != NULL, "%s",
            mp_last_error());
  cr_expect_eq(fk_calls("cuMemRelease"), releases,
               "the handle was released under its mapping");
  cr_expect_eq(mp__device_vm_unmap(dev, base, G), MP_OK,
               "the chunk left mapped was forgotten: %s", mp_last_error());
  cr_expect_eq(fk_calls("cuMemRelease") - releases, 1);
  cr_expect_eq(free_bytes(dev), free0, "device memory left behind");
  cr_expect_eq(mp__device_vm_release(dev, base, 4 * G), MP_OK, "%s",
               mp_last_error());
  /* Mapped again, as any range. */
  cr_assert_eq(mp__device_vm_reserve(dev, 4 * G, (void **)&base), MP_OK);
  cr_assert_eq(mp__device_vm_map(dev, base, G), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp__device_vm_unmap(dev, base, G), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp__device_vm_release(dev, base, 4 * G), MP_OK);
  mp_device_close(dev);
}
