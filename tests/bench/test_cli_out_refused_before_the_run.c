/* An --out where no folder can be made is refused before the run (exit 2,
 * nothing written), as mpbench --help promises, also where the check had
 * to look at the path's own last entry: a symbolic link that points
 * nowhere (mkdir finds the link there and makes nothing), a path through
 * one, and a path ending in '/' whose entry is a file or such a link.
 * Before, the check went past each of them to the folder above, found it
 * writable, and the results of the whole run were lost when they were
 * written (exit 1, "... is not a folder"). A folder, a link to one, and a
 * path still to be made pass, with or without a trailing '/'. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_files.h"
#include "cli_run.h"
#include "mpbench.h"

static char trace[128];

static void setup(void) {
  scratch_make();
  snprintf(trace, sizeof trace, "%s/t.csv", scratch_dir());
  put_text(trace, "Thread,Time,Action,Pointer,Size,Stream\n"
                  "0,00:00:00.000001,allocate,0x1000,4096,0\n"
                  "0,00:00:00.000002,free,0x1000,4096,0\n");
  char p[256];
  snprintf(p, sizeof p, "%s/nowhere", scratch_dir());
  cr_assert_eq(symlink("/nonexistent-mpbench/gone", p), 0);
  snprintf(p, sizeof p, "%s/dir", scratch_dir());
  cr_assert_eq(mkdir(p, 0777), 0);
  snprintf(p, sizeof p, "%s/to-dir", scratch_dir());
  cr_assert_eq(symlink("dir", p), 0);
}

/* scratch/rel as a path. */
static const char *at(const char *rel) {
  static char p[4][256];
  static int k;
  k = (k + 1) % 4;
  snprintf(p[k], sizeof p[k], "%s/%s", scratch_dir(), rel);
  return p[k];
}

/* mpbench replay --out out: its exit status, stderr into err. */
static int replay_into(const char *out, char *err, size_t n) {
  const char *args[] = {"replay",     "--out",       out,    "--device",
                        "host",       "--allocator", "pool", "--no-capacity",
                        "--no-plots", "--quiet",     trace,  NULL};
  return mpb_test_run_err(args, "/dev/null", err, n);
}

/* out is refused before the run: the check says why, naming bad (the
 * entry no folder can be made at), and the command exits 2 with nothing
 * written anywhere in the scratch folder. */
static void expect_refused(const char *out, const char *bad, const char *why) {
  cr_expect_eq(mpb_report_check_dir(out), MP_EINVAL, "--out %s passed", out);
  cr_expect(strstr(mp_last_error(), bad) != NULL &&
                strstr(mp_last_error(), why) != NULL,
            "--out %s: want '%s' and '%s', got: %s", out, bad, why,
            mp_last_error());
  char err[2048];
  cr_expect_eq(replay_into(out, err, sizeof err), 2, "--out %s: %s", out, err);
  /* Said by the check before the run, not by the writing after it. */
  cr_expect(strstr(err, "mpbench: --out ") == err &&
                strstr(err, "writing results") == NULL,
            "--out %s failed after the run: %s", out, err);
  cr_expect_eq(access(at("dir/results.json"), F_OK), -1);
  cr_expect_eq(access("/nonexistent-mpbench", F_OK), -1);
  struct stat sb;
  cr_expect(lstat(at("nowhere"), &sb) == 0 && S_ISLNK(sb.st_mode),
            "the link was changed");
}

Test(cli_out_refused_before_the_run, a_link_to_nothing, .init = setup,
     .fini = scratch_drop) {
  expect_refused(at("nowhere"), at("nowhere"), "symbolic link");
  expect_refused(at("nowhere/"), at("nowhere"), "symbolic link");
  expect_refused(at("nowhere/a/b"), at("nowhere"), "symbolic link");
}

Test(cli_out_refused_before_the_run, a_file_named_with_a_trailing_slash,
     .init = setup, .fini = scratch_drop) {
  expect_refused(at("t.csv/"), at("t.csv"), "not a folder");
  expect_refused(at("t.csv//"), at("t.csv"), "not a folder");
}

Test(cli_out_refused_before_the_run, folders_and_paths_to_make_still_pass,
     .init = setup, .fini = scratch_drop) {
  static const char *const ok[] = {"dir",     "dir/",       "to-dir",
                                   "to-dir/", "dir/new/a/", "new//b/"};
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
    cr_expect_eq(mpb_report_check_dir(at(ok[i])), MP_OK, "%s: %s", ok[i],
                 mp_last_error());
  /* Nothing made by the checks. */
  cr_expect_eq(access(at("dir/new"), F_OK), -1);
  cr_expect_eq(access(at("new"), F_OK), -1);
  char err[2048];
  cr_expect_eq(replay_into(at("to-dir/"), err, sizeof err), 0, "%s", err);
  cr_expect_eq(access(at("dir/results.json"), F_OK), 0);
}
