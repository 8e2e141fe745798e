/* mpbench keeps the workloads, allocators and trace files it is given in
 * lists; one that cannot grow (out of host memory) stops it with a message
 * and exit status 1, as every other out of host memory of mpbench's. The
 * failure was ignored: the argument was dropped and the run went on
 * without it (with no --workload left, every built-in and trace ran). Here
 * the argument after it is unknown, so a dropped one shows as the usage
 * error (2) about that one instead. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_run.h"
#include "internal.h"

/* mpb_main on args with the next host allocation failing; its exit status,
 * what it wrote on stderr in err (n bytes). */
static int run_short_of_memory(const char **args, char *err, size_t n) {
  mp__fault_host_after(0);
  int rc = mpb_test_run_err(args, NULL, err, n);
  mp__fault_host_after(-1);
  return rc;
}

static void expect_out_of_memory(const char **args, const char *what) {
  char err[1024];
  int rc = run_short_of_memory(args, err, sizeof err);
  cr_expect_eq(rc, 1, "exit status %d: %s", rc, err);
  cr_expect(strstr(err, "out of host memory") != NULL, "%s", err);
  cr_expect(strstr(err, what) != NULL, "'%s' lacks '%s'", err, what);
}

Test(cli_args_out_of_memory, a_workload_that_cannot_be_kept_stops_the_run) {
  const char *args[] = {"run", "--workload", "random:n=10", "--no-such-option",
                        NULL};
  expect_out_of_memory(args, "--workload");
}

Test(cli_args_out_of_memory, an_allocator_that_cannot_be_kept_stops_the_run) {
  const char *args[] = {"run", "--allocator", "pool", "--no-such-option", NULL};
  expect_out_of_memory(args, "--allocator");
}

Test(cli_args_out_of_memory, a_trace_file_that_cannot_be_kept_stops_replay) {
  const char *args[] = {"replay", "/nonexistent/t.csv", "--no-such-option",
                        NULL};
  expect_out_of_memory(args, "trace file");
}
