/* test_host_copy_write_only_source.c - the host device's rule for host
 * memory mapped PROT_WRITE without PROT_READ (src/device/host.c,
 * host_check_access): a copy from it is MP_EINVAL when queued, saying that
 * the memory has no read access, and queues nothing, though an x86 CPU
 * could read it (its page tables cannot say write-only): the mapping grants
 * no read, and the kernel's rule for a device reading host memory (pinning
 * its pages) is the mapping's. A copy into it is taken: it only writes.
 * The rule holds however the access is checked (/proc/self/maps, or the
 * madvise probe host_host_access asks first). */
#include <criterion/criterion.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../support/device_helpers.h"

Test(host_copy_write_only_source, refused_as_a_source_taken_as_a_destination) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  mp_device_t *dev = open_dev("host:capacity=16M");
  unsigned char *dm = NULL;
  cr_assert_eq(mp_device_alloc(dev, page, (void **)&dm), MP_OK);
  memset(dm, 0x11, page);
  unsigned char *wo =
      mmap(NULL, page, PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(wo, MAP_FAILED);
  mp_status_t st = mp_memcpy_async(dev, dm, wo, page, NULL);
  cr_expect_eq(st, MP_EINVAL, "%s", mp_status_name(st));
  cr_expect(strstr(mp_last_error(), "without read access") != NULL, "%s",
            mp_last_error());
  cr_assert_eq(mp_device_synchronize(dev), MP_OK, "%s", mp_last_error());
  cr_expect_eq(dm[0], 0x11, "the refused copy ran");
  /* Into it: written (read back once it is readable). */
  cr_expect_eq(mp_memcpy_async(dev, wo, dm, page, NULL), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_assert_eq(mprotect(wo, page, PROT_READ), 0);
  cr_expect_eq(wo[page - 1], 0x11);
  munmap(wo, page);
  cr_expect_eq(mp_device_free(dev, dm), MP_OK);
  mp_device_close(dev);
}
