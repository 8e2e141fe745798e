/* test_preload_trace_write_cut_short.c - a trace row (MEMPOOL_TRACE, the
 * CSV) that a failed write(2) cut short (a full disk, a file size limit:
 * part written, then ENOSPC or EFBIG) leaves every line of the trace
 * whole: in a file that can be cut back, the part written is cut off and
 * the row dropped whole; where it cannot (ftruncate refused here, as a
 * pipe refuses it), the next row starts with the newline that ends the
 * cut line. Before, the part stayed without its newline and the next row
 * written ran on in the same line: a line with the fields of two rows,
 * which a replay rejects (API.md, "A replay rejects a malformed line"),
 * the next row lost with it.
 *
 * The cut is made with RLIMIT_FSIZE (SIGXFSZ ignored: write(2) takes
 * what fits, then fails with EFBIG), lifted again for the next row. The
 * shim's sources run in this process on the fake driver; ftruncate is
 * wrapped (-Wl,--wrap) to refuse when asked. */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "in_process.h"

int __real_ftruncate(int fd, off_t length);
int __wrap_ftruncate(int fd, off_t length);

static int refuse_truncate; /* 1: ftruncate refused, as a pipe's */

int __wrap_ftruncate(int fd, off_t length) {
  if (refuse_truncate) {
    errno = EINVAL;
    return -1;
  }
  return __real_ftruncate(fd, length);
}

static char trace_path[96];

static void traced(void) {
  mp_in_process_trace_to(trace_path, sizeof trace_path, "cut");
  mp_in_process_cuda();
}

static void untraced(void) {
  unlink(trace_path);
}

static off_t trace_size(void) {
  struct stat st;
  cr_assert_eq(stat(trace_path, &st), 0, "%s", strerror(errno));
  return st.st_size;
}

static const uintptr_t first = 0x7f0000100000, cut = 0x7f0000200000,
                       next = 0x7f0000300000;

/* Row `first` traced whole, row `cut` cut short after 10 bytes by the
 * file size limit, row `next` traced with the limit lifted. */
static void rows_with_one_cut(void) {
  cr_assert_neq(signal(SIGXFSZ, SIG_IGN), SIG_ERR);
  mp__pl_record_alloc(first, 4096, 0, true);
  struct rlimit was;
  cr_assert_eq(getrlimit(RLIMIT_FSIZE, &was), 0);
  struct rlimit cap = was;
  cap.rlim_cur = (rlim_t)trace_size() + 10; /* a row is longer */
  cr_assert(was.rlim_max == RLIM_INFINITY || cap.rlim_cur <= was.rlim_max);
  cr_assert_eq(setrlimit(RLIMIT_FSIZE, &cap), 0);
  mp__pl_record_alloc(cut, 4096, 0, true);
  cr_assert_eq(setrlimit(RLIMIT_FSIZE, &was), 0);
  mp__pl_record_alloc(next, 4096, 0, true);
}

/* The trace ends with a newline, no line has more fields than the
 * header's six, one has fewer where cut_ok (the cut row, its line ended)
 * and none otherwise, and the rows of first and next are lines of their
 * own. */
static void lines_whole(bool cut_ok) {
  FILE *f = fopen(trace_path, "r");
  cr_assert_not_null(f);
  char text[8192];
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = '\0';
  fclose(f);
  cr_assert_gt(n, 0);
  cr_expect_eq(text[n - 1], '\n', "the trace ends in a cut line:\n%s", text);
  int short_rows = 0, lines = 0;
  bool saw_first = false, saw_next = false;
  char want_first[64], want_next[64];
  snprintf(want_first, sizeof want_first, ",allocate,%#lx,4096,0",
           (unsigned long)first);
  snprintf(want_next, sizeof want_next, ",allocate,%#lx,4096,0",
           (unsigned long)next);
  for (char *line = strtok(text, "\n"); line != NULL;
       line = strtok(NULL, "\n"), lines++) {
    int commas = 0;
    for (const char *c = line; *c != '\0'; c++)
      commas += *c == ',';
    cr_expect_leq(commas, 5, "line %d runs two rows together: '%s'", lines + 1,
                  line);
    short_rows += commas < 5;
    size_t len = strlen(line);
    saw_first |= commas == 5 && len > strlen(want_first) &&
                 strcmp(line + len - strlen(want_first), want_first) == 0;
    saw_next |= commas == 5 && len > strlen(want_next) &&
                strcmp(line + len - strlen(want_next), want_next) == 0;
  }
  cr_expect_eq(short_rows, cut_ok ? 1 : 0, "%d cut rows in the trace",
               short_rows);
  cr_expect(saw_first, "the row before the cut one is not a line of its own");
  cr_expect(saw_next, "the row after the cut one is not a line of its own");
  cr_expect_eq(lines, cut_ok ? 4 : 3, "%d lines (header included)", lines);
}

/* Failed before: "line 3 runs two rows together". */
Test(preload_trace_write_cut_short, row_dropped_whole, .init = traced,
     .fini = untraced) {
  rows_with_one_cut();
  lines_whole(false);
}

Test(preload_trace_write_cut_short, line_ended_where_not_cut_back,
     .init = traced, .fini = untraced) {
  refuse_truncate = 1;
  rows_with_one_cut();
  refuse_truncate = 0;
  lines_whole(true);
}
