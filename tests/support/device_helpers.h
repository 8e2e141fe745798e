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

/* Runs fn(arg) as a host function on a new stream of dev, where no call
 * may wait for the device's work (the host device refuses such a wait
 * with MP_EINVAL, as CUDA forbids API calls there), and returns once it
 * ran. */
static inline void run_in_host_fn(mp_device_t *dev, void (*fn)(void *),
                                  void *arg) {
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_launch_host(dev, s, fn, arg), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
}

#endif /* MEMPOOL_TEST_DEVICE_HELPERS_H */
