/* mpbench's messages show the values of its options as they show trace
 * names (mpb_shown / mp__clip: each control byte '?'): the traces folder
 * (--traces or $MEMPOOL_TRACES) that cannot be opened, a device that
 * cannot be opened, an unknown allocator, a --blockmap that is not run, an
 * unknown option. Before, these printed them raw, so that an option's
 * value could send the terminal an escape sequence or break the line. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_files.h"
#include "cli_run.h"
#include "mpbench.h"

#define ESC_NAME  "e\033[31mRED\033]0;title\007\nX"
#define ESC_SHOWN "e?[31mRED?]0;title??X"

/* args refused (exit status 2) with a message that says why, shows
 * ESC_NAME as ESC_SHOWN and holds no control byte but its line ends. */
static void expect_refused_shown(const char **args, const char *why) {
  static char err[1 << 16];
  cr_assert_eq(mpb_test_run_err(args, "/dev/null", err, sizeof err), 2, "%s",
               err);
  cr_expect_not_null(strstr(err, why), "%s", err);
  cr_expect_not_null(strstr(err, ESC_SHOWN), "%s", err);
  for (const char *p = err; *p != '\0'; p++)
    cr_expect(*p == '\n' || (unsigned char)*p >= 0x20,
              "control byte 0x%02x at %zu in:\n%s", (unsigned char)*p,
              (size_t)(p - err), err);
}

Test(cli_option_values_shown, traces_folder, .init = scratch_make,
     .fini = scratch_drop) {
  char traces[256], out[256];
  snprintf(traces, sizeof traces, "%s/" ESC_NAME, scratch_dir());
  snprintf(out, sizeof out, "%s/out", scratch_dir());
  const char *args[] = {"run",  "--traces",   traces,          "--allocator",
                        "pool", "--device",   "host",          "--out",
                        out,    "--no-plots", "--no-capacity", NULL};
  expect_refused_shown(args, "cannot open traces folder");
}

Test(cli_option_values_shown, traces_folder_from_the_environment,
     .init = scratch_make, .fini = scratch_drop) {
  char traces[256], out[256];
  snprintf(traces, sizeof traces, "%s/" ESC_NAME, scratch_dir());
  snprintf(out, sizeof out, "%s/out", scratch_dir());
  cr_assert_eq(setenv("MEMPOOL_TRACES", traces, 1), 0);
  const char *args[] = {"run",           "--allocator", "pool", "--device",
                        "host",          "--out",       out,    "--no-plots",
                        "--no-capacity", NULL};
  expect_refused_shown(args, "cannot open traces folder");
}

Test(cli_option_values_shown, device, .init = scratch_make,
     .fini = scratch_drop) {
  char out[256];
  snprintf(out, sizeof out, "%s/out", scratch_dir());
  const char *args[] = {
      "run",   "--workload", "random:n=10", "--device",      "x" ESC_NAME,
      "--out", out,          "--no-plots",  "--no-capacity", NULL};
  expect_refused_shown(args, "cannot open device x" ESC_SHOWN ":");
}

Test(cli_option_values_shown, allocator, .init = scratch_make,
     .fini = scratch_drop) {
  char out[256];
  snprintf(out, sizeof out, "%s/out", scratch_dir());
  const char *args[] = {
      "run",   "--workload", "random:n=10", "--allocator",   "x" ESC_NAME,
      "--out", out,          "--no-plots",  "--no-capacity", NULL};
  expect_refused_shown(args, "unknown allocator");
}

Test(cli_option_values_shown, blockmap, .init = scratch_make,
     .fini = scratch_drop) {
  char out[256];
  snprintf(out, sizeof out, "%s/out", scratch_dir());
  const char *args[] = {
      "run",      "--workload", "random:n=10",   "--allocator", "pool",
      "--device", "host",       "--blockmap",    ESC_NAME,      "--out",
      out,        "--no-plots", "--no-capacity", NULL};
  expect_refused_shown(args, "is not one of the allocators run");
}

Test(cli_option_values_shown, unknown_option) {
  const char *args[] = {"run", "--" ESC_NAME, NULL};
  expect_refused_shown(args, "unknown option");
}
