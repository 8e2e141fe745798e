/* A run's --out folder holds that run's files only: a rerun into it with
 * other workloads, or with --no-plots, left the plots of the run before
 * (bytes_WORKLOAD.png of a workload not run again, ratios.png of other
 * allocators) beside its own results, as if they were this run's. mpbench
 * lists what it wrote (DIR/.run-files) and the next run removes what that
 * list names and it does not write again; nothing else (a user's file, a
 * file with one of mpbench's names it never wrote, a link) is touched. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_files.h"
#include "cli_run.h"
#include "mpbench.h"

static char out[512];

/* A scratch folder with out/ to come in it. */
static void make_tmp(void) {
  scratch_make();
  snprintf(out, sizeof out, "%s/out", scratch_dir());
}

static bool in_out(const char *name) {
  char p[700];
  struct stat sb;
  snprintf(p, sizeof p, "%s/%s", out, name);
  return lstat(p, &sb) == 0;
}

static void put(const char *name, const char *text) {
  char p[700];
  snprintf(p, sizeof p, "%s/%s", out, name);
  FILE *f = fopen(p, "w");
  cr_assert_not_null(f, "cannot write %s", p);
  fputs(text, f);
  fclose(f);
}

/* mpbench run of the workloads given (w2 may be NULL) into out. */
static int run(const char *w1, const char *w2, bool plots) {
  const char *args[16] = {"run",     "--out",         out,
                          "--quiet", "--no-capacity", "--allocator",
                          "pool",    "--workload",    w1};
  size_t n = 9;
  if (!plots)
    args[n++] = "--no-plots";
  if (w2 != NULL) {
    args[n++] = "--workload";
    args[n++] = w2;
  }
  args[n] = NULL;
  return mpb_test_run(args, "/dev/null");
}

Test(cli_out_this_run_only, a_rerun_removes_the_plots_it_does_not_draw,
     .init = make_tmp, .fini = scratch_drop) {
  if (system("gnuplot -e 'set terminal png' >/dev/null 2>&1") != 0)
    cr_skip_test("gnuplot with a png terminal is not installed");
  cr_assert_eq(run("random:n=50", "cnn:batches=2", true), 0, "%s",
               mp_last_error());
  cr_assert(in_out("bytes_random_n_50.png") &&
            in_out("bytes_cnn_batches_2.png") && in_out("ratios.png"));
  /* Beside them, files of the user's, one with a name like a plot's. */
  put("notes.txt", "mine\n");
  put("bytes_mine.png", "mine\n");
  cr_assert_eq(run("random:n=50", NULL, true), 0, "%s", mp_last_error());
  cr_expect(in_out("bytes_random_n_50.png") && in_out("ratios.png"));
  cr_expect(!in_out("bytes_cnn_batches_2.png"),
            "the plot of a workload not run again is still there");
  cr_expect(in_out("notes.txt") && in_out("bytes_mine.png"),
            "a file mpbench did not write was removed");
  cr_assert_eq(run("random:n=50", NULL, false), 0, "%s", mp_last_error());
  cr_expect(!in_out("bytes_random_n_50.png") && !in_out("ratios.png"),
            "--no-plots kept the plots of the run before");
  cr_expect(in_out("results.csv") && in_out("report.html"));
  cr_expect(in_out("notes.txt") && in_out("bytes_mine.png"),
            "a file mpbench did not write was removed");
}

/* The list names only what mpbench writes: a name it lists that is not
 * one of its own (a list edited by hand, ../x), or that is a link now, is
 * left where it is. */
Test(cli_out_this_run_only, only_its_own_regular_files_are_removed,
     .init = make_tmp, .fini = scratch_drop) {
  cr_assert_eq(run("random:n=50", NULL, false), 0, "%s", mp_last_error());
  put("notes.txt", "mine\n");
  put("bytes_old.png", "old plot\n");
  put("../keep.txt", "mine\n");
  char p[700], keep[700];
  snprintf(keep, sizeof keep, "%s/keep.txt", scratch_dir());
  snprintf(p, sizeof p, "%s/bytes_linked.png", out);
  cr_assert_eq(symlink(keep, p), 0);
  snprintf(p, sizeof p, "%s/.run-files", out);
  FILE *f = fopen(p, "a");
  cr_assert_not_null(f);
  fputs("notes.txt\n../keep.txt\nbytes_linked.png\nbytes_old.png\n", f);
  fclose(f);
  cr_assert_eq(run("random:n=50", NULL, false), 0, "%s", mp_last_error());
  cr_expect(in_out("notes.txt"), "a name not mpbench's was removed");
  cr_expect(access(keep, F_OK) == 0, "a file outside the folder was removed");
  cr_expect(in_out("bytes_linked.png"), "a link was removed");
  cr_expect(!in_out("bytes_old.png"), "a plot the list names was kept");
}

/* A line longer than the reader's buffer (no name mpbench writes is: a
 * file name has at most NAME_MAX bytes) is no name at all: it was read in
 * pieces, each taken for a line, so that a corrupt list whose long line
 * ended in one of mpbench's names removed the user's file of that name. */
Test(cli_out_this_run_only, a_line_too_long_for_a_name_names_nothing,
     .init = make_tmp, .fini = scratch_drop) {
  cr_assert_eq(run("random:n=50", NULL, false), 0, "%s", mp_last_error());
  put("bytes_mine.png", "mine\n");
  put("ratios.png", "mine\n");
  char p[700];
  snprintf(p, sizeof p, "%s/.run-files", out);
  FILE *f = fopen(p, "a");
  cr_assert_not_null(f);
  for (int k = 0; k < 2; k++) {
    for (int i = 0; i < 511 * (k + 1); i++)
      fputc('x', f);
    fputs(k == 0 ? "bytes_mine.png\n" : "ratios.png\n", f);
  }
  fclose(f);
  cr_assert_eq(run("random:n=50", NULL, false), 0, "%s", mp_last_error());
  cr_expect(in_out("bytes_mine.png") && in_out("ratios.png"),
            "the end of a long line was taken for a name");
}
