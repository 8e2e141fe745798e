/* The gnuplot script and the ratios' data file keep each name on its line:
 * a control byte in a trace's name (a newline or a carriage return in its
 * file name) is written '?', as results.md writes it, and a quote still
 * doubled. Before, the newline went into the script raw, inside a quoted
 * title, which ended the command midway (gnuplot refuses an unterminated
 * string, and every plot of the run was lost), and split the name's row
 * of ratios.dat in two. The plots are drawn by a stand-in gnuplot
 * (fake_gnuplot.h) that keeps what it was given. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli_files.h"
#include "cli_run.h"
#include "fake_gnuplot.h"
#include "mpbench.h"

static char trace[128], out[128];

static void setup(void) {
  fake_gnuplot_scratch("a\nb'c\rd.csv", trace, sizeof trace, out, sizeof out);
}

/* How many times c is in s[0, n). */
static size_t count(const char *s, size_t n, char c) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    k += s[i] == c;
  return k;
}

Test(cli_plot_names_one_line, a_newline_in_a_trace_name, .init = setup,
     .fini = scratch_drop) {
  const char *args[] = {"replay", "--out",         out,       "--device",
                        "host",   "--allocator",   "pool",    "--allocator",
                        "direct", "--no-capacity", "--quiet", trace,
                        NULL};
  char err[4096];
  cr_assert_eq(mpb_test_run_err(args, "/dev/null", err, sizeof err), 0, "%s",
               err);
  /* Each line of the script closes every quote it opens. */
  const char *gp = slurp(fake_gnuplot_kept(scratch_dir(), "plot.gp"));
  for (const char *l = gp; *l;) {
    size_t n = strcspn(l, "\n");
    cr_expect_eq(count(l, n, '\'') % 2, 0, "a quote left open: %.*s", (int)n,
                 l);
    l += n + (l[n] != '\0');
  }
  cr_expect_not_null(
      strstr(gp, "\nset title 'a?b''c?d: device memory reserved vs live'"),
      "%s", gp);
  /* Each row of ratios.dat: the quoted name, then a ratio per allocator. */
  const char *dat = slurp(fake_gnuplot_kept(scratch_dir(), "ratios.dat"));
  cr_expect_eq(count(dat, strlen(dat), '\n'), 1, "one row: %s", dat);
  cr_expect(strncmp(dat, "\"a?b'c?d\" ", 10) == 0, "%s", dat);
  char png[256];
  snprintf(png, sizeof png, "%s/bytes_a_b_c_d.png", out);
  cr_expect_eq(access(png, F_OK), 0, "no plot drawn");
}
