/* test_host_vm_reserve_too_large_says_so.c - a reservation of the host
 * device whose size is a multiple of the granule but leaves no room for
 * the granule its base is aligned with (above SIZE_MAX - granule) is
 * MP_EINVAL as too large, not as "not a positive multiple of the
 * granularity", which it is (src/device/host.c, host_vm_reserve). Failed
 * before: the message said the size was no multiple. The device is as it
 * was: a reservation of an ordinary size still succeeds. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "device/backend.h"

#include "../support/device_helpers.h"

#define MiB ((size_t)1 << 20)

static void expect_too_large(mp_device_t *dev, size_t bytes) {
  void *base = NULL;
  cr_expect_eq(mp__device_vm_reserve(dev, bytes, &base), MP_EINVAL);
  const char *msg = mp_last_error();
  cr_expect_not_null(strstr(msg, "too large"), "%zu bytes: %s", bytes, msg);
  cr_expect_null(strstr(msg, "not a positive multiple"), "%zu bytes: %s", bytes,
                 msg);
  cr_expect_null(base, "nothing reserved");
}

Test(host_vm_reserve_too_large_says_so, a_size_past_the_address_space) {
  mp_device_t *dev = open_dev("host:capacity=64M,granularity=2M");
  expect_too_large(dev, SIZE_MAX - 2 * MiB + 1); /* the last multiple */
  /* A size that is no multiple is still said to be one. */
  void *base = NULL;
  cr_expect_eq(mp__device_vm_reserve(dev, 3 * MiB, &base), MP_EINVAL);
  cr_expect_not_null(strstr(mp_last_error(), "not a positive multiple"), "%s",
                     mp_last_error());
  cr_assert_eq(mp__device_vm_reserve(dev, 4 * MiB, &base), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp__device_vm_release(dev, base, 4 * MiB), MP_OK);
  mp_device_close(dev);
}
