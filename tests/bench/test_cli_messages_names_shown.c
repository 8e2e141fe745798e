/* mpbench's messages about files show their names as its progress line
 * does (mp__clip: each control byte '?', a long name shortened): the note
 * that a folder's trace is replayed once ("traces DIR: A (one file,
 * replayed once)"), the refusal of a trace whose name is too long, and a
 * refused --out. Before, these printed the names raw, so a file's name could
 * send the terminal an escape sequence or break the line. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_files.h"
#include "cli_run.h"
#include "mpbench.h"

#define ESC_NAME  "e\033[31mRED\033]0;title\007"
#define ESC_SHOWN "e?[31mRED?]0;title?"

static const char trace_text[] = "Thread,Time,Action,Pointer,Size,Stream\n"
                                 "0,00:00:00.000001,allocate,0x1000,4096,0\n"
                                 "0,00:00:00.000002,free,0x1000,4096,0\n";

/* No control byte of a name reached stderr (its newlines end lines). */
static void expect_no_control(const char *err) {
  for (const char *p = err; *p != '\0'; p++)
    cr_expect(*p == '\n' || (unsigned char)*p >= 0x20,
              "control byte 0x%02x at %zu in:\n%s", (unsigned char)*p,
              (size_t)(p - err), err);
}

Test(cli_messages_names_shown, a_trace_replayed_once, .init = scratch_make,
     .fini = scratch_drop) {
  char traces[256], p[320], q[320], out[256];
  snprintf(traces, sizeof traces, "%s/" ESC_NAME, scratch_dir());
  cr_assert_eq(mkdir(traces, 0700), 0);
  snprintf(p, sizeof p, "%s/t.csv", traces);
  put_text(p, trace_text);
  snprintf(q, sizeof q, "%s/l" ESC_NAME ".csv", traces);
  cr_assert_eq(symlink("t.csv", q), 0);
  snprintf(out, sizeof out, "%s/out", scratch_dir());
  const char *args[] = {
      "run",  "--traces", traces, "--workload", "random:n=10",   "--allocator",
      "pool", "--out",    out,    "--no-plots", "--no-capacity", NULL};
  static char err[1 << 16];
  cr_assert_eq(mpb_test_run_err(args, "/dev/null", err, sizeof err), 0, "%s",
               err);
  cr_expect_not_null(strstr(err, "(one file, replayed once)"), "%s", err);
  cr_expect_not_null(strstr(err, "/" ESC_SHOWN ": "), "%s", err);
  expect_no_control(err);
}

/* trace a chain of five folders under top, each name 250 bytes, then t.csv
 * (PATH_MAX bytes). */
static void deep_trace(const char *top, char *trace) {
  char seg[251];
  memset(seg, 'x', sizeof seg - 1);
  seg[sizeof seg - 1] = '\0';
  memcpy(seg, ESC_NAME, strlen(ESC_NAME));
  int n = snprintf(trace, PATH_MAX, "%s/%s", scratch_dir(), top);
  cr_assert_eq(mkdir(trace, 0700), 0, "%s", trace);
  for (int i = 0; i < 5; i++) {
    n += snprintf(trace + n, PATH_MAX - (size_t)n, "/%s", seg);
    cr_assert_eq(mkdir(trace, 0700), 0, "%s", trace);
  }
  snprintf(trace + n, PATH_MAX - (size_t)n, "/t.csv");
  put_text(trace, trace_text);
}

Test(cli_messages_names_shown, a_trace_name_too_long, .init = scratch_make,
     .fini = scratch_drop) {
  /* Two files t.csv: each named by its path, longer than a result holds. */
  static char a[PATH_MAX], b[PATH_MAX];
  char out[256];
  deep_trace("a", a);
  deep_trace("b", b);
  snprintf(out, sizeof out, "%s/out", scratch_dir());
  const char *args[] = {"replay",
                        a,
                        b,
                        "--out",
                        out,
                        "--device",
                        "host",
                        "--no-plots",
                        "--no-capacity",
                        "--allocator",
                        "pool",
                        NULL};
  static char err[1 << 16];
  cr_assert_eq(mpb_test_run_err(args, "/dev/null", err, sizeof err), 2, "%s",
               err);
  cr_expect_not_null(strstr(err, "is longer than the"), "%s", err);
  cr_expect_not_null(strstr(err, ESC_SHOWN), "%s", err);
  expect_no_control(err);
}

Test(cli_messages_names_shown, a_refused_out, .init = scratch_make,
     .fini = scratch_drop) {
  /* Too long a name for an output folder: refused, the name shown. */
  static char out[6000];
  int n = snprintf(out, sizeof out, "%s/", scratch_dir());
  while ((size_t)n + sizeof ESC_NAME < 5000)
    n += snprintf(out + n, sizeof out - (size_t)n, "%s", ESC_NAME);
  const char *args[] = {
      "run",   "--workload", "random:n=10", "--allocator",   "pool",
      "--out", out,          "--no-plots",  "--no-capacity", NULL};
  static char err[1 << 16];
  cr_assert_eq(mpb_test_run_err(args, "/dev/null", err, sizeof err), 2, "%s",
               err);
  cr_expect_not_null(strstr(err, "mpbench: --out "), "%s", err);
  cr_expect_not_null(strstr(err, ESC_SHOWN), "%s", err);
  cr_expect_not_null(strstr(err, "output folder name too long"), "%s", err);
  expect_no_control(err);
}
