/* mpbench --out DIR where a result file in DIR is a symbolic link: the
 * results are written through the link into the file it points to (the
 * link stays a link), and a link that points nowhere or to a folder is an
 * error that names the file and changes nothing. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_files.h"
#include "cli_run.h"
#include "mpbench.h"

static char tmpdir[256];
static char out[512], docs[512];

static void make_tmp(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/mpbench-links-XXXXXX");
  cr_assert_not_null(mkdtemp(tmpdir));
  snprintf(out, sizeof out, "%s/out", tmpdir);
  snprintf(docs, sizeof docs, "%s/docs", tmpdir);
  cr_assert_eq(mkdir(out, 0777), 0);
  cr_assert_eq(mkdir(docs, 0777), 0);
}

static void drop_tmp(void) {
  rm_tree(tmpdir);
}

/* out/name made a link to target (as given: relative or absolute). */
static void link_out(const char *name, const char *target) {
  char p[700];
  snprintf(p, sizeof p, "%s/%s", out, name);
  cr_assert_eq(symlink(target, p), 0, "symlink %s", p);
}

/* out/name is still a link, to target. */
static void expect_link(const char *name, const char *target) {
  char p[700], to[700];
  snprintf(p, sizeof p, "%s/%s", out, name);
  struct stat sb;
  cr_assert_eq(lstat(p, &sb), 0, "%s is gone", p);
  cr_expect(S_ISLNK(sb.st_mode), "%s was replaced by a file", p);
  ssize_t n = readlink(p, to, sizeof to - 1);
  cr_assert_geq(n, 0);
  to[n] = '\0';
  cr_expect_str_eq(to, target);
}

/* No temporary or staged file is left in dir. */
static void expect_no_leftovers(const char *dir) {
  DIR *d = opendir(dir);
  cr_assert_not_null(d);
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    cr_expect(strstr(e->d_name, "mpbench") == NULL, "%s/%s left behind", dir,
              e->d_name);
  closedir(d);
}

static int run_small(bool plots) {
  const char *args[] = {"run",
                        "--out",
                        out,
                        "--workload",
                        "random:n=200",
                        "--allocator",
                        "pool",
                        "--device",
                        "host",
                        "--no-capacity",
                        "--quiet",
                        plots ? NULL : "--no-plots",
                        NULL};
  return mpb_test_run(args, NULL);
}

Test(cli_out_links, results_are_written_through_links_into_their_targets,
     .init = make_tmp, .fini = drop_tmp) {
  char md[600], json[600];
  snprintf(md, sizeof md, "%s/results.md", docs);
  snprintf(json, sizeof json, "%s/results.json", docs);
  put_text(md, "old table\n");
  put_text(json, "{}\n");
  cr_assert_eq(chmod(md, 0640), 0);
  link_out("results.md", "../docs/results.md"); /* relative */
  link_out("results.json", json);               /* absolute */

  cr_assert_eq(run_small(false), 0, "%s", mp_last_error());
  expect_link("results.md", "../docs/results.md");
  expect_link("results.json", json);
  const char *text = slurp(md);
  cr_expect(strstr(text, "old table") == NULL, "results.md's target kept");
  cr_expect(strstr(text, "| pool") != NULL, "%s", text);
  cr_expect(strstr(slurp(json), "\"allocator\": \"pool\"") != NULL);
  struct stat sb;
  cr_assert_eq(stat(md, &sb), 0);
  cr_expect_eq(sb.st_mode & 0777, 0640, "the target's mode changed: %o",
               (unsigned)(sb.st_mode & 0777));
  /* The files without links are written as before. */
  char csv[600];
  snprintf(csv, sizeof csv, "%s/results.csv", out);
  cr_expect(lstat(csv, &sb) == 0 && S_ISREG(sb.st_mode));
  expect_no_leftovers(out);
  expect_no_leftovers(docs);
}

Test(cli_out_links, a_plot_is_written_through_its_link, .init = make_tmp,
     .fini = drop_tmp) {
  if (system("gnuplot -e 'set terminal png' >/dev/null 2>&1") != 0)
    cr_skip_test("gnuplot with a png terminal is not installed");
  char png[600];
  snprintf(png, sizeof png, "%s/ratios.png", docs);
  put_text(png, "not a png\n");
  link_out("ratios.png", png);
  cr_assert_eq(run_small(true), 0, "%s", mp_last_error());
  expect_link("ratios.png", png);
  cr_expect(memcmp(slurp(png), "\x89PNG", 4) == 0, "the target was not drawn");
  expect_no_leftovers(docs);
}

/* Checked before the run (exit 2, as any bad --out): the message names the
 * file, the link and the other files are as they were. */
static void expect_refused(const char *name, const char *why) {
  char json[600];
  snprintf(json, sizeof json, "%s/results.json", out);
  put_text(json, "old json\n");
  cr_expect_eq(run_small(false), 2);
  const char *err = mp_last_error();
  cr_expect(strstr(err, name) != NULL, "%s", err);
  cr_expect(strstr(err, why) != NULL, "%s", err);
  cr_expect_str_eq(slurp(json), "old json\n");
  char p[600];
  snprintf(p, sizeof p, "%s/results.md", out);
  cr_expect_eq(access(p, F_OK), -1, "results.md was written");
  expect_no_leftovers(out);
}

Test(cli_out_links, a_link_to_nothing_is_refused_and_nothing_changes,
     .init = make_tmp, .fini = drop_tmp) {
  link_out("results.csv", "../docs/missing.csv");
  expect_refused("results.csv", "does not exist");
  expect_link("results.csv", "../docs/missing.csv");
  char p[600];
  snprintf(p, sizeof p, "%s/missing.csv", docs);
  cr_expect_eq(access(p, F_OK), -1, "the link's target was created");
}

Test(cli_out_links, a_link_to_a_folder_is_refused_and_nothing_changes,
     .init = make_tmp, .fini = drop_tmp) {
  link_out("report.html", docs);
  expect_refused("report.html", "folder");
  expect_link("report.html", docs);
  expect_no_leftovers(docs);
}

/* A plot's name is known only once the plots are drawn: a bad link there is
 * found at the end, still before anything is moved into place, so every
 * other file (and every other link's target) is as it was. */
Test(cli_out_links, a_bad_link_found_at_the_end_changes_nothing,
     .init = make_tmp, .fini = drop_tmp) {
  if (system("gnuplot -e 'set terminal png' >/dev/null 2>&1") != 0)
    cr_skip_test("gnuplot with a png terminal is not installed");
  char md[600], json[600];
  snprintf(md, sizeof md, "%s/results.md", docs);
  snprintf(json, sizeof json, "%s/results.json", out);
  put_text(md, "old table\n");
  put_text(json, "old json\n");
  link_out("results.md", md);
  link_out("ratios.png", "nowhere.png");
  cr_expect_eq(run_small(true), 1);
  const char *err = mp_last_error();
  cr_expect(strstr(err, "ratios.png") != NULL, "%s", err);
  cr_expect(strstr(err, "does not exist") != NULL, "%s", err);
  cr_expect_str_eq(slurp(md), "old table\n");
  cr_expect_str_eq(slurp(json), "old json\n");
  expect_link("results.md", md);
  expect_link("ratios.png", "nowhere.png");
  char p[600];
  snprintf(p, sizeof p, "%s/results.csv", out);
  cr_expect_eq(access(p, F_OK), -1, "results.csv was written");
  expect_no_leftovers(out);
  expect_no_leftovers(docs);
}
