/* A result file of --out that the run could not write is refused before
 * the run (exit 2, "mpbench: --out ...", nothing written), as an --out
 * where no folder can be made is: a symbolic link into a folder nothing
 * can be made in (its new contents are made beside its target), and a
 * plot's name (ratios.png, bytes_NAME.png) that is a folder or a link to
 * nothing, where plots are wanted. Before, each was found only once the
 * whole run was done, and its results lost (exit 1, "writing results").
 * With --no-plots a folder of a plot's name is no matter. The plots are
 * drawn by a stand-in gnuplot (fake_gnuplot.h). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_files.h"
#include "cli_run.h"
#include "fake_gnuplot.h"
#include "mpbench.h"

static char trace[128], out[128];

static void setup(void) {
  fake_gnuplot_scratch("t.csv", trace, sizeof trace, out, sizeof out);
  cr_assert_eq(mkdir(out, 0777), 0);
}

static const char *in_out(const char *name) {
  static char p[2][256];
  static int k;
  k = (k + 1) % 2;
  snprintf(p[k], sizeof p[k], "%s/%s", out, name);
  return p[k];
}

/* mpbench replay into out (plots or not): its exit status, stderr into
 * err. */
static int replay(bool plots, char *err, size_t n) {
  const char *args[] = {"replay",
                        "--out",
                        out,
                        "--device",
                        "host",
                        "--allocator",
                        "pool",
                        "--quiet",
                        "--no-capacity",
                        trace,
                        plots ? NULL : "--no-plots",
                        NULL};
  return mpb_test_run_err(args, "/dev/null", err, n);
}

/* Refused by the checks before the run, naming bad, with nothing
 * written. */
static void expect_refused(const char *bad) {
  char err[4096];
  cr_expect_eq(replay(true, err, sizeof err), 2, "%s", err);
  cr_expect(strstr(err, "mpbench: --out ") == err && strstr(err, bad) != NULL &&
                strstr(err, "writing results") == NULL,
            "not refused before the run, naming %s: %s", bad, err);
  cr_expect_eq(access(in_out("results.json"), F_OK), -1);
  cr_expect_eq(access(in_out("report.html"), F_OK), -1);
}

Test(cli_out_files_refused_before_the_run, a_link_into_a_folder_that_takes_none,
     .init = setup, .fini = scratch_drop) {
  /* /proc takes no new file, root's either; /proc/version is a regular
   * file to stat. */
  struct stat sb;
  cr_assert(stat("/proc/version", &sb) == 0 && S_ISREG(sb.st_mode));
  cr_assert_eq(symlink("/proc/version", in_out("results.md")), 0);
  expect_refused("results.md");
  cr_expect(strstr(mp_last_error(), "/proc/version") != NULL, "%s",
            mp_last_error());
  cr_expect(lstat(in_out("results.md"), &sb) == 0 && S_ISLNK(sb.st_mode));
  /* A plot's name too (where plots are wanted). */
  cr_assert_eq(unlink(in_out("results.md")), 0);
  cr_assert_eq(symlink("/proc/version", in_out("bytes_t.png")), 0);
  expect_refused("bytes_t.png");
}

Test(cli_out_files_refused_before_the_run, a_plot_name_that_is_a_folder,
     .init = setup, .fini = scratch_drop) {
  cr_assert_eq(mkdir(in_out("ratios.png"), 0777), 0);
  expect_refused("ratios.png");
  cr_assert_eq(rmdir(in_out("ratios.png")), 0);
  cr_assert_eq(mkdir(in_out("bytes_t.png"), 0777), 0);
  expect_refused("bytes_t.png");
  cr_assert_eq(symlink("nowhere", in_out("ratios.png")), 0);
  expect_refused("ratios.png");
}

Test(cli_out_files_refused_before_the_run, no_plots_no_matter, .init = setup,
     .fini = scratch_drop) {
  cr_assert_eq(mkdir(in_out("ratios.png"), 0777), 0);
  cr_assert_eq(mkdir(in_out("bytes_t.png"), 0777), 0);
  char err[4096];
  cr_expect_eq(replay(false, err, sizeof err), 0, "%s", err);
  cr_expect_eq(access(in_out("results.json"), F_OK), 0);
  struct stat sb;
  cr_expect(stat(in_out("ratios.png"), &sb) == 0 && S_ISDIR(sb.st_mode));
}

Test(cli_out_files_refused_before_the_run, plots_drawn_where_all_is_well,
     .init = setup, .fini = scratch_drop) {
  char err[4096];
  cr_expect_eq(replay(true, err, sizeof err), 0, "%s", err);
  cr_expect_eq(access(in_out("ratios.png"), F_OK), 0, "%s", err);
  cr_expect_eq(access(in_out("bytes_t.png"), F_OK), 0, "%s", err);
}
