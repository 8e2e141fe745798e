/* cli_files.h - files for mpbench's command tests: a scratch folder
 * removed whole, and a result file read back. Include after Criterion. */
#ifndef MPBENCH_TEST_CLI_FILES_H
#define MPBENCH_TEST_CLI_FILES_H

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Removes dir and what it holds; a link is removed, never followed (a test
 * may link a result file to a folder outside). */
static inline void rm_tree(const char *dir) {
  DIR *d = opendir(dir);
  if (d == NULL)
    return;
  struct dirent *e;
  char p[1024];
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    int n = snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    if (n < 0 || (size_t)n >= sizeof p)
      continue; /* too long to name: left, and the rmdir below fails */
    struct stat sb;
    if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
      rm_tree(p);
    else
      unlink(p);
  }
  closedir(d);
  rmdir(dir);
}

/* A scratch folder under /tmp for one test: scratch_make as its .init,
 * scratch_drop as its .fini, scratch_dir() its path. */
static inline char *scratch_dir(void) {
  static char dir[64];
  return dir;
}

static inline void scratch_make(void) {
  snprintf(scratch_dir(), 64, "/tmp/mpbench-test-XXXXXX");
  cr_assert_not_null(mkdtemp(scratch_dir()));
}

static inline void scratch_drop(void) {
  rm_tree(scratch_dir());
}

/* The first MiB of path, NUL-terminated, in a buffer the next call
 * reuses. */
static inline char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "cannot open %s", path);
  static char buf[1 << 20];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  return buf;
}

/* path made (or emptied) to hold text. */
static inline void put_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f, "cannot write %s", path);
  fputs(text, f);
  fclose(f);
}

#endif /* MPBENCH_TEST_CLI_FILES_H */
