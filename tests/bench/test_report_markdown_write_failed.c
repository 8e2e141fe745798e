/* A write of the table (results.md, mpbench's stdout) that failed is said:
 * mpb_report_markdown returns MP_EINVAL as mpb_report_json and
 * mpb_report_csv do. Before, it returned nothing and results.md's writer
 * looked at fclose only, whose own flush may succeed after an earlier one
 * failed (a disk full for a moment, an unbuffered stream): a cut
 * results.md was moved into place as the run's. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpbench.h"

static mpb_result_t rows[40];

static void fill(void) {
  for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
    mpb_result_t *r = &rows[i];
    memset(r, 0, sizeof *r);
    snprintf(r->workload, sizeof r->workload, "workload-%zu", i);
    snprintf(r->allocator, sizeof r->allocator, "pool");
    r->completed = i % 2 == 0;
    snprintf(r->error, sizeof r->error, "out of memory");
    r->peak_live = 1 << 20;
    r->peak_reserved = 2 << 20;
    r->ratio = 2;
  }
}

/* Writes fail the first time, then succeed (space freed meanwhile). */
static int writes;
static ssize_t flaky_write(void *c, const char *buf, size_t n) {
  (void)c;
  (void)buf;
  return writes++ == 0 ? -1 : (ssize_t)n;
}

Test(report_markdown_write_failed, a_write_that_fails_before_the_last,
     .init = fill) {
  FILE *f =
      fopencookie(NULL, "w", (cookie_io_functions_t){.write = flaky_write});
  cr_assert_not_null(f);
  char buf[256]; /* several flushes: the first fails */
  cr_assert_eq(setvbuf(f, buf, _IOFBF, sizeof buf), 0);
  cr_expect_eq(mpb_report_markdown(f, rows, sizeof rows / sizeof *rows),
               MP_EINVAL);
  cr_expect(writes > 1, "one write only: %d", writes);
  fclose(f);
}

Test(report_markdown_write_failed, a_full_disk, .init = fill) {
  FILE *f = fopen("/dev/full", "w");
  cr_assert_not_null(f);
  /* Unbuffered: every write fails at once and fclose has nothing left to
   * flush, so it succeeds. */
  cr_assert_eq(setvbuf(f, NULL, _IONBF, 0), 0);
  cr_expect_eq(mpb_report_markdown(f, rows, 1), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "failed") != NULL, "%s", mp_last_error());
  cr_expect_eq(fclose(f), 0, "fclose saw it after all");
}

Test(report_markdown_write_failed, a_good_stream_is_ok, .init = fill) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  cr_assert_not_null(f);
  cr_expect_eq(mpb_report_markdown(f, rows, sizeof rows / sizeof *rows), MP_OK);
  fclose(f);
  cr_expect_not_null(strstr(buf, "| workload-39 | pool"));
  free(buf);
}
