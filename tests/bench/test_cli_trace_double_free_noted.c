/* A double free in a trace (a second free of a block, its address not
 * allocated again between) is skipped and noted as one, with where the
 * first was: its line and the first free's (from a snapshot, both trace
 * entries with their dicts' bytes), in results.md, on stdout and in
 * results.json (trace_double_frees, trace_first_double_free). Before, it
 * was counted as a free of a never-allocated pointer (a log that began
 * mid-run), which says nothing of what is wrong with the trace, nor where.
 * A free of a pointer never allocated, and the late free of a block that
 * an allocation of its live address replaced (threads logged out of
 * order), are still counted as such. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_files.h"
#include "cli_run.h"
#include "mpbench.h"

#define HEADER "Thread,Time,Action,Pointer,Size,Stream\n"
#define ROW(action, ptr, size)                                                 \
  "0,00:00:00.000001," action "," ptr "," size ",0\n"

static char out[256], stdout_path[256];

/* mpbench replay of a trace file named name holding len bytes of text:
 * its exit status; results.md, results.json and stdout read back through
 * got(). */
static int replay(const char *name, const char *text, size_t len) {
  char trace[256];
  snprintf(trace, sizeof trace, "%s/%s", scratch_dir(), name);
  FILE *f = fopen(trace, "wb");
  cr_assert_not_null(f);
  cr_assert_eq(fwrite(text, 1, len, f), len);
  cr_assert_eq(fclose(f), 0);
  snprintf(out, sizeof out, "%s/out", scratch_dir());
  snprintf(stdout_path, sizeof stdout_path, "%s/stdout", scratch_dir());
  const char *args[] = {"replay",      "--out",         out,        "--quiet",
                        "--no-plots",  "--no-capacity", "--device", "host",
                        "--allocator", "pool",          trace,      NULL};
  char err[4096];
  int rc = mpb_test_run_err(args, stdout_path, err, sizeof err);
  cr_expect_eq(rc, 0, "%s", err);
  return rc;
}

/* A copy of out/name (or of stdout for "stdout"), freed by the caller. */
static char *got(const char *name) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", strcmp(name, "stdout") ? out : scratch_dir(),
           name);
  return strdup(slurp(p));
}

/* Whether json has "key": value, as results.json writes it. */
static bool has(const char *json, const char *key, const char *value) {
  char k[128];
  snprintf(k, sizeof k, "\"%s\": %s", key, value);
  return strstr(json, k) != NULL;
}

Test(cli_trace_double_free_noted, a_csv_trace, .init = scratch_make,
     .fini = scratch_drop) {
  static const char text[] =
      HEADER ROW("allocate", "0x1000", "4096") ROW("allocate", "0x2000", "512")
          ROW("free", "0x1000", "4096") ROW("free", "0x2000", "0")
              ROW("free", "0x1000", "0") ROW("free", "0x2000", "512");
  cr_assert_eq(replay("t.csv", text, sizeof text - 1), 0);
  const char *note = "- t: 2 double frees skipped (a second free of a block, "
                     "its address not allocated again between), the first "
                     "at line 6 (freed by line 4)\n";
  char *md = got("results.md"), *so = got("stdout"),
       *json = got("results.json");
  cr_expect_not_null(strstr(md, note), "%s", md);
  cr_expect_not_null(strstr(so, note), "%s", so);
  /* Not as frees of pointers the trace never allocated. */
  cr_expect_null(strstr(md, "never-allocated"), "%s", md);
  cr_expect(has(json, "trace_double_frees", "2,"), "%s", json);
  cr_expect(has(json, "trace_unknown_frees", "0,"), "%s", json);
  cr_expect_not_null(strstr(json, "\"trace_first_double_free\": \"line 6 "
                                  "(freed by line 4)\""),
                     "%s", json);
  free(md);
  free(so);
  free(json);
}

Test(cli_trace_double_free_noted, unknown_and_late_frees_are_not_double,
     .init = scratch_make, .fini = scratch_drop) {
  /* Reused after its free; a pointer never allocated; an allocation of a
   * live address, whose own free comes after the one that ends it. */
  static const char text[] = HEADER ROW("allocate", "0x1000", "4096")
      ROW("free", "0x1000", "4096") ROW("allocate", "0x1000", "64")
          ROW("free", "0x1000", "64") ROW("free", "0x5000", "0")
              ROW("allocate", "0x3000", "128") ROW("allocate", "0x3000", "256")
                  ROW("free", "0x3000", "0") ROW("free", "0x3000", "0");
  cr_assert_eq(replay("t.csv", text, sizeof text - 1), 0);
  char *json = got("results.json");
  cr_expect(has(json, "trace_double_frees", "0,"), "%s", json);
  cr_expect(has(json, "trace_unknown_frees", "2,"), "%s", json);
  cr_expect(has(json, "trace_implicit_frees", "1,"), "%s", json);
  cr_expect_not_null(strstr(json, "\"trace_first_double_free\": null"), "%s",
                     json);
  free(json);
}

/* {"action": ACTION, "addr": 16, "size": 8}: n, the action's length. */
#define PK_ENTRY(n, action)                                                    \
  "}(\x8c\x06"                                                                 \
  "action\x8c" n action "\x8c\x04"                                             \
  "addrK\x10\x8c\x04"                                                          \
  "sizeK\x08u"

Test(cli_trace_double_free_noted, a_snapshot_names_both_entries,
     .init = scratch_make, .fini = scratch_drop) {
  /* {"device_traces": [[alloc, free_completed, free_completed]]}: the
   * entries' dicts begin at bytes 21, 55 and 98. */
  static const char pk[] = "\x80\x04}\x8c\x0d"
                           "device_traces]](" PK_ENTRY("\x05", "alloc")
                               PK_ENTRY("\x0e", "free_completed")
                                   PK_ENTRY("\x0e", "free_completed") "eas.";
  cr_assert_eq(replay("s.pickle", pk, sizeof pk - 1), 0);
  char *md = got("results.md");
  cr_expect_not_null(
      strstr(
          md,
          "- s.pickle: 1 double frees skipped (a second free of a block, its "
          "address not allocated again between), the first at "
          "device_traces[0] entry 2 (the dict at byte 98) (freed by "
          "device_traces[0] entry 1 (the dict at byte 55))\n"),
      "%s", md);
  free(md);
}
