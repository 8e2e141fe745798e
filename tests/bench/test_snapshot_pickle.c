/* PyTorch memory snapshots (pickles) as mpbench input: pickles written at
 * test time by Python's own pickle module (tests/bench/snapshot_gen.py,
 * protocols 2, 4 and 5) replay with the peak live bytes their events imply;
 * truncated and garbage pickles are refused naming the byte offset; input
 * is recognised by content, not by file name. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpbench.h"

typedef struct expect {
  uint64_t peak_live, allocs, unknown_frees, failures, streams;
} expect_t;

typedef struct blob {
  char *data;
  size_t len;
} blob_t;

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  cr_assert_not_null(buf);
  cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *len = (size_t)n;
  return buf;
}

/* Runs snapshot_gen.py CASE PROTO into a temporary file named name (in a
 * fresh folder); returns the bytes and what the events imply. */
static blob_t gen(const char *c, int proto, const char *name, expect_t *e,
                  char *path, size_t path_len) {
  if (MPB_PYTHON3[0] == '\0')
    cr_skip_test("no python3 to write pickles with");
  char dir[] = "/tmp/mpb_snapXXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  snprintf(path, path_len, "%s/%s", dir, name);
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "'%s' '%s' %s %d '%s'", MPB_PYTHON3,
           MPB_SNAPSHOT_GEN, c, proto, path);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  expect_t x = {0};
  int got = fscanf(
      p,
      "peak_live %" SCNu64 " allocs %" SCNu64 " unknown_frees %" SCNu64
      " failures %" SCNu64 " streams %" SCNu64,
      &x.peak_live, &x.allocs, &x.unknown_frees, &x.failures, &x.streams);
  cr_assert_eq(pclose(p), 0, "%s failed", cmd);
  cr_assert_eq(got, 5, "%s printed no expectations", cmd);
  if (e != NULL)
    *e = x;
  blob_t b;
  b.data = read_file(path, &b.len);
  return b;
}

static void rm_gen(const char *path, blob_t *b) {
  free(b->data);
  unlink(path);
  char dir[256];
  snprintf(dir, sizeof dir, "%s", path);
  *strrchr(dir, '/') = '\0';
  rmdir(dir);
}

/* Peak of the bytes live over the workload's events. */
static size_t events_peak_live(const mpb_workload_t *w, uint64_t *allocs) {
  size_t live = 0, peak = 0;
  *allocs = 0;
  for (size_t i = 0; i < w->n; i++) {
    if (w->ev[i].op == MPB_ALLOC) {
      live += w->ev[i].size;
      (*allocs)++;
    } else {
      live -= w->ev[i].size;
    }
    if (live > peak)
      peak = live;
  }
  cr_expect_eq(live, 0, "the workload does not end empty");
  return peak;
}

static void check_case(const char *c, int proto, bool replay) {
  expect_t e;
  char path[256];
  blob_t b = gen(c, proto, "snap.pickle", &e, path, sizeof path);
  mpb_workload_t w;
  cr_assert_eq(mpb_trace_load(path, "snap", &w), MP_OK, "%s proto %d: %s", c,
               proto, mp_last_error());
  uint64_t allocs;
  cr_expect_eq(events_peak_live(&w, &allocs), e.peak_live, "%s proto %d", c,
               proto);
  cr_expect_eq(allocs, e.allocs, "%s proto %d", c, proto);
  cr_expect_eq(w.unknown_frees, e.unknown_frees);
  cr_expect_eq(w.failure_rows, e.failures);
  cr_expect_eq(w.nstreams, e.streams);
  if (replay) {
    mpb_replay_opts_t o = {.device_spec = "host", .capacity_search = false};
    mpb_result_t *r = calloc(1, sizeof *r);
    cr_assert_eq(mpb_replay(&w, "pool", &o, r), MP_OK, "%s", mp_last_error());
    cr_expect(r->completed, "%s", r->error);
    cr_expect_eq(r->peak_live, e.peak_live);
    cr_expect_geq(r->peak_reserved, e.peak_live);
    free(r);
  }
  mpb_workload_free(&w);
  rm_gen(path, &b);
}

Test(snapshot_pickle, training_trace_replays_with_the_peak_its_events_imply) {
  check_case("train", 2, true);
  check_case("train", 4, false);
  check_case("train", 5, false);
}

Test(snapshot_pickle, legacy_free_requested_counts_when_nothing_completes) {
  check_case("legacy", 2, false);
  check_case("legacy", 5, false);
}

Test(snapshot_pickle, frees_from_before_the_trace_are_counted_and_skipped) {
  check_case("prehistory", 4, false);
}

Test(snapshot_pickle, addresses_above_2_63_and_big_sizes_read_right) {
  check_case("wide", 2, false);
  check_case("wide", 5, false);
}

Test(snapshot_pickle, a_pickle_is_found_by_content_not_by_name) {
  expect_t e;
  char path[256];
  /* A snapshot called .csv is still a snapshot... */
  blob_t b = gen("train", 4, "looks_like.csv", &e, path, sizeof path);
  cr_assert(mpb_snapshot_detect(b.data, b.len));
  mpb_workload_t w;
  cr_assert_eq(mpb_trace_load(path, "x", &w), MP_OK, "%s", mp_last_error());
  uint64_t allocs;
  cr_expect_eq(events_peak_live(&w, &allocs), e.peak_live);
  mpb_workload_free(&w);
  rm_gen(path, &b);
  /* ...and a CSV called .pickle is still a CSV. */
  const char *csv = "Thread,Time,Action,Pointer,Size,Stream\n"
                    "1,00:00:00.000001,allocate,0x1000,4096,0\n";
  cr_expect_not(mpb_snapshot_detect(csv, strlen(csv)));
  char dir[] = "/tmp/mpb_snapXXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/t.pickle", dir);
  FILE *f = fopen(path, "w");
  fputs(csv, f);
  fclose(f);
  cr_assert_eq(mpb_trace_load(path, "y", &w), MP_OK, "%s", mp_last_error());
  cr_expect_eq(w.n, 2);
  mpb_workload_free(&w);
  unlink(path);
  rmdir(dir);
}

/* Every proper prefix of a valid pickle is refused, naming a byte offset
 * inside the file, and leaves the workload empty. */
Test(snapshot_pickle, every_truncation_is_refused_with_its_offset) {
  char path[256];
  blob_t b = gen("train", 4, "t.pickle", NULL, path, sizeof path);
  size_t step = b.len > 4000 ? b.len / 4000 : 1;
  for (size_t n = 1; n < b.len; n += step) {
    mpb_workload_t w;
    mp_status_t st = mpb_snapshot_parse(b.data, n, "t.pickle", "t", &w);
    cr_assert_eq(st, MP_EINVAL, "prefix of %zu bytes accepted", n);
    const char *msg = mp_last_error();
    cr_assert(strstr(msg, "t.pickle: ") == msg, "%s", msg);
    cr_assert(strstr(msg, "byte") != NULL, "prefix %zu: %s", n, msg);
    cr_assert_eq(w.n, 0);
    cr_assert_null(w.ev);
  }
  rm_gen(path, &b);
}

static void expect_refused(const char *bytes, size_t len, const char *words) {
  mpb_workload_t w;
  cr_assert_eq(mpb_snapshot_parse(bytes, len, "g.pickle", "g", &w), MP_EINVAL,
               "accepted %s", words);
  cr_expect(strstr(mp_last_error(), words) != NULL, "'%s' lacks '%s'",
            mp_last_error(), words);
  cr_expect_eq(w.n, 0);
}

Test(snapshot_pickle, garbage_is_refused_with_opcode_and_offset) {
  /* An opcode this reader does not run (GLOBAL, a class): at byte 2. */
  expect_refused("\x80\x04"
                 "cos\nsystem\n.",
                 13, "byte 2: opcode 0x63");
  /* Protocol 1 is not what _dump_snapshot writes. */
  expect_refused("\x80\x01}.", 4, "protocol 1");
  /* SETITEM on a list, and STOP with two values. */
  expect_refused("\x80\x02]K\x01K\x02s.", 9, "byte 7: opcode 's' on a value");
  expect_refused("\x80\x02K\x01K\x02.", 7, "STOP with 2 values");
  /* STOP on a MARK alone: a MARK, not a value (it said "1 values on the
   * stack (1 expected)"). */
  expect_refused("\x80\x04(.", 4, "STOP with a MARK on the stack");
  /* BINGET of a memo slot never stored; BINPUT far out of range. */
  expect_refused("\x80\x02h\x05.", 5, "memo index 5 was never stored");
  expect_refused("\x80\x02Nr\xff\xff\xff\x7f.", 9, "out of range");
  /* A string longer than the file, and a frame longer than the file. */
  expect_refused("\x80\x04X\xff\x00\x00\x00"
                 "ab.",
                 10, "string of 255 bytes");
  expect_refused("\x80\x04\x95\x00\x00\x00\x00\x01\x00\x00\x00}.", 13,
                 "frame at byte 2");
  /* Integers past 64 bits; APPENDS without a mark. */
  expect_refused("\x80\x02\x8a\x0a\x00\x00\x00\x00\x00\x00\x00\x00\x01\x01.",
                 15, "does not fit 64 bits");
  expect_refused("\x80\x02]K\x01"
                 "e.",
                 7, "without a MARK");
  /* Not a pickle at all, and an empty file. */
  expect_refused("Thread", 6, "byte 0 is not the PROTO opcode");
  expect_refused("", 0, "byte 0 is not the PROTO opcode");
}

Test(snapshot_pickle, pickles_that_are_not_snapshots_say_so) {
  char path[256];
  blob_t b = gen("notsnap", 2, "n.pickle", NULL, path, sizeof path);
  mpb_workload_t w;
  cr_expect_eq(mpb_snapshot_parse(b.data, b.len, "n.pickle", "n", &w),
               MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "not a PyTorch memory snapshot"), "%s",
            mp_last_error());
  rm_gen(path, &b);
  b = gen("noalloc", 5, "e.pickle", NULL, path, sizeof path);
  cr_expect_eq(mpb_snapshot_parse(b.data, b.len, "e.pickle", "e", &w),
               MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "no allocation"), "%s", mp_last_error());
  rm_gen(path, &b);
}

/* Bytes flipped anywhere in a valid pickle never crash the reader: each
 * result is a workload that ends empty or a refusal with a message. */
Test(snapshot_pickle, flipped_bytes_are_refused_or_read_never_crash) {
  char path[256];
  blob_t b = gen("train", 4, "f.pickle", NULL, path, sizeof path);
  char *copy = malloc(b.len);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int round = 0; round < 2000; round++) {
    memcpy(copy, b.data, b.len);
    for (int k = 0; k < 3; k++) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      copy[1 + x % (b.len - 1)] = (char)(x >> 40);
    }
    mpb_workload_t w;
    mp_status_t st = mpb_snapshot_parse(copy, b.len, "f.pickle", "f", &w);
    if (st == MP_OK) {
      uint64_t allocs;
      events_peak_live(&w, &allocs);
      mpb_workload_free(&w);
    } else {
      cr_assert_eq(st, MP_EINVAL);
      cr_assert(mp_last_error()[0] != '\0');
      cr_assert_eq(w.n, 0);
    }
  }
  free(copy);
  rm_gen(path, &b);
}

/* An entry the trace rules refuse (here the second allocation of 2^63
 * bytes: more live bytes than a size_t holds) is named as the entry it
 * is, as the pickle's own refusals name theirs, not as "s.pickle:3", a
 * line of the CSV the snapshot is turned into, which no file has. */
Test(snapshot_pickle, a_refused_entry_is_named_by_its_index_not_a_csv_line) {
  static const char p[] =
      "\x80\x02}X\x0d\x00\x00\x00"
      "device_traces]](}(X\x06\x00\x00\x00"
      "actionq\x00X\x05\x00\x00\x00"
      "allocq\x01X\x04\x00\x00\x00"
      "addrq\x02M\x00\x10X\x04\x00\x00\x00sizeq\x03\x8a\x09\x00\x00\x00\x00"
      "\x00\x00\x00\x80\x00u}(h\x00h\x01h\x02M\x00 "
      "h\x03\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00ueas.";
  mpb_workload_t w;
  cr_assert_eq(mpb_snapshot_parse(p, sizeof p - 1, "s.pickle", "s", &w),
               MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "s.pickle: device_traces[0] entry 1 (the "
                                    "dict at byte 88): ") == mp_last_error(),
            "%s", mp_last_error());
  cr_expect(strstr(mp_last_error(), "exceed the address space") != NULL, "%s",
            mp_last_error());
  cr_expect_eq(w.n, 0);
}

/* Appends a BINUNICODE str to the pickle at p; returns the end. */
static char *put_str(char *p, const char *s) {
  size_t n = strlen(s);
  *p++ = 'X';
  for (int i = 0; i < 4; i++)
    *p++ = (char)(n >> (8 * i));
  memcpy(p, s, n);
  return p + n;
}

/* A snapshot whose one trace entry, a dict of `keys` keys ("action":
 * "alloc", "addr": 4096, then "size" (twice when `twice`: 16, then 4096)
 * and pads), stands in the trace `repeats` times through the memo (2
 * bytes a repeat). Its EMPTY_DICT is at byte 24. */
static char *memoized_entry_pickle(size_t keys, size_t repeats, bool twice,
                                   size_t *len) {
  char *buf = malloc(64 + keys * 16 + repeats * 2), *p = buf;
  cr_assert_not_null(buf);
  memcpy(p, "\x80\x02}", 3);
  p = put_str(p + 3, "device_traces");
  memcpy(p, "]](}(", 5);
  p = put_str(p + 5, "action");
  p = put_str(p, "alloc");
  p = put_str(p, "addr");
  memcpy(p, "M\x00\x10", 3);
  p += 3;
  if (twice) {
    p = put_str(p, "size");
    memcpy(p, "K\x10", 2);
    p += 2;
  }
  p = put_str(p, "size");
  memcpy(p, "M\x00\x10", 3);
  p += 3;
  for (size_t k = 3; k < keys; k++) {
    char pad[32];
    snprintf(pad, sizeof pad, "pad%zu", k);
    p = put_str(p, pad);
    memcpy(p, "K\x00", 2);
    p += 2;
  }
  memcpy(p, "uq\x00", 3); /* SETITEMS; BINPUT 0 */
  p += 3;
  for (size_t r = 1; r < repeats; r++) {
    memcpy(p, "h\x00", 2); /* BINGET 0 */
    p += 2;
  }
  memcpy(p, "eas.", 4); /* the trace, into device_traces, into the dict */
  *len = (size_t)(p + 4 - buf);
  return buf;
}

/* Appends a dict {"action": action, "addr": addr, "size": size} (size a
 * BININT, negative if it likes) to the pickle at p; its EMPTY_DICT's byte
 * into *at. Returns the end. */
static char *put_entry(char *buf, char *p, const char *action, uint16_t addr,
                       int32_t size, size_t *at) {
  *at = (size_t)(p - buf);
  memcpy(p, "}(", 2);
  p = put_str(p + 2, "action");
  p = put_str(p, action);
  p = put_str(p, "addr");
  *p++ = 'M';
  *p++ = (char)(addr & 0xff);
  *p++ = (char)(addr >> 8);
  p = put_str(p, "size");
  *p++ = 'J';
  for (int i = 0; i < 4; i++)
    *p++ = (char)((uint32_t)size >> (8 * i));
  *p++ = 'u';
  return p;
}

/* A snapshot of two device traces, the first with no allocation (so the
 * second is replayed), each refusal of an entry of the second names that
 * trace and the byte where the entry's dict is: "device trace entry 1"
 * named neither, and device_traces[0] has an entry 1 too. Both the
 * pickle reader's refusals (a negative size) and the trace rules' (live
 * bytes past a size_t) are checked. */
Test(snapshot_pickle, a_refused_entry_names_its_device_trace_and_byte) {
  static const int32_t bad_size[] = {-5, 0x7fffffff};
  for (int c = 0; c < 2; c++) {
    char buf[512], *p = buf;
    size_t at, bad_at;
    memcpy(p, "\x80\x02}", 3);
    p = put_str(p + 3, "device_traces");
    memcpy(p, "](](", 4); /* device_traces, its items; trace 0, its items */
    p += 4;
    p = put_entry(buf, p, "segment_alloc", 0x1000, 1 << 20, &at);
    p = put_entry(buf, p, "segment_free", 0x1000, 1 << 20, &at);
    memcpy(p, "e](", 3); /* trace 0 done; trace 1 */
    p += 3;
    p = put_entry(buf, p, "alloc", 0x1000, 0x7fffffff, &at);
    if (c == 1) /* 2^62 - 2^29 each: 2^64 - 1 live, a size_t's most */
      for (int k = 0; k < 4; k++) {
        memcpy(p, "}(", 2);
        p = put_str(p + 2, "action");
        p = put_str(p, "alloc");
        p = put_str(p, "addr");
        memcpy(p, "M", 1);
        p[1] = (char)(0x20 + k);
        p[2] = 0x10;
        p = put_str(p + 3, "size");
        memcpy(p, "\x8a\x08\x00\x00\x00\xe0\xff\xff\xff\x3fu", 11);
        p += 11;
      }
    p = put_entry(buf, p, "alloc", 0x3000, bad_size[c], &bad_at);
    memcpy(p, "ees.", 4);
    p += 4;
    mpb_workload_t w;
    cr_assert_eq(
        mpb_snapshot_parse(buf, (size_t)(p - buf), "d.pickle", "d", &w),
        MP_EINVAL, "case %d", c);
    char want[128];
    snprintf(want, sizeof want,
             "d.pickle: device_traces[1] entry %d (the dict at byte %zu): ",
             c == 0 ? 1 : 5, bad_at);
    cr_expect(strstr(mp_last_error(), want) == mp_last_error(),
              "case %d: want '%s', got: %s", c, want, mp_last_error());
    cr_expect_eq(w.n, 0);
  }
}

/* A trace entry has a handful of keys: one of more is refused, naming
 * where its dict is; one of 64 that the memo repeats 1000 times (2 input
 * bytes a repeat) is read, an allocation per repeat. */
Test(snapshot_pickle, an_entry_of_more_keys_than_a_trace_entry_has_is_refused) {
  size_t len;
  char *p = memoized_entry_pickle(64, 1000, false, &len);
  mpb_workload_t w;
  cr_assert_eq(mpb_snapshot_parse(p, len, "k.pickle", "k", &w), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(w.ev[0].size, 4096);
  cr_expect_eq(w.implicit_frees, 999, "one allocation per repeat");
  mpb_workload_free(&w);
  free(p);
  p = memoized_entry_pickle(65, 1000, false, &len);
  cr_assert_eq(mpb_snapshot_parse(p, len, "k.pickle", "k", &w), MP_EINVAL);
  cr_expect(strstr(mp_last_error(),
                   "k.pickle: device_traces[0] entry 0: the "
                   "dict made at byte 24 has 65 keys") == mp_last_error(),
            "%s", mp_last_error());
  cr_expect_eq(w.n, 0);
  free(p);
}

/* The memo can stand one entry in the trace again for 2 bytes, a row each:
 * rows past 4 times the pickle's bytes (and 1 MiB more) are refused with
 * the entry where they passed it (an 8 MB pickle of 4 million repeats took
 * 754 MB to read before); 20 000 repeats, under it, are read. */
Test(snapshot_pickle, memo_repeats_past_four_times_the_input_are_refused) {
  size_t len;
  char *p = memoized_entry_pickle(3, 20000, false, &len);
  mpb_workload_t w;
  cr_assert_eq(mpb_snapshot_parse(p, len, "m.pickle", "m", &w), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(w.implicit_frees, 19999, "one allocation per repeat");
  mpb_workload_free(&w);
  free(p);
  p = memoized_entry_pickle(3, 100000, false, &len);
  cr_assert_eq(mpb_snapshot_parse(p, len, "m.pickle", "m", &w), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "m.pickle: device_traces[0] entry ") ==
                mp_last_error(),
            "%s", mp_last_error());
  cr_expect(strstr(mp_last_error(), "more than 4 times the snapshot's") != NULL,
            "%s", mp_last_error());
  cr_expect_eq(w.n, 0);
  free(p);
}

/* A key set twice in a dict has its last value, as in Python. */
Test(snapshot_pickle, a_key_given_twice_has_its_last_value) {
  size_t len;
  char *p = memoized_entry_pickle(3, 1, true, &len);
  mpb_workload_t w;
  cr_assert_eq(mpb_snapshot_parse(p, len, "t.pickle", "t", &w), MP_OK, "%s",
               mp_last_error());
  cr_assert_geq(w.n, 1);
  cr_assert_eq(w.ev[0].op, MPB_ALLOC);
  cr_expect_eq(w.ev[0].size, 4096, "the first value (16) was taken");
  mpb_workload_free(&w);
  free(p);
}
