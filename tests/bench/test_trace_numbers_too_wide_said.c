/* A trace's number of the right form that does not fit is refused as one
 * that does not fit, with its file and line: a size past size_t, a
 * pointer or stream past 64 bits. Before, the message named the form the
 * field already had ("bad size '99999999999999999999' (a decimal
 * number)"). A pointer padded with zeros past 16 digits is the pointer it
 * names (before, it was refused as bad hex). */
#include <criterion/criterion.h>
#include <string.h>

#include "mpbench.h"

#define HEADER "Thread,Time,Action,Pointer,Size,Stream\n"

/* csv refused, its message holding each of what. */
static void expect_refused(const char *csv, const char *what1,
                           const char *what2) {
  mpb_workload_t w;
  mp_status_t st = mpb_trace_parse(csv, strlen(csv), "t.csv", "t", &w);
  cr_assert_eq(st, MP_EINVAL, "%s", mp_last_error());
  cr_expect_not_null(strstr(mp_last_error(), what1), "%s", mp_last_error());
  cr_expect_not_null(strstr(mp_last_error(), what2), "%s", mp_last_error());
}

Test(trace_numbers_too_wide_said, size) {
  expect_refused(HEADER "1,00:00:00.1,allocate,0x1000,99999999999999999999,0\n",
                 "t.csv:2: bad size '99999999999999999999'",
                 "more bytes than this machine's size_t holds");
}

Test(trace_numbers_too_wide_said, pointer) {
  expect_refused(HEADER "1,00:00:00.1,allocate,0x10000000000000000,4096,0\n",
                 "t.csv:2: bad pointer '0x10000000000000000'",
                 "wider than 64 bits");
}

Test(trace_numbers_too_wide_said, stream) {
  expect_refused(HEADER "1,00:00:00.1,allocate,0x1000,4096,"
                        "0x10000000000000000\n",
                 "t.csv:2: bad stream '0x10000000000000000'",
                 "wider than 64 bits");
  expect_refused(HEADER "1,00:00:00.1,allocate,0x1000,4096,"
                        "18446744073709551616\n",
                 "t.csv:2: bad stream '18446744073709551616'",
                 "wider than 64 bits");
}

Test(trace_numbers_too_wide_said, not_numbers_still_said_as_bad_form) {
  expect_refused(HEADER "1,00:00:00.1,allocate,0x1000,-1,0\n",
                 "t.csv:2: bad size '-1'", "(a decimal number)");
  expect_refused(HEADER "1,00:00:00.1,allocate,0xg,4096,0\n",
                 "t.csv:2: bad pointer '0xg'", "hex such as 0x7f00");
}

Test(trace_numbers_too_wide_said, a_pointer_padded_with_zeros) {
  const char *csv =
      HEADER "1,00:00:00.1,allocate,0x00000000000000001000,4096,0\n"
             "1,00:00:00.2,free,0x1000,4096,0\n";
  mpb_workload_t w;
  mp_status_t st = mpb_trace_parse(csv, strlen(csv), "t.csv", "t", &w);
  cr_assert_eq(st, MP_OK, "%s", mp_last_error());
  cr_expect_eq(w.n, 2);
  cr_expect_eq(w.unknown_frees, 0, "the free did not find its block");
  mpb_workload_free(&w);
}
