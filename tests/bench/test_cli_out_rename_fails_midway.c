/* mpbench --out DIR where moving one result file into place fails after
 * others were moved: the files moved before it are put back (the run
 * before's contents, or no file where there was none), so DIR holds the
 * last run's files or this one's, never a mix, and the error names the
 * file. The failure is made by wrapping rename (linked with
 * -Wl,--wrap=rename, tests/bench/CMakeLists.txt): the rename onto a
 * destination whose name ends with fail_name fails with EIO. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_files.h"
#include "cli_run.h"
#include "mpbench.h"

int __real_rename(const char *from, const char *to);

static const char *fail_name; /* NULL: every rename goes through */
static bool fail_back;        /* the renames that put a kept file back fail */

int __wrap_rename(const char *from, const char *to) {
  size_t n = fail_name != NULL ? strlen(fail_name) : 0, m = strlen(to);
  if ((fail_name != NULL && m >= n && strcmp(to + m - n, fail_name) == 0) ||
      (fail_back && strstr(from, ".mpbench-old-") != NULL)) {
    errno = EIO;
    return -1;
  }
  return __real_rename(from, to);
}

static char out[512], docs[512];

static void make_tmp(void) {
  scratch_make();
  snprintf(out, sizeof out, "%s/out", scratch_dir());
  snprintf(docs, sizeof docs, "%s/docs", scratch_dir());
  cr_assert_eq(mkdir(docs, 0777), 0);
  fail_name = NULL;
  fail_back = false;
}

static int run(const char *workload) {
  const char *args[] = {"run",           "--out",      out,           "--quiet",
                        "--no-capacity", "--no-plots", "--allocator", "pool",
                        "--workload",    workload,     NULL};
  return mpb_test_run(args, "/dev/null");
}

static char *file_of(const char *dir, const char *name) {
  char p[700];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return strdup(slurp(p));
}

static bool in(const char *dir, const char *name) {
  char p[700];
  struct stat sb;
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return lstat(p, &sb) == 0;
}

/* Nothing of mpbench's own making (a temporary folder, a staged or kept
 * file: names starting with '.', but .run-files) is left in dir. */
static void expect_no_leftovers(const char *dir) {
  DIR *d = opendir(dir);
  cr_assert_not_null(d);
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    cr_expect(e->d_name[0] != '.' || strcmp(e->d_name, ".") == 0 ||
                  strcmp(e->d_name, "..") == 0 ||
                  strcmp(e->d_name, ".run-files") == 0,
              "%s/%s was left behind", dir, e->d_name);
  closedir(d);
}

static const char *const names[] = {"results.json", "results.csv", "results.md",
                                    ".run-files"};

/* A run that goes through; what it wrote of names[] in before. */
static void first_run(char *before[4]) {
  cr_assert_eq(run("random:n=50"), 0, "%s", mp_last_error());
  for (int i = 0; i < 4; i++)
    before[i] = file_of(out, names[i]);
}

Test(cli_out_rename_fails_midway, the_files_moved_before_are_put_back,
     .init = make_tmp, .fini = scratch_drop) {
  char *before[4];
  first_run(before);
  char *html = file_of(out, "report.html");
  /* results.json, .csv and .md are moved before report.html. */
  fail_name = "/report.html";
  cr_assert_neq(run("cnn:batches=2"), 0, "the run said it wrote its files");
  cr_expect(strstr(mp_last_error(), "report.html") != NULL &&
                strstr(mp_last_error(), "results not written") != NULL,
            "%s", mp_last_error());
  for (int i = 0; i < 4; i++) {
    char *now = file_of(out, names[i]);
    cr_expect_str_eq(now, before[i], "%s is not the run before's", names[i]);
    free(now);
    free(before[i]);
  }
  char *now = file_of(out, "report.html");
  cr_expect_str_eq(now, html);
  free(now);
  free(html);
  expect_no_leftovers(out);
  /* Moved again, the run writes its own. */
  fail_name = NULL;
  cr_assert_eq(run("cnn:batches=2"), 0, "%s", mp_last_error());
  char *md = file_of(out, "results.md");
  cr_expect(strstr(md, "cnn") != NULL, "results.md is not this run's");
  free(md);
  expect_no_leftovers(out);
}

Test(cli_out_rename_fails_midway, a_first_run_leaves_no_file, .init = make_tmp,
     .fini = scratch_drop) {
  fail_name = "/results.md";
  cr_assert_neq(run("random:n=50"), 0);
  cr_expect(strstr(mp_last_error(), "results.md") != NULL, "%s",
            mp_last_error());
  for (int i = 0; i < 4; i++)
    cr_expect(!in(out, names[i]), "%s was left from a run that failed",
              names[i]);
  cr_expect(!in(out, "report.html"));
  expect_no_leftovers(out);
}

/* A result file that is a link is written through to its target: put back
 * there too, the link still a link. */
Test(cli_out_rename_fails_midway, a_links_target_is_put_back, .init = make_tmp,
     .fini = scratch_drop) {
  cr_assert_eq(run("random:n=50"), 0, "%s", mp_last_error());
  char p[700], t[700];
  snprintf(p, sizeof p, "%s/results.json", out);
  snprintf(t, sizeof t, "%s/results.json", docs);
  cr_assert_eq(rename(p, t), 0);
  cr_assert_eq(symlink(t, p), 0);
  char *before = file_of(docs, "results.json");
  fail_name = "/results.md"; /* after results.json and .csv */
  cr_assert_neq(run("cnn:batches=2"), 0);
  char *now = file_of(docs, "results.json");
  cr_expect_str_eq(now, before, "the link's target is not the run before's");
  free(now);
  free(before);
  struct stat sb;
  cr_expect(lstat(p, &sb) == 0 && S_ISLNK(sb.st_mode),
            "results.json is no longer a link");
  expect_no_leftovers(out);
  expect_no_leftovers(docs);
}

/* results.json and results.csv linked to one file: each rename kept a link
 * of it, and the second put back (a rename onto the file it already is,
 * which does nothing) left its link behind. */
Test(cli_out_rename_fails_midway, two_names_linked_to_one_file_leave_nothing,
     .init = make_tmp, .fini = scratch_drop) {
  char shared[700], p[700];
  snprintf(shared, sizeof shared, "%s/shared", docs);
  put_text(shared, "the user's file\n");
  cr_assert_eq(mkdir(out, 0777), 0);
  snprintf(p, sizeof p, "%s/results.json", out);
  cr_assert_eq(symlink(shared, p), 0);
  snprintf(p, sizeof p, "%s/results.csv", out);
  cr_assert_eq(symlink(shared, p), 0);
  fail_name = "/results.md";
  cr_assert_neq(run("random:n=50"), 0);
  cr_expect(strstr(mp_last_error(), "results not written") != NULL, "%s",
            mp_last_error());
  char *now = file_of(docs, "shared");
  cr_expect_str_eq(now, "the user's file\n");
  free(now);
  expect_no_leftovers(docs);
  expect_no_leftovers(out);
}

/* A kept file that cannot be renamed back stays, and the message names it:
 * the cleanup removed it, and with it the only copy of the run before's
 * file. */
Test(cli_out_rename_fails_midway, a_failed_put_back_keeps_the_run_befores_file,
     .init = make_tmp, .fini = scratch_drop) {
  char *before[4];
  first_run(before);
  fail_name = "/report.html"; /* after results.json, .csv and .md */
  fail_back = true;
  cr_assert_neq(run("cnn:batches=2"), 0);
  char msg[2048];
  snprintf(msg, sizeof msg, "%s", mp_last_error());
  const char *named = strstr(msg, "failed: the run before's ");
  const char *kept = strstr(msg, " is kept as ");
  cr_assert(named != NULL && kept != NULL && named < kept, "%s", msg);
  cr_expect(strstr(msg, "and 2 more not put back") != NULL, "%s", msg);
  named += strlen("failed: the run before's ");
  char file[700], copy[700];
  snprintf(file, sizeof file, "%.*s", (int)(kept - named), named);
  snprintf(copy, sizeof copy, "%s", kept + strlen(" is kept as "));
  *strchrnul(copy, ' ') = '\0';
  int which = -1;
  for (int i = 0; i < 4; i++) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", out, names[i]);
    if (strcmp(p, file) == 0)
      which = i;
  }
  cr_assert_geq(which, 0, "%s names no result file", msg);
  char *now = strdup(slurp(copy));
  cr_expect_str_eq(now, before[which], "%s is not the run before's %s", copy,
                   names[which]);
  free(now);
  for (int i = 0; i < 4; i++)
    free(before[i]);
}
