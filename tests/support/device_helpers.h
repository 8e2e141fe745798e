/* device_helpers.h - shared by the device tests: open a device from a spec
 * (the test stops with mp_last_error() if it cannot) and read its free
 * memory. */
#ifndef MEMPOOL_TEST_DEVICE_HELPERS_H
#define MEMPOOL_TEST_DEVICE_HELPERS_H

#include <criterion/criterion.h>

#include <mempool/mempool.h>

/* spec may be NULL ($MEMPOOL_DEVICE, else cuda, else host). */
static inline mp_device_t *open_dev(const char *spec) {
  mp_device_t *dev = NULL;
  mp_status_t st = mp_device_open(spec, &dev);
  cr_assert_eq(st, MP_OK, "open '%s': %s: %s", spec ? spec : "(NULL)",
               mp_status_name(st), mp_last_error());
  return dev;
}

static inline size_t free_bytes(mp_device_t *dev) {
  size_t f = 0, t = 0;
  cr_assert_eq(mp_device_mem_info(dev, &f, &t), MP_OK, "%s", mp_last_error());
  return f;
}

#endif /* MEMPOOL_TEST_DEVICE_HELPERS_H */
