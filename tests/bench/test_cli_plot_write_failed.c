/* A plot file (plot.gp, bytes_N.dat, ratios.dat) that could not be written
 * whole (a disk that filled partway: a write failed on the way, ferror, or
 * at the flush, fclose) fails the plot step with the file named ("No plots:
 * cannot write ...") and gnuplot is not run. Before, the closes went
 * unchecked and gnuplot drew the truncated data without a word. The
 * failure is injected: this executable's fclose and ferror (they come
 * before the C library's) report one for the file named by failing. The
 * plots are drawn by a stand-in gnuplot (fake_gnuplot.h). */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli_files.h"
#include "cli_run.h"
#include "fake_gnuplot.h"
#include "mpbench.h"
#include "stream_named.h"

static const char *failing; /* a file name: its close or its ferror fails */
static int at_ferror;       /* 1: ferror fails it, 0: fclose does */

int fclose(FILE *f) {
  int (*next)(FILE *) = (int (*)(FILE *))dlsym(RTLD_NEXT, "fclose");
  int fail = !at_ferror && stream_named(f, failing);
  int rc = next(f);
  if (fail) {
    errno = ENOSPC;
    return EOF;
  }
  return rc;
}

int ferror(FILE *f) {
  int (*next)(FILE *) = (int (*)(FILE *))dlsym(RTLD_NEXT, "ferror");
  return (at_ferror && stream_named(f, failing)) || next(f);
}

static char trace[128], out[128];

static void setup(void) {
  fake_gnuplot_scratch("t.csv", trace, sizeof trace, out, sizeof out);
}

/* A replay with name's write failing (at its ferror if late): no plots,
 * the file named, nothing drawn. */
static void expect_no_plots(const char *name, int late) {
  failing = name;
  at_ferror = late;
  char got[256], png[256];
  snprintf(got, sizeof got, "%s/stdout", scratch_dir());
  const char *args[] = {"replay",        "--out",       out,    "--device",
                        "host",          "--allocator", "pool", "--quiet",
                        "--no-capacity", trace,         NULL};
  int rc = mpb_test_run(args, got);
  failing = NULL;
  cr_assert_eq(rc, 0, "%s", mp_last_error());
  const char *text = slurp(got);
  char want[64];
  snprintf(want, sizeof want, "/%s: ", name);
  cr_expect_not_null(strstr(text, "\nNo plots: cannot write "), "%s", text);
  cr_expect_not_null(strstr(text, want), "%s", text);
  cr_expect_eq(access(fake_gnuplot_kept(scratch_dir(), "plot.gp"), F_OK), -1,
               "gnuplot was run");
  snprintf(png, sizeof png, "%s/ratios.png", out);
  cr_expect_eq(access(png, F_OK), -1, "ratios.png made");
  snprintf(png, sizeof png, "%s/bytes_t.png", out);
  cr_expect_eq(access(png, F_OK), -1, "bytes_t.png made");
  /* The results themselves are written. */
  snprintf(png, sizeof png, "%s/results.json", out);
  cr_expect_eq(access(png, F_OK), 0, "no results.json");
}

/* Each plot file, failing at its close; bytes_0.dat also at a write on the
 * way (its close succeeding). */
typedef struct {
  char name[16]; /* inline: a parameter is copied into the test's process */
  int late;
} fault_t;

ParameterizedTestParameters(cli_plot_write_failed, a_file_not_written) {
  static fault_t faults[] = {{"plot.gp", 0},
                             {"bytes_0.dat", 0},
                             {"ratios.dat", 0},
                             {"bytes_0.dat", 1}};
  return cr_make_param_array(fault_t, faults, sizeof faults / sizeof *faults);
}

ParameterizedTest(fault_t *f, cli_plot_write_failed, a_file_not_written,
                  .init = setup, .fini = scratch_drop) {
  expect_no_plots(f->name, f->late);
}

/* The injection does not fail a run by itself: with nothing failing, the
 * plots are drawn. */
Test(cli_plot_write_failed, nothing_failing_plots, .init = setup,
     .fini = scratch_drop) {
  const char *args[] = {"replay",        "--out",       out,    "--device",
                        "host",          "--allocator", "pool", "--quiet",
                        "--no-capacity", trace,         NULL};
  cr_assert_eq(mpb_test_run(args, "/dev/null"), 0, "%s", mp_last_error());
  char png[256];
  snprintf(png, sizeof png, "%s/ratios.png", out);
  cr_expect_eq(access(png, F_OK), 0, "no ratios.png");
}
