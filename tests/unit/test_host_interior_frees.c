/* A free of a pointer inside an allocation of the host device, not at its
 * start, names that allocation (its address and size), as the pools and
 * the direct allocator name a block; it said the pointer "was not returned
 * by mp_device_alloc ... or was already freed", which sent the reader
 * looking for a double free. The allocation stays live. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "../support/device_helpers.h"

#define KiB ((size_t)1 << 10)

/* The refusal of a free of base + off names the allocation at base of
 * bytes bytes. */
static void expect_names(mp_status_t st, const char *fn, void *base,
                         size_t bytes) {
  cr_assert_eq(st, MP_EINVAL, "%s: %s", fn, mp_status_name(st));
  char want[96];
  snprintf(want, sizeof want, "inside the allocation at %p (%zu bytes)", base,
           bytes);
  cr_expect(strstr(mp_last_error(), fn) != NULL &&
                strstr(mp_last_error(), want) != NULL,
            "wanted \"%s\" from %s: %s", want, fn, mp_last_error());
}

typedef mp_status_t (*alloc_fn)(mp_device_t *, size_t, void **);
typedef mp_status_t (*free_fn)(mp_device_t *, void *);

static void interior_free_names_its_allocation(alloc_fn alloc, free_fn release,
                                               const char *fn) {
  mp_device_t *dev = open_dev("host:capacity=16M");
  unsigned char *p = NULL;
  cr_assert_eq(alloc(dev, 64 * KiB, (void **)&p), MP_OK);
  expect_names(release(dev, p + 1), fn, p, 64 * KiB);
  expect_names(release(dev, p + 64 * KiB - 1), fn, p, 64 * KiB);
  /* Still live: the memory works, and a free at its start frees it. */
  cr_assert_eq(mp_memset_async(dev, p, 9, 64 * KiB, NULL), MP_OK);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_expect_eq(p[64 * KiB - 1], 9);
  cr_assert_eq(release(dev, p), MP_OK, "%s", mp_last_error());
  /* Once freed, and past every allocation: as before. */
  cr_assert_eq(release(dev, p), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "already freed") != NULL, "%s",
            mp_last_error());
  cr_expect(strstr(mp_last_error(), "inside") == NULL, "%s", mp_last_error());
  mp_device_close(dev);
}

Test(host_interior_frees, a_device_free_inside_an_allocation_names_it) {
  interior_free_names_its_allocation(mp_device_alloc, mp_device_free,
                                     "mp_device_free");
}

Test(host_interior_frees, a_host_free_inside_an_allocation_names_it) {
  interior_free_names_its_allocation(mp_device_host_alloc, mp_device_host_free,
                                     "mp_device_host_free");
}
