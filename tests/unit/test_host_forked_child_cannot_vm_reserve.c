/* A child forked from a process that opened a host device is refused
 * vm_reserve on that device (MP_ENODEV, saying why, *out left alone), as
 * it is refused vm_map, mp_device_alloc and mp_device_host_alloc: the
 * device is its parent's (src/device/host.c, host_inherited). Before, the
 * child's reservation went through, into its copy of the parent's table of
 * reservations. vm_release stays a free there, as vm_unmap and
 * mp_device_free are: the child lets go of its view of a reservation of
 * the parent's, which the parent still maps in afterwards. A pausable
 * pool the child makes there is refused its growth as a forked child's
 * (MP_ENODEV, as when its map was refused), not as out of memory. */
#include <criterion/criterion.h>
#include <string.h>

#include <mempool/mempool.h>

#include "device/backend.h"

#include "../support/device_helpers.h"
#include "../support/fork_child.h"

static mp_device_t *dev;
static void *parents; /* a reservation of the parent's */

static int child_reserve_release(void) {
  void *sentinel = &dev, *p = sentinel;
  if (mp__device_vm_reserve(dev, 2 << 20, &p) != MP_ENODEV)
    return 1;
  if (strstr(mp_last_error(), "vm_reserve") == NULL ||
      strstr(mp_last_error(), "forked child") == NULL)
    return 2;
  if (p != sentinel)
    return 3;
  /* Its view of the parent's reservation goes, as a free. */
  if (mp__device_vm_release(dev, parents, 2 << 20) != MP_OK)
    return 4;
  mp_pool_config_t c;
  mp_pool_config_init(&c);
  mp_pool_t *pool = NULL;
  void *q = NULL;
  if (mp_pool_config_parse(&c, "pausable=1") != MP_OK ||
      mp_pool_create(dev, &c, &pool) != MP_OK)
    return 5;
  mp_status_t st = mp_pool_alloc(pool, 1 << 20, NULL, &q);
  if (st != MP_ENODEV || strstr(mp_last_error(), "forked child") == NULL)
    return 6;
  return mp_pool_destroy(pool) == MP_OK ? 0 : 7;
}

Test(host_forked_child_cannot_vm_reserve, refused_in_the_child) {
  dev = open_dev("host:capacity=64M");
  cr_assert_eq(mp__device_vm_reserve(dev, 2 << 20, &parents), MP_OK, "%s",
               mp_last_error());
  expect_child_passes(child_reserve_release);
  /* The parent's reservation is as it was, and it reserves as before. */
  cr_assert_eq(mp__device_vm_map(dev, parents, 2 << 20), MP_OK, "%s",
               mp_last_error());
  ((unsigned char *)parents)[0] = 7;
  cr_assert_eq(mp__device_vm_unmap(dev, parents, 2 << 20), MP_OK);
  void *more = NULL;
  cr_expect_eq(mp__device_vm_reserve(dev, 2 << 20, &more), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp__device_vm_release(dev, more, 2 << 20), MP_OK);
  cr_expect_eq(mp__device_vm_release(dev, parents, 2 << 20), MP_OK);
  mp_device_close(dev);
}
