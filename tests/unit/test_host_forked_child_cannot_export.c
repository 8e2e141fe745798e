/* test_host_forked_child_cannot_export.c - a child forked from a process
 * using a host device cannot export the memory of the device it inherited
 * (src/device/host.c, host_ipc_export: MP_ENODEV, as its allocations and
 * queued work are refused there, and as CUDA gives a forked child no part
 * of its parent's context). Failed before: the export was made, though
 * the parent, which owns the memory, never learns of it: it frees the
 * block with its pages punched out, and its pool hands the block to its
 * next allocation, while an importer of the child's handle still maps it.
 * The child starts no thread. */
#include <criterion/criterion.h>
#include <string.h>

#include "device/backend.h"

#include "../support/device_helpers.h"
#include "../support/fork_child.h"

#define MiB ((size_t)1 << 20)

static mp_device_t *dev;
static mp_pool_t *pool;
static void *block, *plain;

static bool refused_as_forked(mp_status_t st) {
  return st != MP_OK && strstr(mp_last_error(), "forked child") != NULL;
}

static int in_child(void) {
  mp_ipc_handle_t h;
  memset(&h, 0, sizeof h);
  if (!refused_as_forked(mp_pool_ipc_export(pool, block, &h)))
    return 1;
  memset(&h, 0, sizeof h);
  mp_status_t st = mp__device_ipc_export(dev, plain, MiB, false, &h);
  if (st != MP_ENODEV || !refused_as_forked(st))
    return 2;
  return 0;
}

Test(host_forked_child_cannot_export, the_parents_memory_is_not_exported) {
  dev = open_dev("host:capacity=64M");
  cr_assert_eq(mp_pool_create(dev, NULL, &pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, MiB, NULL, &block), MP_OK);
  cr_assert_eq(mp_device_alloc(dev, MiB, &plain), MP_OK);
  expect_child_passes(in_child);
  /* The parent's own export still works. */
  mp_ipc_handle_t h;
  cr_expect_eq(mp_pool_ipc_export(pool, block, &h), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_ipc_handle_close(&h), MP_OK);
  cr_expect_eq(mp_pool_free(pool, block), MP_OK);
  cr_expect_eq(mp_device_free(dev, plain), MP_OK);
  cr_expect_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}
