/* report.c's messages (mp_last_error, which mpbench prints after the
 * --out folder's name) quote the paths they are about as the command's
 * other messages do (mpb_shown: each control byte '?', a long one
 * shortened): a result folder's, a result file's, a link's text and its
 * target. Before, they put the paths in raw, so that a folder's name could
 * break the message's line or send the terminal an escape sequence. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_files.h"
#include "mpbench.h"

#define ESC_NAME  "e\033[31mRED\033]0;title\007\n"
#define ESC_SHOWN "e?[31mRED?]0;title??"

/* mp_last_error() after st, a refusal: one line, no control byte, the name
 * shown as mpb_shown shows it, and why. */
static void expect_shown(mp_status_t st, const char *why) {
  const char *msg = mp_last_error();
  cr_assert_eq(st, MP_EINVAL, "%s", msg);
  for (const char *p = msg; *p != '\0'; p++)
    cr_expect((unsigned char)*p >= 0x20 && *p != 0x7f,
              "control byte 0x%02x at %zu in: %s", (unsigned char)*p,
              (size_t)(p - msg), msg);
  cr_expect_not_null(strstr(msg, ESC_SHOWN), "%s", msg);
  cr_expect_not_null(strstr(msg, why), "%s", msg);
}

Test(report_messages_paths_shown, out_is_a_file, .init = scratch_make,
     .fini = scratch_drop) {
  char out[256];
  snprintf(out, sizeof out, "%s/" ESC_NAME, scratch_dir());
  put_text(out, "");
  expect_shown(mpb_report_check_dir(out), "is not a folder");
}

Test(report_messages_paths_shown, out_under_a_dangling_link,
     .init = scratch_make, .fini = scratch_drop) {
  char link[256], out[300];
  snprintf(link, sizeof link, "%s/l", scratch_dir());
  cr_assert_eq(symlink("/nonexistent/" ESC_NAME, link), 0);
  snprintf(out, sizeof out, "%s/sub", link);
  expect_shown(mpb_report_check_dir(out), "no folder can be made there");
}

Test(report_messages_paths_shown, a_result_linked_nowhere, .init = scratch_make,
     .fini = scratch_drop) {
  char out[256], link[300];
  snprintf(out, sizeof out, "%s/out", scratch_dir());
  cr_assert_eq(mkdir(out, 0700), 0);
  snprintf(link, sizeof link, "%s/results.md", out);
  cr_assert_eq(symlink("/nonexistent/" ESC_NAME, link), 0);
  expect_shown(mpb_report_check_dir(out), "which does not exist");
}

Test(report_messages_paths_shown, a_result_that_is_a_folder,
     .init = scratch_make, .fini = scratch_drop) {
  char out[256], dir[300];
  snprintf(out, sizeof out, "%s/" ESC_NAME, scratch_dir());
  cr_assert_eq(mkdir(out, 0700), 0);
  snprintf(dir, sizeof dir, "%s/results.csv", out);
  cr_assert_eq(mkdir(dir, 0700), 0);
  mpb_result_t r;
  memset(&r, 0, sizeof r);
  snprintf(r.workload, sizeof r.workload, "w");
  snprintf(r.allocator, sizeof r.allocator, "pool");
  bool plotted;
  char why[256];
  expect_shown(mpb_report_write(out, &r, 1, false, &plotted, why, sizeof why),
               "is a folder: results not written");
}
