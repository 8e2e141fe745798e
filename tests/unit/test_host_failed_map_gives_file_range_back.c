/* A device allocation or a vm_map of the host device that fails after the
 * device file handed it a range (host memory to track it ran out) gives
 * that range back, as an allocation whose mmap fails does (host.c,
 * host_file_unrange): the next one reuses its offsets, and the file does
 * not grow for memory nobody holds. The file's size is read from the
 * descriptor /proc/self/fd shows for the device's memfd. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "device/backend.h"

#include "../support/device_helpers.h"

#define MiB ((size_t)1 << 20)

/* The size of the (one) host device file this process has open. */
static off_t device_file_size(void) {
  DIR *d = opendir("/proc/self/fd");
  cr_assert_not_null(d);
  off_t size = -1;
  int found = 0;
  for (struct dirent *de; (de = readdir(d)) != NULL;) {
    char path[300], link[128];
    snprintf(path, sizeof path, "/proc/self/fd/%s", de->d_name);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n <= 0)
      continue;
    link[n] = '\0';
    struct stat st;
    if (strstr(link, "/memfd:mempool-host-device") == link &&
        stat(path, &st) == 0) {
      size = st.st_size;
      found++;
    }
  }
  closedir(d);
  cr_assert_eq(found, 1, "one host device file open");
  return size;
}

Test(host_failed_map, a_vm_map_whose_tracking_fails_gives_its_range_back) {
  mp_device_t *dev = open_dev("host:capacity=64M,granularity=2M");
  size_t free0 = free_bytes(dev);
  char *base = NULL;
  cr_assert_eq(mp__device_vm_reserve(dev, 4 * MiB, (void **)&base), MP_OK);
  off_t size0 = device_file_size();
  /* The map table is empty: its first entry allocates its slots. */
  mp__fault_host_after(0);
  mp_status_t st = mp__device_vm_map(dev, base, 2 * MiB);
  mp__fault_host_after(-1);
  cr_assert_eq(st, MP_ENOMEM, "%s", mp_last_error());
  cr_expect_eq(free_bytes(dev), free0, "nothing charged");
  off_t size1 = device_file_size();
  cr_assert_eq(mp__device_vm_map(dev, base, 2 * MiB), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(device_file_size(), size1,
               "the map reuses the failed one's range (file %lld bytes "
               "before, %lld after the failure, %lld now)",
               (long long)size0, (long long)size1,
               (long long)device_file_size());
  cr_expect_eq(free_bytes(dev), free0 - 2 * MiB);
  cr_expect_eq(mp__device_vm_unmap(dev, base, 2 * MiB), MP_OK);
  cr_expect_eq(mp__device_vm_release(dev, base, 4 * MiB), MP_OK);
  mp_device_close(dev);
}

Test(host_failed_map, an_alloc_whose_tracking_fails_gives_its_range_back) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  size_t free0 = free_bytes(dev);
  off_t size0 = device_file_size();
  /* The allocation table is empty: its first entry allocates its room. */
  void *p = NULL;
  mp__fault_host_after(0);
  mp_status_t st = mp_device_alloc(dev, 2 * MiB, &p);
  mp__fault_host_after(-1);
  cr_assert_eq(st, MP_ENOMEM, "%s", mp_last_error());
  cr_expect_eq(free_bytes(dev), free0, "nothing charged");
  off_t size1 = device_file_size();
  cr_assert_eq(mp_device_alloc(dev, 2 * MiB, &p), MP_OK, "%s", mp_last_error());
  cr_expect_eq(device_file_size(), size1,
               "the allocation reuses the failed one's range (file %lld "
               "bytes before, %lld after the failure, %lld now)",
               (long long)size0, (long long)size1,
               (long long)device_file_size());
  cr_expect_eq(mp_device_free(dev, p), MP_OK);
  mp_device_close(dev);
}
