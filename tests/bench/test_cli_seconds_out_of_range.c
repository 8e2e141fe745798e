/* mpbench's seconds (--capacity-budget, --capacity-total) out of a
 * double's range are bad usage: "1e-400" read as 0 and "1e400" as inf,
 * both "no limit", so a user who asked for next to no time got a search
 * without bound. Exit 2 with a message naming the value, nothing written;
 * a tiny value a double still holds is that value. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli_files.h"
#include "cli_run.h"
#include "mpbench.h"

Test(cli_seconds_out_of_range, seconds_a_double_cannot_hold_are_bad_usage,
     .init = scratch_make, .fini = scratch_drop) {
  char out[512];
  snprintf(out, sizeof out, "%s/out", scratch_dir());
  static const char *const opts[] = {"--capacity-budget", "--capacity-total"};
  static const char *const vals[] = {"1e-400", "0.1e-330", "1e400",
                                     "99999e99999", "1e-99999"};
  for (size_t o = 0; o < 2; o++)
    for (size_t v = 0; v < sizeof vals / sizeof *vals; v++) {
      const char *args[] = {"run",     "--out",      out,
                            "--quiet", "--workload", "random:n=10",
                            opts[o],   vals[v],      NULL};
      char said[600];
      int rc = mpb_test_run_err(args, "/dev/null", said, sizeof said);
      cr_expect_eq(rc, 2, "%s %s was accepted (exit %d)", opts[o], vals[v], rc);
      char want[64];
      snprintf(want, sizeof want, "bad %s '%s'", opts[o], vals[v]);
      cr_expect(strstr(said, want) != NULL, "%s %s: said '%s'", opts[o],
                vals[v], said);
    }
  cr_expect_eq(access(out, F_OK), -1, "the output folder was created");
}

/* 0 written as such, and a subnormal, are values, not out of range. */
Test(cli_seconds_out_of_range, zero_and_tiny_seconds_are_taken,
     .init = scratch_make, .fini = scratch_drop) {
  char out[512];
  snprintf(out, sizeof out, "%s/out", scratch_dir());
  static const char *const vals[] = {"0", "0.0e-400", "1e-310"};
  for (size_t v = 0; v < sizeof vals / sizeof *vals; v++) {
    const char *args[] = {"run",
                          "--out",
                          out,
                          "--quiet",
                          "--no-plots",
                          "--no-traces",
                          "--workload",
                          "random:n=10",
                          "--allocator",
                          "pool",
                          "--capacity-budget",
                          vals[v],
                          NULL};
    cr_expect_eq(mpb_test_run(args, "/dev/null"), 0,
                 "--capacity-budget %s refused: %s", vals[v], mp_last_error());
  }
}
