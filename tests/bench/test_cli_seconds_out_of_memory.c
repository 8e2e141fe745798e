/* mpbench's seconds (--capacity-budget, --capacity-total) written with 64
 * characters or more are read through a heap copy; where that copy finds
 * no host memory, the value was reported as bad ("bad --capacity-budget
 * '0.000...'", exit 2), sending the user to fix a value that is fine. It
 * is out of host memory: said so, exit status 1, as every other out of
 * host memory of mpbench's. With memory, the same value is taken (the
 * run then stops at the unknown option after it, a usage error naming
 * that option). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_run.h"
#include "internal.h"

/* 0.5 written with 80 characters: a valid number, too long for the
 * parser's stack copy. */
static const char *long_half(void) {
  static char v[81];
  memset(v, '0', 80);
  v[0] = '0';
  v[1] = '.';
  v[2] = '5';
  v[80] = '\0';
  return v;
}

/* mpb_main on args, the next host allocation failing when short; its exit
 * status, what it wrote on stderr in err (n bytes). */
static int run(const char **args, bool short_of_memory, char *err, size_t n) {
  if (short_of_memory)
    mp__fault_host_after(0);
  int rc = mpb_test_run_err(args, "/dev/null", err, n);
  mp__fault_host_after(-1);
  return rc;
}

Test(cli_seconds_out_of_memory, a_long_value_without_memory_is_no_bad_value) {
  static const char *const opts[] = {"--capacity-budget", "--capacity-total"};
  for (size_t o = 0; o < 2; o++) {
    const char *args[] = {"run", opts[o], long_half(), "--no-such-option",
                          NULL};
    char err[1024];
    int rc = run(args, true, err, sizeof err);
    cr_expect_eq(rc, 1, "%s: exit status %d: %s", opts[o], rc, err);
    cr_expect(strstr(err, "out of host memory") != NULL, "%s: %s", opts[o],
              err);
    cr_expect(strstr(err, opts[o]) != NULL, "'%s' lacks '%s'", err, opts[o]);
    cr_expect(strstr(err, "bad ") == NULL, "%s: %s", opts[o], err);

    /* The value itself is good: with memory, the next argument is what
     * stops the run. */
    rc = run(args, false, err, sizeof err);
    cr_expect_eq(rc, 2, "%s: exit status %d: %s", opts[o], rc, err);
    cr_expect(strstr(err, "unknown option '--no-such-option'") != NULL,
              "%s: %s", opts[o], err);
  }
}
