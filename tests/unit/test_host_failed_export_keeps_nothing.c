/* test_host_failed_export_keeps_nothing.c - an ipc_export the host device
 * refuses (here: no descriptor left for the export, RLIMIT_NOFILE) leaves
 * the allocation as it was: not marked exported, so that its free gives
 * its pages back (src/device/host.c, host_ipc_export: marked only once the
 * export is made). Before, the allocation was marked exported before the
 * export could fail, and its free kept its pages (an exported range is
 * never punched out of the device file) until the device closed. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "device/backend.h"

#include "../support/device_helpers.h"

/* The blocks of the device's file (the only host device open here). */
static long long device_file_blocks(void) {
  DIR *d = opendir("/proc/self/fd");
  cr_assert_not_null(d);
  long long blocks = -1;
  for (struct dirent *de; (de = readdir(d)) != NULL;) {
    char path[300], link[256];
    snprintf(path, sizeof path, "/proc/self/fd/%s", de->d_name);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n <= 0)
      continue;
    link[n] = '\0';
    struct stat sb;
    if (strstr(link, "/memfd:mempool-host-device") == link &&
        stat(path, &sb) == 0)
      blocks = (long long)sb.st_blocks;
  }
  closedir(d);
  cr_assert_geq(blocks, 0, "no device file found");
  return blocks;
}

Test(host_failed_export_keeps_nothing, a_refused_export_frees_its_pages) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  size_t bytes = 1 << 20;
  void *p = NULL;
  cr_assert_eq(mp_device_alloc(dev, bytes, &p), MP_OK);
  memset(p, 0x5a, bytes);
  cr_assert_gt(device_file_blocks(), 0);
  /* No descriptor left: the export's open of the device file fails. */
  struct rlimit was;
  cr_assert_eq(getrlimit(RLIMIT_NOFILE, &was), 0);
  int lowest = dup(0);
  cr_assert_geq(lowest, 0);
  close(lowest);
  struct rlimit low = {.rlim_cur = (rlim_t)lowest, .rlim_max = was.rlim_max};
  cr_assert_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
  mp_ipc_handle_t h;
  memset(&h, 0, sizeof h);
  mp_status_t st = mp__device_ipc_export(dev, p, bytes, false, &h);
  cr_assert_eq(setrlimit(RLIMIT_NOFILE, &was), 0);
  cr_expect_eq(st, MP_EIO, "%s", mp_status_name(st));
  cr_expect(strstr(mp_last_error(), "ipc_export") != NULL, "%s",
            mp_last_error());
  cr_assert_eq(mp_device_free(dev, p), MP_OK, "%s", mp_last_error());
  cr_expect_eq(device_file_blocks(), 0,
               "the refused export's allocation kept its pages after its "
               "free");
  mp_device_close(dev);
}
