/* A device allocation of the host device that the process's address space
 * cannot hold (its mmap fails), on a device whose capacity allows it, is
 * MP_ENOMEM and leaves the device as it was: later allocations and
 * virtual-memory maps of an ordinary size still succeed. The range of the
 * device file such an allocation was given is taken back (host.c,
 * host_file_unrange), and a size past the file's bound (4 EiB and more)
 * no longer wraps the bound's check (host_file_range). */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "device/backend.h"

#include "../support/device_helpers.h"

#define MiB ((size_t)1 << 20)

/* The largest capacity the spec takes: no allocation is refused for it. */
#define HUGE_SPEC "host:capacity=16777215T"

static void expect_too_big_then_usable(size_t bytes) {
  mp_device_t *dev = open_dev(HUGE_SPEC);
  size_t free0 = free_bytes(dev);
  void *p = NULL;
  cr_expect_eq(mp_device_alloc(dev, bytes, &p), MP_ENOMEM,
               "%zu bytes cannot be mapped in this process", bytes);
  cr_expect_eq(free_bytes(dev), free0, "nothing charged");
  /* The device goes on as before. */
  void *q = NULL;
  cr_expect_eq(mp_device_alloc(dev, 4 * MiB, &q), MP_OK, "%s", mp_last_error());
  if (q != NULL) {
    memset(q, 0x5a, 4 * MiB);
    cr_expect_eq(mp_device_free(dev, q), MP_OK);
  }
  char *base = NULL;
  cr_assert_eq(mp__device_vm_reserve(dev, 4 * MiB, (void **)&base), MP_OK);
  cr_expect_eq(mp__device_vm_map(dev, base, 4 * MiB), MP_OK, "%s",
               mp_last_error());
  mp_device_close(dev);
}

Test(host_alloc_too_big, a_size_past_the_file_bound_leaves_the_device_usable) {
  /* 4 EiB: the page-rounded size is above the device file's bound alone. */
  expect_too_big_then_usable((size_t)1 << 62);
  expect_too_big_then_usable(((size_t)1 << 62) + ((size_t)1 << 61));
}

Test(host_alloc_too_big, a_size_the_file_holds_leaves_the_device_usable) {
  /* Inside the file's bound (just under 4 EiB), far past any address
   * space: the mmap fails after the file range was handed out. */
  expect_too_big_then_usable(((size_t)1 << 62) - 2 * MiB);
}
