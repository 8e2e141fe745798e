/* The RMM-style CSV parser: good traces become the right events, bad ones
 * fail with the file and line number and leave nothing behind. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpbench.h"

#define HEADER "Thread,Time,Action,Pointer,Size,Stream\n"

/* A snapshot pickle's start, {"device_traces": [[{"action": "alloc",
 * "addr": 16, "size": 8}, with the entries a test adds after it, and its
 * end (]]}). */
#define PK_ALLOC_16_8                                                          \
  "\x80\x04}\x8c\x0d"                                                          \
  "device_traces]](}(\x8c\x06"                                                 \
  "action\x8c\x05"                                                             \
  "alloc\x8c\x04"                                                              \
  "addrK\x10\x8c\x04"                                                          \
  "sizeK\x08u"
#define PK_END "eas."

static mp_status_t parse(const char *text, mpb_workload_t *w) {
  return mpb_trace_parse(text, strlen(text), "t.csv", "t", w);
}

/* Parses text, which must be accepted, into *w. */
static void parse_ok(const char *text, mpb_workload_t *w) {
  cr_assert_eq(parse(text, w), MP_OK, "%s", mp_last_error());
}

/* Expects event i of w to be op of size bytes. */
static void expect_event(const mpb_workload_t *w, size_t i, int op,
                         size_t size) {
  cr_assert_lt(i, w->n);
  cr_expect_eq(w->ev[i].op, op, "event %zu", i);
  cr_expect_eq(w->ev[i].size, size, "event %zu", i);
}

/* Expects a parse failure whose message names t.csv and the line. */
static void expect_bad(const char *text, int line, const char *words) {
  mpb_workload_t w;
  cr_assert_eq(parse(text, &w), MP_EINVAL, "accepted: %s", text);
  char where[32];
  snprintf(where, sizeof where, "t.csv:%d:", line);
  cr_expect(strstr(mp_last_error(), where) != NULL, "'%s' lacks '%s'",
            mp_last_error(), where);
  cr_expect(strstr(mp_last_error(), words) != NULL, "'%s' lacks '%s'",
            mp_last_error(), words);
  cr_expect_eq(w.n, 0);
  cr_expect_null(w.ev);
}

Test(trace_parse, good_trace_becomes_slot_events_with_reuse_and_streams) {
  const char *text =
      HEADER "1,15:47:02.841961,allocate,0x7f2c8a000000,4194304,0\n"
             "1,15:47:02.841970,allocate,0x7f2c8b000000,1024,7\n"
             "2,15:47:02.841990,free,0x7f2c8a000000,4194304,0\n"
             /* The same address again after its free: a new allocation. */
             "1,15:47:02.842000,allocate,0x7f2c8a000000,512,7\n"
             "1,15:47:02.842010,free,0x7f2c8b000000,1024,7\n";
  mpb_workload_t w;
  cr_assert_eq(parse(text, &w), MP_OK, "%s", mp_last_error());
  /* 5 rows, plus the free of the block still live at the end. */
  cr_assert_eq(w.n, 6);
  cr_expect_eq(w.ev[0].op, MPB_ALLOC);
  cr_expect_eq(w.ev[0].size, 4194304);
  cr_expect_eq(w.ev[0].stream, 0);
  cr_expect_eq(w.ev[1].stream, 1); /* stream 7: the first non-default */
  cr_expect_eq(w.ev[2].op, MPB_FREE);
  cr_expect_eq(w.ev[2].slot, w.ev[0].slot);
  cr_expect_eq(w.ev[2].size, 4194304);
  cr_expect_eq(w.ev[3].op, MPB_ALLOC);
  cr_expect_eq(w.ev[3].size, 512);
  cr_expect_eq(w.ev[4].slot, w.ev[1].slot);
  cr_expect_eq(w.ev[5].op, MPB_FREE);
  cr_expect_eq(w.ev[5].slot, w.ev[3].slot);
  cr_expect_eq(w.nstreams, 2);
  cr_expect_eq(w.nslots, 2);
  cr_expect_eq(w.unknown_frees, 0);
  mpb_workload_free(&w);
}

/* A stream is a decimal or a hex handle, the 0x in either case (as a
 * pointer's): the three rows name one stream. 0X was refused before. */
Test(trace_parse, a_stream_in_hex_is_the_same_stream_whatever_the_case_of_0x) {
  const char *text = HEADER "1,00:00:00.000001,allocate,0x1000,64,0x1F\n"
                            "1,00:00:00.000002,allocate,0x2000,64,0X1f\n"
                            "1,00:00:00.000003,allocate,0x3000,64,31\n";
  mpb_workload_t w;
  cr_assert_eq(parse(text, &w), MP_OK, "%s", mp_last_error());
  cr_expect_eq(w.ev[0].stream, w.ev[1].stream);
  cr_expect_eq(w.ev[1].stream, w.ev[2].stream);
  cr_expect_eq(w.ev[0].stream, 1, "stream 31: the first non-default");
  mpb_workload_free(&w);
  expect_bad(HEADER "1,00:00:00.000001,allocate,0x10,8,0xg\n", 2, "0x7f00");
}

/* Streams are numbered 1 up in the order the trace first names them,
 * through the last of the MPB_MAX_TRACE_STREAMS a trace may name; a row
 * naming a stream seen before gets its number, and one more new stream is
 * refused with its line. */
Test(trace_parse, streams_numbered_in_order_of_first_use_up_to_the_limit) {
  enum { N = MPB_MAX_TRACE_STREAMS };
  size_t cap = (size_t)(N + 8) * 64, len = 0;
  char *text = malloc(cap);
  cr_assert_not_null(text);
  len += (size_t)snprintf(text + len, cap - len, HEADER);
  /* Stream handles far apart, as pointers are: 0x7f0000000000 + 4096 k. */
  for (unsigned k = 0; k < N; k++)
    len += (size_t)snprintf(
        text + len, cap - len, "1,00:00:00.000001,allocate,%#x,64,%#llx\n",
        0x1000 + 0x100 * k, 0x7f0000000000ull + 4096ull * k);
  /* The 1000th stream again. */
  len += (size_t)snprintf(text + len, cap - len,
                          "1,00:00:00.000002,allocate,0x10000000,64,%#llx\n",
                          0x7f0000000000ull + 4096ull * 999);
  mpb_workload_t w;
  cr_assert_eq(mpb_trace_parse(text, len, "t.csv", "t", &w), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(w.nstreams, N + 1, "the default stream and %d more", N);
  cr_expect_eq(w.ev[0].stream, 1);
  cr_expect_eq(w.ev[999].stream, 1000);
  cr_expect_eq(w.ev[N - 1].stream, N);
  cr_expect_eq(w.ev[N].stream, 1000, "a stream seen before");
  mpb_workload_free(&w);
  len += (size_t)snprintf(text + len, cap - len,
                          "1,00:00:00.000003,allocate,0x20000000,64,0x1\n");
  cr_assert_eq(mpb_trace_parse(text, len, "t.csv", "t", &w), MP_EINVAL);
  char where[32];
  snprintf(where, sizeof where, "t.csv:%d:", N + 3);
  cr_expect(strstr(mp_last_error(), where) != NULL, "%s", mp_last_error());
  char limit[40];
  snprintf(limit, sizeof limit, "more than %d streams", N);
  cr_expect(strstr(mp_last_error(), limit) != NULL, "%s", mp_last_error());
  free(text);
}

Test(trace_parse, skips_failures_unknown_frees_and_nil_frees_and_counts) {
  const char *text = HEADER
      "1,00:00:00.000001,free,0x1000,64,0\n" /* allocated before the log */
      "1,00:00:00.000002,allocate failure,(nil),1099511627776,0\n"
      "1,00:00:00.000003,free,(nil),0,0\n"
      "1,00:00:00.000004,allocate,0x2000,64,0\r\n" /* CRLF is fine */
      "\n"
      "1,00:00:00.000005,allocate,0x2000,128,0\n" /* live address again */
      "1,00:00:00.000006,free,0x2000,128,0\n";
  mpb_workload_t w;
  cr_assert_eq(parse(text, &w), MP_OK, "%s", mp_last_error());
  cr_expect_eq(w.unknown_frees, 1);
  cr_expect_eq(w.failure_rows, 1);
  cr_expect_eq(w.implicit_frees, 1);
  /* alloc 64, (implicit) free 64, alloc 128, free 128 */
  cr_assert_eq(w.n, 4);
  cr_expect_eq(w.ev[1].op, MPB_FREE);
  cr_expect_eq(w.ev[1].size, 64);
  cr_expect_eq(w.ev[2].size, 128);
  cr_expect_eq(w.ev[3].slot, w.ev[2].slot);
  mpb_workload_free(&w);
}

/* A free names its block's size (as RMM's log and the shim's recording
 * do), or 0 where the log does not know it (cudaFree takes no size): any
 * other size says the rows do not go together, and was replayed silently
 * with the allocation's size. */
Test(trace_parse, a_free_whose_size_is_not_its_allocations_names_its_line) {
  expect_bad(HEADER "1,00:00:00.000001,allocate,0x1000,4096,0\n"
                    "1,00:00:00.000002,allocate,0x9000,64,0\n"
                    "1,00:00:00.000003,free,0x1000,8192,0\n",
             4, "free of 0x1000 gives 8192 bytes");
  cr_expect(strstr(mp_last_error(), "allocated with 4096") != NULL, "%s",
            mp_last_error());
  /* After a reuse of the address, the size is the new allocation's. */
  expect_bad(HEADER "1,00:00:00.000001,allocate,0x1000,4096,0\n"
                    "1,00:00:00.000002,free,0x1000,4096,0\n"
                    "1,00:00:00.000003,allocate,0x1000,512,0\n"
                    "1,00:00:00.000004,free,0x1000,4096,0\n",
             5, "allocated with 512");
  /* The same size, or 0, is the block's free. */
  mpb_workload_t w;
  parse_ok(HEADER "1,00:00:00.000001,allocate,0x1000,4096,0\n"
                  "1,00:00:00.000002,allocate,0x2000,64,0\n"
                  "1,00:00:00.000003,free,0x1000,4096,0\n"
                  "1,00:00:00.000004,free,0x2000,0,0\n",
           &w);
  cr_assert_eq(w.n, 4);
  expect_event(&w, 3, MPB_FREE, 64);
  mpb_workload_free(&w);
  /* A snapshot's free_completed the same way, named as its entry:
   * {"device_traces": [[{"action": "alloc", "addr": 16, "size": 8},
   * {"action": "free_completed", "addr": 16, "size": 9}]]}. */
  static const char pk[] = PK_ALLOC_16_8 "}(\x8c\x06"
                                         "action\x8c\x0e"
                                         "free_completed\x8c\x04"
                                         "addrK\x10\x8c\x04"
                                         "sizeK\x09u" PK_END;
  cr_assert_eq(mpb_snapshot_parse(pk, sizeof pk - 1, "s.pickle", "s", &w),
               MP_EINVAL, "%s", mp_last_error());
  cr_expect(strstr(mp_last_error(), "entry 1") != NULL, "%s", mp_last_error());
  cr_expect(strstr(mp_last_error(), "gives 9 bytes") != NULL, "%s",
            mp_last_error());
  cr_expect_null(w.ev);
}

/* A free of (nil) is free(NULL), which frees nothing and so has no size:
 * with one, the row names a block it does not have (no shared trace has
 * a free of (nil); the shim records only frees of blocks it found). It
 * was skipped as free(NULL). */
Test(trace_parse, a_nil_free_with_a_size_names_its_line) {
  expect_bad(HEADER "1,00:00:00.000001,allocate,0x1000,4096,0\n"
                    "1,00:00:00.000002,free,(nil),0,0\n"
                    "1,00:00:00.000003,free,(nil),4096,0\n",
             4, "free of 4096 bytes at pointer (nil)");
  expect_bad(HEADER "1,00:00:00.000001,allocate,0x1000,4096,0\n"
                    "1,00:00:00.000002,free,0x0,1,0\n",
             3, "(nil)");
}

/* An "allocate failure" row's pointer is not checked: PyTorch records an
 * out-of-memory entry ("oom") with the device's free bytes in its addr
 * field (CUDACachingAllocator.cpp: record_trace(TraceEntry::OOM,
 * device_free, ...)), which the snapshot reader writes as the row's
 * pointer. Such a snapshot loads, its oom counted as a failure row:
 * {"device_traces": [[{"action": "alloc", "addr": 16, "size": 8},
 * {"action": "oom", "addr": 1073741824, "size": 32}]]}. */
Test(trace_parse, an_oom_entry_with_the_devices_free_bytes_is_a_failure_row) {
  static const char pk[] = PK_ALLOC_16_8 "}(\x8c\x06"
                                         "action\x8c\x03"
                                         "oom\x8c\x04"
                                         "addrJ\x00\x00\x00\x40\x8c\x04"
                                         "sizeK\x20u" PK_END;
  mpb_workload_t w;
  cr_assert_eq(mpb_snapshot_parse(pk, sizeof pk - 1, "s.pickle", "s", &w),
               MP_OK, "%s", mp_last_error());
  cr_expect_eq(w.failure_rows, 1);
  /* The allocation, and its free at the end. */
  cr_assert_eq(w.n, 2);
  expect_event(&w, 0, MPB_ALLOC, 8);
  mpb_workload_free(&w);
}

Test(trace_parse, bad_header_is_line_1) {
  expect_bad("Thread,Time,Action,Pointer,Size\n", 1, "header");
  expect_bad("1,00:00:00.000001,allocate,0x10,8,0\n", 1, "header");
}

/* The preload shim writes a Chrome/Perfetto JSON trace for a MEMPOOL_TRACE
 * path ending in .json; given to mpbench it was refused as a CSV whose
 * header is wrong, with nothing saying which trace mpbench replays. */
Test(trace_parse, a_json_trace_is_refused_naming_the_csv_one) {
  expect_bad("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"
             "{\"name\":\"allocate\",\"ph\":\"i\"}]}\n",
             1, "JSON");
  cr_expect(strstr(mp_last_error(), "MEMPOOL_TRACE") != NULL, "%s",
            mp_last_error());
  expect_bad("  [\n]\n", 1, "JSON");
}

Test(trace_parse, empty_file_is_einval) {
  mpb_workload_t w;
  cr_assert_eq(parse("", &w), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "t.csv") != NULL, "%s", mp_last_error());
}

Test(trace_parse, bad_rows_name_their_line) {
  expect_bad(HEADER "1,00:00:00.000001,allocate,0x10,8,0\n"
                    "1,00:00:00.000002,allocate,0x20,8\n",
             3, "6 comma-separated");
  expect_bad(HEADER "x,00:00:00.000001,allocate,0x10,8,0\n", 2, "thread");
  expect_bad(HEADER "1,00:00:00,allocate,0x10,8,0\n", 2, "time");
  expect_bad(HEADER "1,00:61:00.000001,allocate,0x10,8,0\n", 2, "time");
  expect_bad(HEADER "1,00:00:00.000001,alloc,0x10,8,0\n", 2, "action");
  expect_bad(HEADER "1,00:00:00.000001,allocate,0xZZ,8,0\n", 2, "pointer");
  expect_bad(HEADER "1,00:00:00.000001,allocate,0x10,-8,0\n", 2, "size");
  expect_bad(HEADER "1,00:00:00.000001,allocate,0x10,8,s\n", 2, "stream");
  expect_bad(HEADER "\n\n1,00:00:00.000001,allocate,(nil),8,0\n", 4, "(nil)");
}

Test(trace_parse, live_bytes_past_the_address_space_name_their_line) {
  /* Each size alone fits a size_t; the two live together do not. */
  expect_bad(HEADER "1,00:00:00.000001,allocate,0x10,9223372036854775808,0\n"
                    "1,00:00:00.000002,allocate,0x20,9223372036854775808,0\n",
             3, "live bytes");
}

Test(trace_parse, sizes_that_fit_once_freed_are_fine) {
  mpb_workload_t w;
  parse_ok(HEADER "1,00:00:00.000001,allocate,0x10,9223372036854775808,0\n"
                  "1,00:00:00.000002,free,0x10,9223372036854775808,0\n"
                  "1,00:00:00.000003,allocate,0x20,9223372036854775808,0\n"
                  "1,00:00:00.000004,allocate,0x20,9223372036854775808,0\n",
           &w);
  cr_expect_eq(w.implicit_frees, 1);
  mpb_workload_free(&w);
}

Test(trace_parse, a_trace_with_nothing_to_replay_is_einval) {
  const char *texts[] = {HEADER, "Thread,Time,Action,Pointer,Size,Stream",
                         HEADER
                         "1,00:00:00.000001,free,0x1000,64,0\n"
                         "1,00:00:00.000002,allocate failure,(nil),64,0\n"
                         "1,00:00:00.000003,allocate,(nil),0,0\n"
                         "1,00:00:00.000004,allocate,0x10,0,0\n"};
  for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
    mpb_workload_t w;
    cr_expect_eq(parse(texts[i], &w), MP_EINVAL, "accepted: %s", texts[i]);
    cr_expect(strstr(mp_last_error(), "t.csv: no allocation") != NULL, "%s",
              mp_last_error());
    cr_expect_null(w.ev);
  }
}

Test(trace_parse, missing_file_is_einval_naming_it) {
  mpb_workload_t w;
  cr_assert_eq(mpb_trace_load("/nonexistent/x.csv", "x", &w), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "/nonexistent/x.csv") != NULL, "%s",
            mp_last_error());
}

Test(trace_parse, real_traces_load_and_end_empty) {
  const char *dir = getenv("MEMPOOL_TEST_TRACES");
  cr_assert_not_null(dir, "MEMPOOL_TEST_TRACES is not set");
  char path[4096];
  snprintf(path, sizeof path, "%s/pytorch/select_n_04d383c_llama.csv", dir);
  mpb_workload_t w;
  cr_assert_eq(mpb_trace_load(path, "llama", &w), MP_OK, "%s", mp_last_error());
  size_t live = 0, allocs = 0;
  for (size_t i = 0; i < w.n; i++) {
    if (w.ev[i].op == MPB_ALLOC) {
      live += w.ev[i].size;
      allocs++;
    } else {
      live -= w.ev[i].size;
    }
  }
  cr_expect_eq(live, 0);
  cr_expect_eq(allocs * 2, w.n);
  cr_expect_gt(w.nstreams, 1, "this trace uses several streams");
  mpb_workload_free(&w);
}

/* Every shared trace loads: what real traces legitimately hold is not
 * refused (see the test below). */
Test(trace_parse, every_shared_trace_loads) {
  const char *dir = getenv("MEMPOOL_TEST_TRACES");
  cr_assert_not_null(dir, "MEMPOOL_TEST_TRACES is not set");
  char **files;
  size_t n;
  cr_assert_eq(mpb_traces_scan(dir, &files, &n, NULL, NULL), MP_OK, "%s",
               mp_last_error());
  cr_expect_geq(n, 13, "the PyTorch runs and the MindSpore plans");
  for (size_t i = 0; i < n; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    mpb_workload_t w;
    cr_expect_eq(mpb_trace_load(path, files[i], &w), MP_OK, "%s",
                 mp_last_error());
    mpb_workload_free(&w);
  }
  mpb_traces_free(files, n);
}

/* A pointer names a block; it is not checked as a range of memory. The
 * MindSpore plans give each tensor an id 4 KiB above the last whatever its
 * size, so the ranges of live tensors overlap by design (535 to 16 310
 * allocations in each plan); and a converted PyTorch run carries times out
 * of order (cs336_magma27: a block live before recording began is at
 * time 0). Both replay as written, in row order. */
Test(trace_parse, overlapping_ranges_and_times_out_of_order_replay_as_written) {
  mpb_workload_t w;
  parse_ok(HEADER "1,00:00:00.000002,allocate,0x10000000,131072,0\n"
                  "1,00:00:00.000001,allocate,0x10001000,131072,0\n"
                  "1,00:00:00.000000,free,0x10000000,131072,0\n"
                  "1,00:00:00.000003,allocate,0x10000800,64,0\n",
           &w);
  /* 4 rows, and the frees of the two blocks live at the end. */
  cr_assert_eq(w.n, 6);
  expect_event(&w, 1, MPB_ALLOC, 131072);
  expect_event(&w, 2, MPB_FREE, 131072);
  cr_expect_eq(w.ev[2].slot, w.ev[0].slot);
  expect_event(&w, 3, MPB_ALLOC, 64);
  cr_expect_eq(w.implicit_frees, 0);
  mpb_workload_free(&w);
}

/* Whether s has a byte a terminal would take for a control (below 0x20,
 * DEL, or above). */
static bool has_control(const char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f)
      return true;
  return false;
}

/* A bad field is quoted in the message with what a terminal would act on
 * (escape sequences: a hostile trace could retitle or clear the terminal
 * the message is printed to) shown as '?', as the header already is. */
Test(trace_parse, control_bytes_of_a_bad_field_are_shown_as_question_marks) {
  expect_bad(HEADER "1,00:00:00.000001,\x1b]0;owned\x07,0x10,8,0\n", 2,
             "bad action '?]0;owned?'");
  cr_expect_not(has_control(mp_last_error()), "%s", mp_last_error());
  expect_bad(HEADER "1,00:00:00.000001,allocate,0x10,8\xc3\xa9,0\n", 2,
             "bad size '8?\?'");
  cr_expect_not(has_control(mp_last_error()), "%s", mp_last_error());
  /* The same in a snapshot's action: {"device_traces": [[{"action":
   * "alloc", "addr": 16, "size": 8}, {"action": "\x1b[2J"}]]}. */
  static const char pk[] = PK_ALLOC_16_8 "}(\x8c\x06"
                                         "action\x8c\x04\x1b[2Ju" PK_END;
  mpb_workload_t w;
  cr_assert_eq(mpb_snapshot_parse(pk, sizeof pk - 1, "s.pickle", "s", &w),
               MP_EINVAL, "%s", mp_last_error());
  cr_expect(strstr(mp_last_error(), "unknown action '?[2J'") != NULL, "%s",
            mp_last_error());
  cr_expect_not(has_control(mp_last_error()), "%s", mp_last_error());
}
