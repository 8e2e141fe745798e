/* test_host_copy_needs_host_memory_access.c - a copy on the host device
 * whose host side is mapped without the access the copy needs (a
 * destination mapped read-only, a source mapped PROT_NONE) is MP_EINVAL
 * when queued, and queues nothing, rather than fault on the stream's
 * worker thread, which killed the process (src/device/host.c,
 * host_check_access: host_host_access). Host memory with the access is
 * copied as before, read-only memory as a source too. Failed before: the
 * copies were queued, and the process died of SIGSEGV on the worker. */
#include <criterion/criterion.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../support/device_helpers.h"

static size_t page;
static unsigned char *dm; /* device memory, two pages */

static mp_device_t *setup(void) {
  page = (size_t)sysconf(_SC_PAGESIZE);
  mp_device_t *dev = open_dev("host:capacity=16M");
  cr_assert_eq(mp_device_alloc(dev, 2 * page, (void **)&dm), MP_OK);
  memset(dm, 0x11, 2 * page);
  return dev;
}

/* Two pages of host memory: the first read and write, the second prot. */
static unsigned char *two_pages(int prot) {
  unsigned char *h = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(h, MAP_FAILED);
  memset(h, 0x22, 2 * page);
  cr_assert_eq(mprotect(h + page, page, prot), 0);
  return h;
}

static void expect_refused(mp_status_t st, const char *access) {
  cr_expect_eq(st, MP_EINVAL, "%s", mp_status_name(st));
  if (st == MP_EINVAL)
    cr_expect(strstr(mp_last_error(), access) != NULL &&
                  strstr(mp_last_error(), "without") != NULL,
              "%s", mp_last_error());
}

Test(host_copy_needs_host_memory_access, into_read_only_memory_is_einval) {
  mp_device_t *dev = setup();
  unsigned char *h = two_pages(PROT_READ);
  /* Wholly read-only, and reaching into it from a writable page. */
  expect_refused(mp_memcpy_async(dev, h + page, dm, page, NULL), "write");
  expect_refused(mp_memcpy_async(dev, h + page / 2, dm, page, NULL), "write");
  cr_assert_eq(mp_device_synchronize(dev), MP_OK, "%s", mp_last_error());
  cr_expect_eq(h[page], 0x22, "a refused copy ran");
  /* The writable page takes a copy; the read-only one gives one. */
  cr_expect_eq(mp_memcpy_async(dev, h, dm, page, NULL), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_memcpy_async(dev, dm + page, h + page, page, NULL), MP_OK,
               "%s", mp_last_error());
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_expect_eq(h[page - 1], 0x11);
  cr_expect_eq(dm[2 * page - 1], 0x22);
  munmap(h, 2 * page);
  cr_expect_eq(mp_device_free(dev, dm), MP_OK);
  mp_device_close(dev);
}

Test(host_copy_needs_host_memory_access, from_or_into_prot_none_is_einval) {
  mp_device_t *dev = setup();
  unsigned char *h = two_pages(PROT_NONE);
  expect_refused(mp_memcpy_async(dev, dm, h + page, page, NULL), "read");
  expect_refused(mp_memcpy_async(dev, dm, h + 1, page, NULL), "read");
  expect_refused(mp_memcpy_async(dev, h + page, dm, page, NULL), "write");
  cr_assert_eq(mp_device_synchronize(dev), MP_OK, "%s", mp_last_error());
  cr_expect_eq(dm[0], 0x11, "a refused copy ran");
  /* Memory no longer mapped is still refused as such. */
  munmap(h, 2 * page);
  mp_status_t st = mp_memcpy_async(dev, dm, h, page, NULL);
  cr_expect_eq(st, MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "neither memory of a host device") != NULL,
            "%s", mp_last_error());
  cr_expect_eq(mp_device_free(dev, dm), MP_OK);
  mp_device_close(dev);
}
