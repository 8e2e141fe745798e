/* "cuda" on a machine without a CUDA driver: registered without the fake
 * driver's directory on the library path, so libcuda.so.1 is not found
 * (unless a real driver is installed, which is checked first). */
#include <dlfcn.h>
#include <string.h>

#include <criterion/criterion.h>
#include <mempool/mempool.h>

static bool driver_installed(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h != NULL)
    dlclose(h);
  return h != NULL;
}

Test(cuda_without_driver, open_is_enodev_and_names_the_library) {
  mp_device_t *dev = NULL;
  mp_status_t st = mp_device_open("cuda", &dev);
  if (driver_installed()) {
    /* A real driver: whatever it says, it is a status, not a crash. */
    cr_assert(st == MP_OK || st == MP_ENODEV || st == MP_EDRIVER, "%s",
              mp_status_name(st));
    mp_device_close(dev);
    return;
  }
  cr_assert_eq(st, MP_ENODEV, "%s: %s", mp_status_name(st), mp_last_error());
  cr_assert_null(dev);
  cr_assert(strstr(mp_last_error(), "libcuda.so.1") != NULL, "%s",
            mp_last_error());
  /* And again: the failed load is remembered, not retried into a crash. */
  cr_assert_eq(mp_device_open("cuda:1", &dev), MP_ENODEV);
}

Test(cuda_without_driver, malformed_spec_is_einval_before_loading) {
  mp_device_t *dev = NULL;
  cr_assert_eq(mp_device_open("cuda:zero", &dev), MP_EINVAL);
  cr_assert_null(dev);
}

Test(cuda_without_driver, default_open_falls_back_to_host) {
  if (driver_installed())
    return; /* the default may rightly be the GPU there */
  unsetenv("MEMPOOL_DEVICE");
  mp_device_t *dev = NULL;
  cr_assert_eq(mp_device_open(NULL, &dev), MP_OK, "%s", mp_last_error());
  cr_assert(strncmp(mp_device_name(dev), "host", 4) == 0, "%s",
            mp_device_name(dev));
  mp_device_close(dev);
}
