/* test_host_copy_past_file_end.c - a copy on the host device whose host
 * side is a file mapping past the end of its file (mapped read and write,
 * but a touch there is SIGBUS) is MP_EINVAL when queued, saying why, and
 * queues nothing (src/device/host.c, host_host_access: the madvise probe
 * cannot bring such a page in). Before, /proc/self/maps showed the mapping
 * with the access, the copy was queued, and its stream's worker died of
 * SIGBUS, and the process with it. */
#include <criterion/criterion.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../support/device_helpers.h"

static void expect_refused(mp_status_t st) {
  cr_expect_eq(st, MP_EINVAL, "%s", mp_status_name(st));
  cr_expect(strstr(mp_last_error(), "cannot be brought in") != NULL, "%s",
            mp_last_error());
}

Test(host_copy_past_file_end, refused_both_ways) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  mp_device_t *dev = open_dev("host:capacity=16M");
  unsigned char *dm = NULL;
  cr_assert_eq(mp_device_alloc(dev, page, (void **)&dm), MP_OK);
  memset(dm, 0x11, page);
  /* A file of one page, mapped two pages long. */
  int fd = memfd_create("past-file-end", MFD_CLOEXEC);
  cr_assert_geq(fd, 0);
  cr_assert_eq(ftruncate(fd, (off_t)page), 0);
  unsigned char *f =
      mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  cr_assert_neq(f, MAP_FAILED);
  memset(f, 0x22, page);
  expect_refused(mp_memcpy_async(dev, dm, f + page, page, NULL));
  expect_refused(mp_memcpy_async(dev, f + page, dm, page, NULL));
  expect_refused(mp_memcpy_async(dev, dm, f + page / 2, page, NULL));
  cr_assert_eq(mp_device_synchronize(dev), MP_OK, "%s", mp_last_error());
  cr_expect_eq(dm[0], 0x11, "a refused copy ran");
  /* The page inside the file copies as before. */
  cr_expect_eq(mp_memcpy_async(dev, dm, f, page, NULL), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_expect_eq(dm[page - 1], 0x22);
  munmap(f, 2 * page);
  close(fd);
  cr_expect_eq(mp_device_free(dev, dm), MP_OK);
  mp_device_close(dev);
}
