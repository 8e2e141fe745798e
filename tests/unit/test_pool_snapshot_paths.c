/* mp_pool_snapshot to paths at the edges: a file name near NAME_MAX, which
 * fopen writes, is written too (the temporary beside it, named with a
 * suffix, passed NAME_MAX and the open's ENAMETOOLONG was "cannot write"),
 * and a path that cannot be written is refused with the reason, leaving
 * nothing behind. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "mempool/device.h"
#include "mempool/pool.h"

static mp_device_t *dev;
static mp_pool_t *pool;
static char dir[] = "/tmp/mp_snap_paths_XXXXXX";

static void setup(void) {
  cr_assert_not_null(mkdtemp(dir));
  cr_assert_eq(mp_device_open("host:capacity=256M", &dev), MP_OK);
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_assert_eq(mp_pool_config_parse(&cfg, "history=64"), MP_OK);
  cr_assert_eq(mp_pool_create(dev, &cfg, &pool), MP_OK, "%s", mp_last_error());
}

/* The files in folder d (not . or ..); with unlink_them, removed as they
 * are counted. */
static size_t files_in(const char *d_path, bool unlink_them) {
  size_t n = 0;
  DIR *d = opendir(d_path);
  for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;) {
    char p[PATH_MAX];
    if (e->d_name[0] == '.')
      continue;
    n++;
    if (unlink_them &&
        snprintf(p, sizeof p, "%s/%s", d_path, e->d_name) < (int)sizeof p)
      unlink(p);
  }
  if (d != NULL)
    closedir(d);
  return n;
}

static size_t files_in_dir(bool unlink_them) {
  return files_in(dir, unlink_them);
}

static void teardown(void) {
  mp_pool_destroy(pool);
  mp_device_close(dev);
  (void)files_in_dir(true);
  rmdir(dir);
}

TestSuite(pool_snapshot_paths, .init = setup, .fini = teardown);

Test(pool_snapshot_paths, a_name_near_name_max_is_written) {
  void *p;
  cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, &p), MP_OK);
  char path[PATH_MAX];
  size_t n = (size_t)snprintf(path, sizeof path, "%s/", dir);
  memset(path + n, 's', NAME_MAX - 4);
  memcpy(path + n + NAME_MAX - 4, ".pkl", 5);
  cr_assert_eq(mp_pool_snapshot(pool, path), MP_OK, "%s", mp_last_error());
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f);
  unsigned char head[2] = {0};
  cr_expect_eq(fread(head, 1, 2, f), 2);
  fclose(f);
  cr_expect_eq(head[0], 0x80, "not a pickle");
  cr_expect_eq(files_in_dir(false), 1,
               "a temporary was left beside the snapshot");
  cr_assert_eq(mp_pool_free(pool, p), MP_OK);
}

/* A snapshot to path is refused (MP_EIO) and the message gives why. */
static void refused_with(const char *path, const char *why) {
  cr_assert_eq(mp_pool_snapshot(pool, path), MP_EIO);
  cr_expect(strstr(mp_last_error(), why) != NULL, "%s", mp_last_error());
}

Test(pool_snapshot_paths, an_unwritable_path_is_refused_with_the_reason) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/no/such/folder/x.pkl", dir);
  refused_with(path, "No such file or directory");
  refused_with(dir, "Is a directory");
  /* A long path is quoted shortened: the reason still fits. */
  size_t n = (size_t)snprintf(path, sizeof path, "%s/", dir);
  for (size_t i = 0; i < 12; i++, n += NAME_MAX / 2 + 1)
    snprintf(path + n, sizeof path - n, "%0*d/", NAME_MAX / 2, 0);
  snprintf(path + n, sizeof path - n, "x.pkl");
  cr_assert_eq(mp_pool_snapshot(pool, path), MP_EIO);
  cr_expect(strstr(mp_last_error(), "No such file or directory") != NULL, "%s",
            mp_last_error());
  cr_expect_eq(files_in_dir(false), 0, "a refused snapshot left a file");
}

/* A symbolic link to a regular file: the file it names is replaced whole,
 * as a regular path is (a temporary beside it, renamed over it, its mode
 * kept), and the link stays a link. Written in place through the link, a
 * snapshot that failed part-way left that file truncated, and a reader
 * that held it open saw it change under it. */
Test(pool_snapshot_paths, a_link_to_a_file_replaces_the_file_whole) {
  char sub[PATH_MAX / 2], real[PATH_MAX], link[PATH_MAX];
  snprintf(sub, sizeof sub, "%s/t", dir);
  snprintf(real, sizeof real, "%s/real.pickle", sub);
  snprintf(link, sizeof link, "%s/link.pickle", dir);
  cr_assert_eq(mkdir(sub, 0700), 0);
  FILE *f = fopen(real, "wb");
  cr_assert_not_null(f);
  fputs("old", f);
  fclose(f);
  cr_assert_eq(chmod(real, 0640), 0);
  cr_assert_eq(symlink("t/real.pickle", link), 0);
  FILE *held = fopen(real, "rb"); /* a reader of the old snapshot */
  cr_assert_not_null(held);

  cr_assert_eq(mp_pool_snapshot(pool, link), MP_OK, "%s", mp_last_error());

  char old[4] = {0};
  cr_expect_eq(fread(old, 1, 3, held), 3);
  fclose(held);
  cr_expect_str_eq(old, "old", "the file was written in place");
  struct stat sb;
  cr_assert(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode),
            "the link was replaced");
  cr_assert_eq(stat(real, &sb), 0);
  cr_expect_eq(sb.st_mode & 0777, 0640, "the file's mode changed");
  f = fopen(link, "rb");
  cr_assert_not_null(f);
  unsigned char head[2] = {0};
  cr_expect_eq(fread(head, 1, 2, f), 2);
  fclose(f);
  cr_expect_eq(head[0], 0x80, "the file the link names is no snapshot");
  cr_expect_eq(files_in(sub, false), 1, "a temporary was left beside the file");
  cr_expect_eq(files_in_dir(false), 2, "a temporary was left beside the link");
  unlink(real);
  rmdir(sub);
}

/* A symbolic link that names nothing yet is written through, as documented:
 * the file it names is made, and the link stays a link. */
Test(pool_snapshot_paths, a_link_to_nothing_gets_its_file_made) {
  char real[PATH_MAX], link[PATH_MAX];
  snprintf(real, sizeof real, "%s/made.pickle", dir);
  snprintf(link, sizeof link, "%s/link.pickle", dir);
  cr_assert_eq(symlink("made.pickle", link), 0);

  cr_assert_eq(mp_pool_snapshot(pool, link), MP_OK, "%s", mp_last_error());

  struct stat sb;
  cr_expect(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode),
            "the link was replaced");
  FILE *f = fopen(real, "rb");
  cr_assert_not_null(f, "the file the link names was not made");
  unsigned char head[2] = {0};
  cr_expect_eq(fread(head, 1, 2, f), 2);
  fclose(f);
  cr_expect_eq(head[0], 0x80, "the file the link names is no snapshot");
  cr_expect_eq(files_in_dir(false), 2, "a temporary was left");
}

/* A link to nothing whose file cannot be written whole (the file-size
 * limit stops the write) is refused and leaves no file: the file its
 * write made is removed, as a snapshot is written whole or not at all
 * (pool.h). It was left cut short, a pickle that did not load. */
Test(pool_snapshot_paths, a_link_to_nothing_written_in_part_leaves_no_file) {
  char real[PATH_MAX], link[PATH_MAX];
  snprintf(real, sizeof real, "%s/made.pickle", dir);
  snprintf(link, sizeof link, "%s/link.pickle", dir);
  cr_assert_eq(symlink("made.pickle", link), 0);
  void *p[8];
  for (int i = 0; i < 8; i++)
    cr_assert_eq(mp_pool_alloc(pool, 4096, NULL, &p[i]), MP_OK);
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = {64, 64};
  cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
  cr_expect_eq(mp_pool_snapshot(pool, link), MP_EIO);
  /* The reason too, as mp_pool_dump says it (EFBIG: past the limit). */
  cr_expect(strstr(mp_last_error(), "write error") != NULL &&
                strstr(mp_last_error(), strerror(EFBIG)) != NULL,
            "%s", mp_last_error());
  struct stat sb;
  cr_expect(lstat(link, &sb) == 0 && S_ISLNK(sb.st_mode),
            "the link was replaced");
  cr_expect_neq(stat(real, &sb), 0, "a file cut at %lld bytes was left",
                (long long)sb.st_size);
  for (int i = 0; i < 8; i++)
    cr_assert_eq(mp_pool_free(pool, p[i]), MP_OK);
  cr_expect_eq(files_in_dir(false), 1, "more than the link was left");
}

/* A path with a trailing slash names a folder: refused with the reason,
 * nothing written in the folder. */
Test(pool_snapshot_paths, a_path_ending_in_a_slash_is_refused) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/", dir);
  refused_with(path, "Is a directory");
  cr_expect_eq(files_in_dir(false), 0, "a file was left in the folder");
}

/* In a child without root's rights (nobody's, where the test runs as
 * root, who may write any file): mp_pool_snapshot(pool, path); exits 0 on
 * MP_EIO, its message in why (shared with the parent). */
static void snapshot_as_another_user(const char *path, char *why, size_t n) {
  if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0))
    _exit(2);
  mp_status_t st = mp_pool_snapshot(pool, path);
  snprintf(why, n, "%s", mp_last_error());
  _exit(st == MP_EIO ? 0 : 1);
}

/* A file that is there and that the caller may not write (mode 0444) is
 * refused with the reason, as fopen(path, "wb") or PyTorch's
 * _dump_snapshot (Python's open) refuse it, and left as it was: the
 * temporary renamed over it replaced it whenever its folder was
 * writable. */
Test(pool_snapshot_paths, a_file_the_caller_may_not_write_is_left_alone) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/ro.pkl", dir);
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0444);
  cr_assert_geq(fd, 0);
  cr_assert_eq(write(fd, "old", 3), 3);
  close(fd);
  cr_assert_eq(chmod(dir, 0777), 0); /* the other user's folder too */
  char *why = mmap(NULL, 512, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(why, MAP_FAILED);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0)
    snapshot_as_another_user(path, why, 512);
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status));
  cr_expect_eq(WEXITSTATUS(status), 0, "not refused with MP_EIO: '%s'", why);
  cr_expect(strstr(why, "Permission denied") != NULL && strstr(why, "ro.pkl"),
            "%s", why);
  char was[8] = {0};
  fd = open(path, O_RDONLY);
  cr_assert_geq(fd, 0);
  cr_expect_eq(read(fd, was, sizeof was), 3);
  close(fd);
  cr_expect_str_eq(was, "old", "the file the caller may not write changed");
  cr_expect_eq(files_in_dir(false), 1, "a refused snapshot left a file");
  munmap(why, 512);
}

/* A file it replaces keeps its owner and group, as its mode, as a write in
 * place would leave them: root's snapshot over another user's file (the
 * shim's MEMPOOL_SNAPSHOT of a program run as root into a user's folder)
 * gave the file to root, and the user could no longer write it. */
Test(pool_snapshot_paths, a_replaced_file_keeps_its_owner) {
  if (geteuid() != 0)
    cr_skip_test("only root may give a file to another user");
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/theirs.pkl", dir);
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
  cr_assert_geq(fd, 0);
  cr_assert_eq(fchown(fd, 65534, 65534), 0);
  close(fd);
  cr_assert_eq(mp_pool_snapshot(pool, path), MP_OK, "%s", mp_last_error());
  struct stat sb;
  cr_assert_eq(stat(path, &sb), 0);
  cr_expect_eq(sb.st_uid, 65534, "the replaced file's owner became %u",
               (unsigned)sb.st_uid);
  cr_expect_eq(sb.st_gid, 65534, "the replaced file's group became %u",
               (unsigned)sb.st_gid);
  cr_expect_gt(sb.st_size, 0, "not the snapshot");
}
