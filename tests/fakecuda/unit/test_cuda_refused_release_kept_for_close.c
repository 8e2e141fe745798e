/* A physical handle that no mapping holds is still the device's memory
 * until cuMemRelease takes it (cuda.h, cuMemRelease: "The memory
 * allocation will be freed when all outstanding mappings to the memory are
 * unmapped and when all outstanding references to the handle ... are also
 * released"). Where the driver refuses that release (after vm_unmap's
 * cuMemUnmap, or undoing a vm_map refused at cuMemMap or cuMemSetAccess),
 * the cuda backend keeps the handle and mp_device_close releases it.
 * Before, it was forgotten: its memory stayed taken for as long as the
 * primary context lived, which another holder of that context (here a
 * second device, as the CUDA runtime would be) keeps alive. The refusals
 * are the fake's (cuFakeRefuse): no GPU twin. */
#include <stdlib.h>

#include "../../support/device_helpers.h"
#include "device/backend.h"
#include "fakecuda_test.h"

#define G ((size_t)64 << 10)

/* dev and keeper: two devices on the fake's one GPU, so one primary
 * context that keeper keeps once dev is closed; *base: a reservation of
 * 4 G on dev; *free0: keeper's free memory with nothing mapped. */
static void open_two(mp_device_t **dev, mp_device_t **keeper, char **base,
                     size_t *free0) {
  if (fk_is_real())
    cr_skip_test("the refusals are the fake driver's");
  setenv("FAKECUDA_DEVICE", "granularity=64K,capacity=64M", 1);
  *dev = open_dev("cuda");
  *keeper = open_dev("cuda");
  cr_assert_eq(mp__device_vm_reserve(*dev, 4 * G, (void **)base), MP_OK, "%s",
               mp_last_error());
  *free0 = free_bytes(*keeper);
}

/* Closes dev, whose refused release left a handle alive (releases: the
 * count of cuMemRelease calls before; made: its calls since), and checks
 * that the close released it: keeper sees the memory free again. */
static void close_releases_the_handle(mp_device_t *dev, mp_device_t *keeper,
                                      size_t free0, long long releases,
                                      long long made) {
  cr_expect_lt(free_bytes(keeper), free0,
               "the refused release freed the memory anyway");
  mp_device_close(dev);
  cr_expect_eq(fk_calls("cuMemRelease") - releases, made + 1,
               "mp_device_close did not release the handle whose release "
               "was refused");
  cr_expect_eq(free_bytes(keeper), free0,
               "the handle whose release was refused was forgotten: its "
               "memory stays taken");
  mp_device_close(keeper);
}

Test(cuda_refused_release, after_an_unmap_the_handle_is_released_at_close) {
  mp_device_t *dev, *keeper;
  char *base;
  size_t free0;
  open_two(&dev, &keeper, &base, &free0);
  cr_assert_eq(mp__device_vm_map(dev, base, G), MP_OK, "%s", mp_last_error());
  long long releases = fk_calls("cuMemRelease");
  fk_refuse("cuMemRelease", CUDA_ERROR_UNKNOWN, 1);
  /* Unmapped: the range is free again, whatever the release said. */
  cr_expect_eq(mp__device_vm_unmap(dev, base, G), MP_OK, "%s", mp_last_error());
  fk_refuse("cuMemRelease", CUDA_SUCCESS, 0);
  cr_assert_eq(fk_calls("cuMemRelease") - releases, 1);
  cr_expect_eq(mp__device_vm_release(dev, base, 4 * G), MP_OK, "%s",
               mp_last_error());
  close_releases_the_handle(dev, keeper, free0, releases, 1);
}

/* vm_map undone after a refused step: the undoing cuMemRelease refused. */
static void refused_map_undone(const char *step) {
  mp_device_t *dev, *keeper;
  char *base;
  size_t free0;
  open_two(&dev, &keeper, &base, &free0);
  long long releases = fk_calls("cuMemRelease");
  fk_refuse(step, CUDA_ERROR_UNKNOWN, 1);
  fk_refuse("cuMemRelease", CUDA_ERROR_UNKNOWN, 1);
  cr_expect_neq(mp__device_vm_map(dev, base, G), MP_OK,
                "the map refused at %s succeeded", step);
  fk_refuse(step, CUDA_SUCCESS, 0);
  fk_refuse("cuMemRelease", CUDA_SUCCESS, 0);
  cr_assert_eq(fk_calls("cuMemRelease") - releases, 1);
  /* Nothing is mapped: the range is mapped and released as any other. */
  cr_expect_eq(mp__device_vm_unmap(dev, base, G), MP_EINVAL);
  cr_assert_eq(mp__device_vm_map(dev, base, G), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp__device_vm_unmap(dev, base, G), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp__device_vm_release(dev, base, 4 * G), MP_OK, "%s",
               mp_last_error());
  close_releases_the_handle(dev, keeper, free0, releases, 2);
}

Test(cuda_refused_release,
     after_a_refused_map_the_handle_is_released_at_close) {
  refused_map_undone("cuMemMap");
}

Test(cuda_refused_release,
     after_a_refused_access_the_handle_is_released_at_close) {
  refused_map_undone("cuMemSetAccess");
}
