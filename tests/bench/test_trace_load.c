/* Loading a trace file: what is not a trace is refused at its first bad
 * line (a device, a pipe of binary data, a line no trace has) instead of
 * being read to its end, with the file and line in the message; a header
 * behind a UTF-8 byte order mark is a header; a row no trace has stops
 * the read at its line too (a pipe of bad rows was read to its end first);
 * a trace too big for host memory is refused with the line it reached (the
 * read holds the line it reads, the parse what the rows make); a snapshot
 * pickle from a pipe is read up to a limit only. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
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

/* A refusal leaves the workload empty (mpbench.h), whatever it held: also
 * when the read stops before the parser runs. */
static void expect_empty(const mpb_workload_t *w) {
  cr_expect(w->n == 0 && w->ev == NULL && w->nslots == 0,
            "a refused load left events behind");
}

static void expect_refused(const char *where, const char *words) {
  mpb_workload_t w;
  memset(&w, 0xa5, sizeof w);
  cr_assert_eq(mpb_trace_load(path, "t", &w), MP_EINVAL, "accepted %s", path);
  expect_empty(&w);
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
  memset(&w, 0xa5, sizeof w);
  cr_assert_eq(mpb_trace_load("/dev/zero", "z", &w), MP_EINVAL);
  expect_empty(&w);
  cr_expect(strstr(mp_last_error(), "/dev/zero:1:") != NULL, "%s",
            mp_last_error());
}

/* Writes a pickle's PROTO opcode, then zeros, into the FIFO at arg until
 * the reader leaves or twice the limit is written (so that a reader
 * without the limit still ends). */
static void *feed_pickle(void *arg) {
  int fd = open(arg, O_WRONLY);
  if (fd < 0)
    return (void *)SIZE_MAX;
  static char chunk[1 << 16];
  chunk[0] = (char)0x80;
  chunk[1] = 2;
  for (size_t sent = 0; sent < 2 * MPB_MAX_PIPED_SNAPSHOT;) {
    ssize_t n = write(fd, chunk, sizeof chunk);
    if (n <= 0)
      break; /* EPIPE: the reader stopped */
    sent += (size_t)n;
    chunk[0] = chunk[1] = 0;
  }
  close(fd);
  return NULL;
}

/* mpb_trace_load of a FIFO named name that feed (a thread) writes into,
 * refused (MP_EINVAL, the workload left empty): what feed returned
 * (SIZE_MAX: it could not open the FIFO). The FIFO's path in fifo. */
static void *load_fifo_refused(const char *name, void *(*feed)(void *),
                               char *fifo, size_t len) {
  signal(SIGPIPE, SIG_IGN);
  char dir[] = "/tmp/mp_trace_fifo_XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  snprintf(fifo, len, "%s/%s", dir, name);
  cr_assert_eq(mkfifo(fifo, 0600), 0);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, feed, fifo), 0);
  mpb_workload_t w;
  memset(&w, 0xa5, sizeof w);
  mp_status_t st = mpb_trace_load(fifo, "fifo", &w);
  void *fed;
  pthread_join(t, &fed);
  unlink(fifo);
  rmdir(dir);
  cr_assert_neq((size_t)fed, SIZE_MAX, "the writer could not open the FIFO");
  cr_assert_eq(st, MP_EINVAL, "%s", mp_status_name(st));
  expect_empty(&w);
  return fed;
}

Test(trace_load, a_pickle_from_a_pipe_is_read_up_to_the_limit) {
  char fifo[64];
  load_fifo_refused("snap.pickle", feed_pickle, fifo, sizeof fifo);
  char limit[32];
  snprintf(limit, sizeof limit, "at most %zu bytes", MPB_MAX_PIPED_SNAPSHOT);
  cr_expect(strstr(mp_last_error(), fifo) != NULL, "%s", mp_last_error());
  cr_expect(strstr(mp_last_error(), "pipe or device") != NULL, "%s",
            mp_last_error());
  cr_expect(strstr(mp_last_error(), limit) != NULL, "'%s' lacks '%s'",
            mp_last_error(), limit);
}

/* Writes the header, then rows no trace has, into the FIFO at arg until
 * the reader leaves or 256 MiB are written; returns how many bytes went. */
static void *feed_bad_rows(void *arg) {
  int fd = open(arg, O_WRONLY);
  if (fd < 0)
    return (void *)SIZE_MAX;
  static char chunk[1 << 16];
  const char bad[] =
      "not,a,trace,row\n"; /* 16 bytes: the chunk is whole rows */
  for (size_t i = 0; i < sizeof chunk; i += sizeof bad - 1)
    memcpy(chunk + i, bad, sizeof bad - 1);
  size_t sent = 0;
  if (write(fd, HEADER, strlen(HEADER)) == (ssize_t)strlen(HEADER)) {
    while (sent < (size_t)256 << 20) {
      ssize_t n = write(fd, chunk, sizeof chunk);
      if (n <= 0)
        break; /* EPIPE: the reader stopped */
      sent += (size_t)n;
    }
  }
  close(fd);
  return (void *)sent;
}

Test(trace_load, a_pipe_of_bad_rows_is_refused_at_line_two) {
  char fifo[64];
  size_t sent =
      (size_t)load_fifo_refused("rows.csv", feed_bad_rows, fifo, sizeof fifo);
  char at[96];
  snprintf(at, sizeof at, "%s:2:", fifo);
  cr_expect(strstr(mp_last_error(), at) != NULL, "'%s' lacks '%s'",
            mp_last_error(), at);
  /* What the reader took before it stopped, and what the pipe holds. */
  cr_expect_lt(sent, (size_t)8 << 20,
               "%zu bytes of bad rows were read before line 2 was refused",
               sent);
}

Test(trace_load, nul_bytes_after_a_good_header_stop_the_read_at_their_line) {
  write_file(HEADER ROW, strlen(HEADER ROW), '\0', 1 << 20);
  expect_refused("3:", "NUL byte");
}

Test(trace_load, a_line_no_trace_has_stops_the_read_at_its_line) {
  write_file(HEADER ROW ROW, strlen(HEADER ROW ROW), 'x', 1 << 20);
  expect_refused("4:", "longer than");
}

/* A row of the longest length a line may have, ending in CRLF: the '\r'
 * is no byte of it (the row is read without it), so it is read as the
 * same row ending in LF is. It was refused as longer than the limit. */
static void expect_longest_row_read(const char *eol) {
  static const char tail[] = ",15:47:02.841961,allocate,0x1000,4096,0";
  char text[2 * 4096];
  size_t n = strlen(HEADER), pad = 4096 - (sizeof tail - 1);
  memcpy(text, HEADER, n);
  memset(text + n, '0', pad - 1); /* thread 000...01 */
  text[n + pad - 1] = '1';
  n += pad;
  memcpy(text + n, tail, sizeof tail - 1);
  n += sizeof tail - 1;
  n += (size_t)sprintf(text + n, "%s", eol);
  write_file(text, n, 0, 0);
  mpb_workload_t w;
  cr_expect_eq(mpb_trace_load(path, "t", &w), MP_OK, "%s", mp_last_error());
  mpb_workload_free(&w);
  unlink(path);
  /* One byte more is refused, whatever ends the line. */
  memmove(text + strlen(HEADER) + 1, text + strlen(HEADER), n - strlen(HEADER));
  text[strlen(HEADER)] = '0';
  write_file(text, n + 1, 0, 0);
  expect_refused("2:", "longer than 4096 bytes");
}

Test(trace_load, the_longest_row_is_read_whatever_ends_it) {
  expect_longest_row_read("\n");
  expect_longest_row_read("\r\n");
  expect_longest_row_read("\r"); /* the file's last line */
  expect_longest_row_read("");
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

/* ---- out of host memory ------------------------------------------------ */

/* RLIMIT_AS cannot bound a sanitizer build (its shadow memory alone is
 * terabytes of address space). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MPB_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define MPB_SANITIZED 1
#endif
#endif

enum { BIG_ROWS = 600000 };

/* Rows that are all live allocations: the parser's tables grow with every
 * one of them. */
static void write_big_trace(void) {
  strcpy(path, "/tmp/mp_trace_big_XXXXXX");
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  FILE *f = fdopen(fd, "wb");
  cr_assert_not_null(f);
  fputs(HEADER, f);
  for (unsigned long i = 0; i < BIG_ROWS; i++)
    fprintf(f, "1,15:47:02.%06lu,allocate,0x%lx,%lu,%lu\n", i % 1000000,
            0x7f0000000000ul + i * 4096, 4096 + i % 512, i % 4);
  cr_assert_eq(fclose(f), 0);
}

typedef struct load_result {
  mp_status_t st;
  size_t n;
  char msg[512];
} load_result_t;

/* mpb_trace_load(path) in a child whose address space may grow by at most
 * extra bytes over what it has at the call. */
static load_result_t load_with_headroom(size_t extra) {
  int fds[2];
  cr_assert_eq(pipe(fds), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    load_result_t r = {0};
    unsigned long pages = 0;
    FILE *sm = fopen("/proc/self/statm", "r");
    if (sm == NULL || fscanf(sm, "%lu", &pages) != 1)
      _exit(2);
    fclose(sm);
    size_t vm = pages * (size_t)sysconf(_SC_PAGESIZE);
    struct rlimit rl = {vm + extra, vm + extra};
    if (setrlimit(RLIMIT_AS, &rl) != 0)
      _exit(3);
    mpb_workload_t w;
    r.st = mpb_trace_load(path, "big", &w);
    if (r.st == MP_OK) {
      r.n = w.n;
      mpb_workload_free(&w);
    } else {
      snprintf(r.msg, sizeof r.msg, "%s", mp_last_error());
    }
    _exit(write(fds[1], &r, sizeof r) == (ssize_t)sizeof r ? 0 : 4);
  }
  close(fds[1]);
  load_result_t r;
  ssize_t got = read(fds[0], &r, sizeof r);
  close(fds[0]);
  int ws;
  cr_assert_eq(waitpid(pid, &ws, 0), pid);
  cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0,
            "the loader with %zu bytes of headroom died (status %#x)", extra,
            ws);
  cr_assert_eq(got, (ssize_t)sizeof r);
  return r;
}

/* The line a message names after "path:"; 0 when it names none. */
static size_t line_named(const char *msg) {
  char at[80];
  snprintf(at, sizeof at, "%s:", path);
  const char *p = strstr(msg, at);
  if (p == NULL)
    return 0;
  char *end;
  unsigned long line = strtoul(p + strlen(at), &end, 10);
  return *end == ':' ? line : 0;
}

Test(trace_load, running_out_of_host_memory_names_the_line_reached) {
#ifdef MPB_SANITIZED
  cr_skip_test("RLIMIT_AS cannot bound a sanitizer build");
#endif
  write_big_trace();
  bool reading = false, parsing = false, loaded = false;
  /* From too little to read the file to enough to load it. */
  for (size_t extra = (size_t)4 << 20; extra <= (size_t)1 << 30 && !loaded;
       extra *= 2) {
    load_result_t r = load_with_headroom(extra);
    if (r.st == MP_OK) {
      cr_expect_eq(r.n, 2 * (size_t)BIG_ROWS, "every row and its drain");
      loaded = true;
      continue;
    }
    cr_assert_eq(r.st, MP_ENOMEM, "%zu bytes of headroom: %s", extra, r.msg);
    cr_log_info("%zu bytes of headroom: %s", extra, r.msg);
    size_t line = line_named(r.msg);
    cr_expect(line >= 1 && line <= BIG_ROWS + 2,
              "%zu bytes of headroom: '%s' names no line of %s", extra, r.msg,
              path);
    if (strstr(r.msg, "reading the trace") != NULL) {
      reading = true;
      cr_expect_gt(line, 1, "'%s': the read went past line 1", r.msg);
    } else {
      parsing = true;
    }
  }
  unlink(path);
  cr_expect(loaded, "the trace never loaded, even with 1 GiB of headroom");
  /* The read holds one buffer for the line it reads, not the file: with 4
   * MiB of headroom and up it does not run out. */
  cr_expect(!reading, "the read ran out of memory: it holds the whole file");
  cr_expect(parsing, "no headroom ran out while parsing: the test proves "
                     "less than it says");
}

/* A file at a long path (three folders of 200 characters) holding text. */
static char long_dir[64], long_path[1024];

static void write_long(const void *text, size_t n) {
  strcpy(long_dir, "/tmp/mp_trace_long_XXXXXX");
  cr_assert_not_null(mkdtemp(long_dir));
  char seg[201];
  memset(seg, 'd', 200);
  seg[200] = '\0';
  snprintf(long_path, sizeof long_path, "%s", long_dir);
  for (int i = 0; i < 3; i++) {
    size_t l = strlen(long_path);
    snprintf(long_path + l, sizeof long_path - l, "/%s", seg);
    cr_assert_eq(mkdir(long_path, 0700), 0);
  }
  size_t l = strlen(long_path);
  snprintf(long_path + l, sizeof long_path - l, "/trace.csv");
  FILE *f = fopen(long_path, "wb");
  cr_assert_not_null(f);
  fwrite(text, 1, n, f);
  fclose(f);
}

static void remove_long(void) {
  unlink(long_path);
  for (int i = 0; i < 3; i++) {
    *strrchr(long_path, '/') = '\0';
    rmdir(long_path);
  }
}

/* The message says where and what even when the path alone would fill it
 * (the error buffer holds 512 bytes): the path is shortened in its middle,
 * its file name kept. Failed before: the path filled the message, and the
 * line number and the reason were cut off. */
Test(trace_load, a_long_path_leaves_room_for_the_line_and_the_reason) {
  const char text[] = HEADER ROW "1,15:47:02.841970,frobnicate,0x1,64,0\n";
  write_long(text, sizeof text - 1);
  cr_assert_gt(strlen(long_path), 600);
  mpb_workload_t w;
  cr_assert_eq(mpb_trace_load(long_path, "t", &w), MP_EINVAL);
  const char *msg = mp_last_error();
  cr_expect(strstr(msg, "trace.csv:3: bad action 'frobnicate'") != NULL, "'%s'",
            msg);
  remove_long();
}

/* The same for a snapshot pickle's byte offset. */
Test(trace_load, a_long_path_leaves_room_for_a_pickles_offset) {
  const char bad[] = "\x80\x02\xff";
  write_long(bad, sizeof bad - 1);
  mpb_workload_t w;
  cr_assert_eq(mpb_trace_load(long_path, "t", &w), MP_EINVAL);
  const char *msg = mp_last_error();
  cr_expect(strstr(msg, "trace.csv: bad pickle at byte 2") != NULL, "'%s'",
            msg);
  remove_long();
}

/* The first bad line is the one named, also when a later line of the same
 * read has a NUL byte or is too long: the checks of the bytes ran over a
 * whole read before any of its lines was parsed, so a bad row at line 2
 * was reported as line 3's NUL byte. */
Test(trace_load, a_bad_row_before_a_nul_byte_is_the_one_named) {
  static const char text[] = HEADER "1,00:00:00.000001,allocate,0xZZ,100,0\n"
                                    "1,00:00:00.000002,allocate,0x2000,100,0";
  write_file(text, sizeof text, '\0', 1);
  expect_refused("2:", "0xZZ");
}
