/* What mpbench prints on stdout (run's and bound's tables, list, help):
 * a table the output cannot take is a failure (exit 1, said on stderr),
 * not a success that printed nothing. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_files.h"
#include "cli_run.h"
#include "mpbench.h"

/* /dev/full takes nothing (ENOSPC): every command that prints exited 0
 * having printed none of it, as a full disk or a closed pipe leaves a
 * script with an empty table and a success. */
Test(cli_stdout, a_table_stdout_cannot_take_exits_1) {
  char tmpdir[] = "/tmp/mpbench-stdout-XXXXXX";
  cr_assert_not_null(mkdtemp(tmpdir));
  const char *run[] = {"run",           "--workload", "random:n=50",
                       "--allocator",   "direct",     "--no-plots",
                       "--no-capacity", "--quiet",    "--out",
                       tmpdir,          NULL};
  const char *bound[] = {"bound", "--workload", "random:n=50", "--quiet", NULL};
  const char *list[] = {"list", NULL};
  const char *help[] = {"--help", NULL};
  const char **const cmds[] = {run, bound, list, help};
  for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
    cr_expect_eq(mpb_test_run(cmds[i], "/dev/null"), 0, "%s failed",
                 cmds[i][0]);
    cr_expect_eq(mpb_test_run(cmds[i], "/dev/full"), 1,
                 "%s printed into /dev/full and did not say so", cmds[i][0]);
  }
  rm_tree(tmpdir);
}
