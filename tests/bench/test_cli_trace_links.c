/* `mpbench run --traces DIR` replays each file of the folder once: a link
 * to a trace beside it, a link to the folder itself (DIR/again -> .) and a
 * hard link made a row each of the same figures under other names. Links
 * in a loop, and one back up from a subfolder, end the scan. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli_files.h"
#include "cli_run.h"
#include "mpbench.h"

static void in_tmp(char *buf, size_t len, const char *rel) {
  snprintf(buf, len, "%s/%s", scratch_dir(), rel);
}

/* Rows of results.csv (its header left out). */
static unsigned rows(const char *csv) {
  unsigned n = 0;
  for (const char *p = slurp(csv); (p = strchr(p, '\n')) != NULL; p++)
    n++;
  return n - 1;
}

Test(cli_trace_links, a_trace_reached_through_links_runs_once,
     .init = scratch_make, .fini = scratch_drop, .timeout = 120) {
  char traces[300], sub[300], p[300], q[300], out[300], csv[320];
  in_tmp(traces, sizeof traces, "traces");
  in_tmp(sub, sizeof sub, "traces/sub");
  cr_assert_eq(mkdir(traces, 0700), 0);
  cr_assert_eq(mkdir(sub, 0700), 0);
  in_tmp(p, sizeof p, "traces/t.csv");
  FILE *f = fopen(p, "w");
  cr_assert_not_null(f);
  fputs("Thread,Time,Action,Pointer,Size,Stream\n"
        "1,00:00:00.000001,allocate,0x1000,3000000,0\n"
        "1,00:00:00.000002,allocate,0x2000,700,0\n"
        "1,00:00:00.000003,free,0x1000,0,0\n",
        f);
  fclose(f);
  in_tmp(q, sizeof q, "traces/hard.csv");
  cr_assert_eq(link(p, q), 0);
  static const char *const links[][2] = {
      {"t.csv", "traces/l.csv"},         {".", "traces/again"},
      {"../t.csv", "traces/sub/up.csv"}, {"..", "traces/sub/parent"},
      {"loop2.csv", "traces/loop1.csv"}, {"loop1.csv", "traces/loop2.csv"}};
  for (size_t i = 0; i < sizeof links / sizeof *links; i++) {
    in_tmp(q, sizeof q, links[i][1]);
    cr_assert_eq(symlink(links[i][0], q), 0, "%s", q);
  }
  in_tmp(out, sizeof out, "out");
  const char *args[] = {
      "run",         "--traces", traces,  "--workload", "random:n=10",
      "--allocator", "pool",     "--out", out,          "--no-capacity",
      "--no-plots",  "--quiet",  NULL};
  cr_assert_eq(mpb_test_run(args, "/dev/null"), 0, "%s", mp_last_error());
  snprintf(csv, sizeof csv, "%s/results.csv", out);
  cr_expect_eq(rows(csv), 2, "random and one trace, not:\n%s", slurp(csv));
  cr_expect(strstr(slurp(csv), "\nhard,pool,") != NULL, "%s", slurp(csv));
}
