/* mp_pool_snapshot writes what it checked: a FIFO at the path (written in
 * place) swapped for a symbolic link to a regular file between the check
 * and the open (as another process could) is refused, and the file the
 * link names is left untouched. The check was an lstat of the path and the
 * write an fopen of it, which followed the new link: the file it named was
 * truncated and overwritten with the snapshot. */
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

static char dir[] = "/tmp/mp_snap_swap_XXXXXX";
static char out_path[PATH_MAX], victim[PATH_MAX];
static int swap; /* the next stat of out_path swaps it for a link after */

static void swap_now(void) {
  swap = 0;
  unlink(out_path);
  if (symlink(victim, out_path) != 0)
    abort();
}

/* The library's lstat and fstatat (this executable's definitions come
 * first): the C library's answer on out_path, then the swap. */
int lstat(const char *restrict path, struct stat *restrict sb) {
  int (*next)(const char *restrict, struct stat *restrict) =
      (int (*)(const char *restrict, struct stat *restrict))dlsym(RTLD_NEXT,
                                                                  "lstat");
  int r = next(path, sb);
  if (swap && strcmp(path, out_path) == 0)
    swap_now();
  return r;
}

int fstatat(int fd, const char *restrict path, struct stat *restrict sb,
            int flags) {
  int (*next)(int, const char *restrict, struct stat *restrict, int) =
      (int (*)(int, const char *restrict, struct stat *restrict, int))dlsym(
          RTLD_NEXT, "fstatat");
  int r = next(fd, path, sb, flags);
  if (swap && strcmp(path, "out.pickle") == 0)
    swap_now();
  return r;
}

static size_t files_in_dir(void) {
  size_t n = 0;
  char cmd[PATH_MAX + 32];
  snprintf(cmd, sizeof cmd, "ls -A '%s' | wc -l", dir);
  FILE *p = popen(cmd, "r");
  if (p != NULL) {
    if (fscanf(p, "%zu", &n) != 1)
      n = 0;
    pclose(p);
  }
  return n;
}

Test(pool_snapshot_swap_race, a_fifo_swapped_for_a_link_is_not_written_through,
     .timeout = 30) {
  cr_assert_not_null(mkdtemp(dir));
  snprintf(out_path, sizeof out_path, "%s/out.pickle", dir);
  snprintf(victim, sizeof victim, "%s/victim", dir);
  FILE *f = fopen(victim, "wb");
  cr_assert_not_null(f);
  fputs("precious", f);
  fclose(f);
  cr_assert_eq(mkfifo(out_path, 0600), 0);
  mp_device_t *dev;
  mp_pool_t *pool;
  cr_assert_eq(mp_device_open("host:capacity=64M", &dev), MP_OK);
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_assert_eq(mp_pool_create(dev, &cfg, &pool), MP_OK, "%s", mp_last_error());

  swap = 1;
  mp_status_t st = mp_pool_snapshot(pool, out_path);

  cr_expect_eq(swap, 0, "the path was never checked");
  char got[16] = {0};
  f = fopen(victim, "rb");
  cr_assert_not_null(f);
  size_t n = fread(got, 1, sizeof got - 1, f);
  fclose(f);
  cr_expect(n == 8 && strcmp(got, "precious") == 0,
            "the file the swapped-in link names was written (%zu bytes)", n);
  cr_expect_eq(st, MP_EIO, "the swap was not refused");
  cr_expect(strstr(mp_last_error(), "out.pickle") != NULL,
            "the error does not name the path: %s", mp_last_error());
  struct stat sb;
  cr_expect(lstat(out_path, &sb) == 0 && S_ISLNK(sb.st_mode),
            "the link was replaced");
  cr_expect_eq(files_in_dir(), 2, "a temporary was left");
  mp_pool_destroy(pool);
  mp_device_close(dev);
  unlink(out_path);
  unlink(victim);
  rmdir(dir);
}
