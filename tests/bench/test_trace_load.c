/* Loading a trace file: what is not a trace is refused at its first bad
 * line (a device, a pipe of binary data, a line no trace has) instead of
 * being read to its end, with the file and line in the message; a header
 * behind a UTF-8 byte order mark is a header. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "mpbench.h"

#define HEADER "Thread,Time,Action,Pointer,Size,Stream\n"
#define ROW    "1,15:47:02.841961,allocate,0x7f2c8a000000,4096,0\n"

static char path[64];

static void write_file(const void *head, size_t n, char fill, size_t nfill) {
  strcpy(path, "/tmp/mp_trace_load_XXXXXX");
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  FILE *f = fdopen(fd, "wb");
  cr_assert_not_null(f);
  fwrite(head, 1, n, f);
  for (size_t i = 0; i < nfill; i++)
    fputc(fill, f);
  fclose(f);
}

static void expect_refused(const char *where, const char *words) {
  mpb_workload_t w;
  cr_assert_eq(mpb_trace_load(path, "t", &w), MP_EINVAL, "accepted %s", path);
  char at[96];
  snprintf(at, sizeof at, "%s:%s", path, where);
  cr_expect(strstr(mp_last_error(), at) != NULL, "'%s' lacks '%s'",
            mp_last_error(), at);
  cr_expect(strstr(mp_last_error(), words) != NULL, "'%s' lacks '%s'",
            mp_last_error(), words);
  unlink(path);
}

Test(trace_load, a_device_of_zeros_is_refused_at_line_one) {
  mpb_workload_t w;
  cr_assert_eq(mpb_trace_load("/dev/zero", "z", &w), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "/dev/zero:1:") != NULL, "%s",
            mp_last_error());
}

Test(trace_load, nul_bytes_after_a_good_header_stop_the_read_at_their_line) {
  write_file(HEADER ROW, strlen(HEADER ROW), '\0', 1 << 20);
  expect_refused("3:", "NUL byte");
}

Test(trace_load, a_line_no_trace_has_stops_the_read_at_its_line) {
  write_file(HEADER ROW ROW, strlen(HEADER ROW ROW), 'x', 1 << 20);
  expect_refused("4:", "longer than");
}

Test(trace_load, binary_header_is_shown_printable) {
  write_file("\x01\x02\xff\xfe garbage\n", 13, 'y', 0);
  expect_refused("1:", "found '??");
}

Test(trace_load, utf8_byte_order_mark_before_the_header_is_accepted) {
  const char text[] = "\xEF\xBB\xBF" HEADER ROW
                      "1,15:47:02.841990,free,0x7f2c8a000000,4096,0\n";
  write_file(text, sizeof text - 1, 0, 0);
  mpb_workload_t w;
  cr_assert_eq(mpb_trace_load(path, "bom", &w), MP_OK, "%s", mp_last_error());
  cr_expect_eq(w.n, 2);
  cr_expect_eq(w.ev[0].size, 4096);
  mpb_workload_free(&w);
  unlink(path);
}
