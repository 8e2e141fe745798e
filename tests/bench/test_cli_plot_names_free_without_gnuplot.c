/* Without a gnuplot mpbench writes no plot, so a folder of a plot's name
 * in --out (ratios.png, bytes_NAME.png) is in nobody's way: the run goes
 * on, writes its results and says why there are no plots. Before, the
 * checks before the run refused it (exit 2, "ratios.png is a folder") as
 * if the plots were to be written. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_files.h"
#include "cli_run.h"
#include "mpbench.h"

static void run_without_gnuplot(const char *plot) {
  char trace[256], out[256], dir[320], bin[256], res[320];
  snprintf(trace, sizeof trace, "%s/t.csv", scratch_dir());
  put_text(trace, "Thread,Time,Action,Pointer,Size,Stream\n"
                  "0,00:00:00.000001,allocate,0x1000,4096,0\n"
                  "0,00:00:00.000002,free,0x1000,4096,0\n");
  snprintf(out, sizeof out, "%s/out", scratch_dir());
  cr_assert_eq(mkdir(out, 0700), 0);
  snprintf(dir, sizeof dir, "%s/%s", out, plot);
  cr_assert_eq(mkdir(dir, 0700), 0);
  /* A PATH with no gnuplot on it. */
  snprintf(bin, sizeof bin, "%s/bin", scratch_dir());
  cr_assert_eq(mkdir(bin, 0700), 0);
  cr_assert_eq(setenv("PATH", bin, 1), 0);
  const char *args[] = {"replay",        "--out",       out,    "--device",
                        "host",          "--allocator", "pool", "--quiet",
                        "--no-capacity", trace,         NULL};
  static char err[1 << 16];
  char stdout_path[320];
  snprintf(stdout_path, sizeof stdout_path, "%s/stdout", scratch_dir());
  cr_assert_eq(mpb_test_run_err(args, stdout_path, err, sizeof err), 0, "%s",
               err);
  cr_expect_not_null(strstr(slurp(stdout_path), "No plots: gnuplot"), "%s",
                     slurp(stdout_path));
  snprintf(res, sizeof res, "%s/results.json", out);
  cr_expect_eq(access(res, F_OK), 0, "no %s", res);
  struct stat sb;
  cr_expect(stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode), "%s not left", dir);
}

Test(cli_plot_names_free_without_gnuplot, ratios_png_a_folder,
     .init = scratch_make, .fini = scratch_drop) {
  run_without_gnuplot("ratios.png");
}

Test(cli_plot_names_free_without_gnuplot, bytes_png_a_folder,
     .init = scratch_make, .fini = scratch_drop) {
  run_without_gnuplot("bytes_t.png");
}
