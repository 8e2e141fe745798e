/* The progress line mpbench draws on a terminal ("loading FILE", then
 * "[###...] k/n WORKLOAD / ALLOCATOR") shows a trace's name with each
 * control byte as '?', as its messages do (mp__clip): a trace file's name
 * cannot send the terminal an escape sequence, move the cursor or end the
 * line. Before, the name went to the terminal raw. Run on a pseudo
 * terminal, the only place the line is drawn. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pty.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli_files.h"
#include "cli_run.h"
#include "mpbench.h"

Test(cli_progress_names_shown, an_escape_sequence_in_a_trace_name,
     .init = scratch_make, .fini = scratch_drop) {
  char trace[256], out[256];
  snprintf(trace, sizeof trace, "%s/t\033[31mRED\033]0;title\007.csv",
           scratch_dir());
  put_text(trace, "Thread,Time,Action,Pointer,Size,Stream\n"
                  "0,00:00:00.000001,allocate,0x1000,4096,0\n"
                  "0,00:00:00.000002,free,0x1000,4096,0\n");
  snprintf(out, sizeof out, "%s/out", scratch_dir());
  int master, slave;
  if (openpty(&master, &slave, NULL, NULL, NULL) != 0)
    cr_skip_test("no pseudo terminal here: %s", strerror(errno));
  cr_assert_eq(fcntl(master, F_SETFL, O_NONBLOCK), 0);
  /* stderr on the terminal, for the run only. */
  fflush(stderr);
  int saved = dup(2);
  cr_assert_geq(saved, 0);
  cr_assert_geq(dup2(slave, 2), 0);
  const char *args[] = {"replay",        "--out",       out,    "--device",
                        "host",          "--allocator", "pool", "--no-plots",
                        "--no-capacity", trace,         NULL};
  int rc = mpb_test_run(args, "/dev/null");
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(slave);
  static char got[1 << 16];
  size_t n = 0;
  for (ssize_t k; n < sizeof got - 1 &&
                  (k = read(master, got + n, sizeof got - 1 - n)) > 0;)
    n += (size_t)k;
  got[n] = '\0';
  close(master);
  cr_assert_eq(rc, 0);
  /* Drawn, with the name shown. */
  cr_expect_not_null(strstr(got, "loading "), "%s", got);
  cr_expect_not_null(strstr(got, "t?[31mRED?]0;title?"), "%s", got);
  cr_expect_not_null(strstr(got, "t?[31mRED?]0;title? / pool"), "%s", got);
  /* None of the name's control bytes reached the terminal. */
  cr_expect_null(strstr(got, "\033[31m"), "%s", got);
  cr_expect_null(strchr(got, '\007'), "%s", got);
  cr_expect_null(strstr(got, "\033]"), "%s", got);
}
