/* test_host_copy_large_host_range_checked.c - a copy on the host device
 * whose host side is larger than what host_host_access probes with madvise
 * (src/device/host.c, HOST_PROBE_MAX: 1 MiB) is checked all the same,
 * through /proc/self/maps: its last page read-only (a destination), not
 * mapped or PROT_NONE (a source) is MP_EINVAL when queued, and nothing
 * runs; a range with the access copies. */
#include <criterion/criterion.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../support/device_helpers.h"

#define BIG ((size_t)3 << 20)

Test(host_copy_large_host_range_checked, refused_past_the_probe_size) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  mp_device_t *dev = open_dev("host:capacity=64M");
  unsigned char *dm = NULL;
  cr_assert_eq(mp_device_alloc(dev, BIG, (void **)&dm), MP_OK);
  memset(dm, 0x11, BIG);
  unsigned char *h = mmap(NULL, BIG, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(h, MAP_FAILED);
  memset(h, 0x22, BIG);
  cr_assert_eq(mprotect(h + BIG - page, page, PROT_READ), 0);
  mp_status_t st = mp_memcpy_async(dev, h, dm, BIG, NULL);
  cr_expect_eq(st, MP_EINVAL, "%s", mp_status_name(st));
  cr_expect(strstr(mp_last_error(), "without write access") != NULL, "%s",
            mp_last_error());
  cr_assert_eq(mprotect(h + BIG - page, page, PROT_NONE), 0);
  st = mp_memcpy_async(dev, dm, h, BIG, NULL);
  cr_expect_eq(st, MP_EINVAL, "%s", mp_status_name(st));
  cr_expect(strstr(mp_last_error(), "without read access") != NULL, "%s",
            mp_last_error());
  cr_assert_eq(mp_device_synchronize(dev), MP_OK, "%s", mp_last_error());
  cr_expect_eq(h[0], 0x22, "a refused copy ran");
  cr_expect_eq(dm[0], 0x11, "a refused copy ran");
  /* All of it with the access: copied. */
  cr_assert_eq(mprotect(h + BIG - page, page, PROT_READ | PROT_WRITE), 0);
  cr_expect_eq(mp_memcpy_async(dev, h, dm, BIG, NULL), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_expect_eq(h[BIG - 1], 0x11);
  /* Not mapped at its end. */
  cr_assert_eq(munmap(h + BIG - page, page), 0);
  st = mp_memcpy_async(dev, dm, h, BIG, NULL);
  cr_expect_eq(st, MP_EINVAL, "%s", mp_status_name(st));
  cr_expect(strstr(mp_last_error(), "neither memory of a host device") != NULL,
            "%s", mp_last_error());
  munmap(h, BIG - page);
  cr_expect_eq(mp_device_free(dev, dm), MP_OK);
  mp_device_close(dev);
}
