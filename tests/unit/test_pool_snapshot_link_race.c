/* mp_pool_snapshot through a symbolic link decides from the file it will
 * replace: a link retargeted between the check of what it names and its
 * resolution (here to a FIFO, as another process could) is written through
 * in place, the FIFO kept. The check was a stat of the link, the path
 * replaced realpath's later answer, so the FIFO was renamed over, replaced
 * by a regular file (with root's rights, a device node the same way). */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mempool/device.h"
#include "mempool/pool.h"

static char dir[] = "/tmp/mp_snap_race_XXXXXX";
static char link_path[PATH_MAX], fifo_path[PATH_MAX];
static int retarget; /* the next realpath of link_path retargets it first */

/* The library's realpath (this executable's definition comes first): on
 * link_path while retarget is set, the link is pointed at the FIFO, then
 * the C library resolves it. */
char *realpath(const char *restrict path, char *restrict resolved) {
  char *(*next)(const char *restrict, char *restrict) =
      (char *(*)(const char *restrict, char *restrict))dlsym(RTLD_NEXT,
                                                             "realpath");
  if (retarget && strcmp(path, link_path) == 0) {
    retarget = 0;
    unlink(link_path);
    if (symlink(fifo_path, link_path) != 0)
      return NULL;
  }
  return next(path, resolved);
}

Test(pool_snapshot_link_race, a_link_retargeted_to_a_fifo_keeps_the_fifo,
     .timeout = 30) {
  cr_assert_not_null(mkdtemp(dir));
  char real[PATH_MAX];
  snprintf(real, sizeof real, "%s/real.pickle", dir);
  snprintf(fifo_path, sizeof fifo_path, "%s/fifo", dir);
  snprintf(link_path, sizeof link_path, "%s/link.pickle", dir);
  FILE *f = fopen(real, "wb");
  cr_assert_not_null(f);
  fclose(f);
  cr_assert_eq(mkfifo(fifo_path, 0600), 0);
  cr_assert_eq(symlink(real, link_path), 0);
  mp_device_t *dev;
  mp_pool_t *pool;
  cr_assert_eq(mp_device_open("host:capacity=64M", &dev), MP_OK);
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_assert_eq(mp_pool_config_parse(&cfg, "history=8"), MP_OK);
  cr_assert_eq(mp_pool_create(dev, &cfg, &pool), MP_OK, "%s", mp_last_error());
  /* A reader already there: the write into the FIFO does not wait, and
   * what it wrote (a pool's snapshot fits the pipe) is read after. */
  int rd = open(fifo_path, O_RDONLY | O_NONBLOCK);
  cr_assert_geq(rd, 0);

  retarget = 1;
  mp_status_t st = mp_pool_snapshot(pool, link_path);

  struct stat sb;
  bool fifo_kept = lstat(fifo_path, &sb) == 0 && S_ISFIFO(sb.st_mode);
  unsigned char head[2] = {0};
  ssize_t got = read(rd, head, sizeof head);
  close(rd);
  cr_expect_eq(retarget, 0, "the link was never resolved");
  cr_expect(fifo_kept, "the FIFO was replaced by a regular file");
  cr_expect_eq(st, MP_OK, "%s", mp_last_error());
  if (fifo_kept && st == MP_OK)
    cr_expect(got == 2 && head[0] == 0x80, "no snapshot came through the FIFO");
  cr_expect(lstat(link_path, &sb) == 0 && S_ISLNK(sb.st_mode),
            "the link was replaced");
  mp_pool_destroy(pool);
  mp_device_close(dev);
  unlink(link_path);
  unlink(fifo_path);
  unlink(real);
  rmdir(dir);
}
