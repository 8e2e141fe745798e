/* A child forked from a process that opened a host device is refused
 * mp_device_host_alloc on that device (MP_ENODEV, saying why, *out left
 * alone), as it is refused mp_device_alloc: the device is its parent's,
 * as CUDA refuses a forked child its parent's context (cuMemHostAlloc
 * included). Before, the child's page-locked allocation went through. The
 * parent's own allocations go on as before. */
#include <criterion/criterion.h>
#include <string.h>

#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "../support/fork_child.h"

static mp_device_t *dev;

static int child_host_alloc(void) {
  void *sentinel = &dev, *p = sentinel;
  if (mp_device_host_alloc(dev, 4096, &p) != MP_ENODEV)
    return 1;
  if (strstr(mp_last_error(), "mp_device_host_alloc") == NULL ||
      strstr(mp_last_error(), "forked child") == NULL)
    return 2;
  if (p != sentinel)
    return 3;
  return 0;
}

Test(host_forked_child_cannot_host_alloc, refused_in_the_child) {
  dev = open_dev("host:capacity=64M");
  void *pinned = NULL;
  cr_assert_eq(mp_device_host_alloc(dev, 4096, &pinned), MP_OK, "%s",
               mp_last_error());
  expect_child_passes(child_host_alloc);
  void *more = NULL;
  cr_expect_eq(mp_device_host_alloc(dev, 4096, &more), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_device_host_free(dev, more), MP_OK);
  cr_expect_eq(mp_device_host_free(dev, pinned), MP_OK);
  mp_device_close(dev);
}
