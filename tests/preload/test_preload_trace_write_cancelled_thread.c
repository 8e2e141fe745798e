/* test_preload_trace_write_cancelled_thread.c - a thread cancelled
 * (pthread_cancel, deferred: the default) while it writes a row of the
 * trace (MEMPOOL_TRACE) leaves the trace usable: its row is written whole
 * and its cancellation takes effect once the record lock is given back.
 *
 * The trace's write(2) is a cancellation point (pthreads(7)); cancelled
 * there, the thread ended holding the record lock, and every later traced
 * call of the process (and the report at exit) hung.
 *
 * The shim's sources run in this process on the fake driver, the trace a
 * FIFO this test reads: filled up to its capacity, it makes the trace's
 * write block until the test drains it. Each traced call runs on a thread
 * joined with a deadline, so that a hang fails the test. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "in_process.h"
#include "preload/preload.h"

static char fifo_path[64];
static int rfd = -1;      /* the test's end of the FIFO, non-blocking */
static char got[1 << 18]; /* what the trace wrote, drained */
static size_t got_n;

/* The FIFO's capacity filled with whole rows (a write of at most PIPE_BUF
 * bytes is whole or refused). */
#define FILL_ROW "1,00:00:00.000000,allocate,0x10,16,0\n"

static void traced(void) {
  snprintf(fifo_path, sizeof fifo_path, "/tmp/mp_trace_cancel_%d.csv",
           (int)getpid());
  unlink(fifo_path);
  cr_assert_eq(mkfifo(fifo_path, 0600), 0, "mkfifo: %s", strerror(errno));
  /* The reader first: the shim's open for writing then does not block. */
  rfd = open(fifo_path, O_RDONLY | O_NONBLOCK);
  cr_assert_geq(rfd, 0);
  setenv("MEMPOOL_TRACE", fifo_path, 1);
  mp_in_process_cuda();
}

static void untraced(void) {
  unlink(fifo_path);
}

/* Reads what the FIFO holds now into got. */
static void drain(void) {
  for (;;) {
    ssize_t n = read(rfd, got + got_n, sizeof got - got_n);
    if (n <= 0)
      return;
    got_n += (size_t)n;
    cr_assert_lt(got_n, sizeof got, "the trace is longer than expected");
  }
}

static atomic_long writer_tid;

/* A traced allocation of 4096 bytes at arg, then a cancellation point. */
static void *record_thread(void *arg) {
  atomic_store(&writer_tid, (long)syscall(SYS_gettid));
  mp__pl_record_alloc((uintptr_t)arg, 4096, 0, true);
  pthread_testcancel();
  return arg;
}

/* Joins t within ms milliseconds, draining the FIFO meanwhile: true with
 * *ret its answer, false when it hung. */
static bool joined(pthread_t t, unsigned ms, void **ret) {
  for (unsigned waited = 0;; waited += 5) {
    drain();
    if (pthread_tryjoin_np(t, ret) == 0)
      return true;
    if (waited >= ms)
      return false;
    struct timespec nap = {0, 5 * 1000 * 1000};
    nanosleep(&nap, NULL);
  }
}

/* Whether thread tid is in write(2) (the trace's, the FIFO full): the
 * first field of /proc/self/task/TID/syscall, the number of the system
 * call it is blocked in (proc(5)). */
static bool in_write(long tid) {
  char path[64], line[128] = "";
  snprintf(path, sizeof path, "/proc/self/task/%ld/syscall", tid);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return false;
  bool got_line = fgets(line, sizeof line, f) != NULL;
  fclose(f);
  char *end;
  long nr = strtol(line, &end, 10);
  return got_line && end != line && nr == SYS_write;
}

/* Whether the trace holds the row of a 4096-byte allocation at ptr. */
static bool has_row(uintptr_t ptr) {
  char want[64];
  snprintf(want, sizeof want, ",allocate,%#lx,4096,0\n", (unsigned long)ptr);
  return strstr(got, want) != NULL;
}

Test(preload_trace_write_cancelled_thread, cancelled_in_the_trace_write,
     .init = traced, .fini = untraced) {
  drain(); /* the header */
  int wfd = open(fifo_path, O_WRONLY | O_NONBLOCK);
  cr_assert_geq(wfd, 0);
  size_t filled = 0;
  while (write(wfd, FILL_ROW, strlen(FILL_ROW)) > 0)
    filled++;
  cr_assert_eq(errno, EAGAIN);
  close(wfd);

  pthread_t t;
  const uintptr_t first = 0x7f0000100000, second = 0x7f0000200000;
  cr_assert_eq(pthread_create(&t, NULL, record_thread, (void *)first), 0);
  /* Blocked in the trace's write (the FIFO full), then cancelled. */
  long tid;
  struct timespec nap = {0, 5 * 1000 * 1000};
  for (int i = 0;
       i < 1000 && ((tid = atomic_load(&writer_tid)) == 0 || !in_write(tid));
       i++)
    nanosleep(&nap, NULL);
  cr_assert(tid != 0 && in_write(tid),
            "the traced call never blocked in the trace's write(2)");
  cr_assert_eq(pthread_cancel(t), 0);
  void *ret = NULL;
  cr_assert(joined(t, 5000, &ret), "the cancelled thread did not end");
  cr_expect_eq(ret, PTHREAD_CANCELED);

  /* Another thread's traced call. */
  cr_assert_eq(pthread_create(&t, NULL, record_thread, (void *)second), 0);
  if (!joined(t, 5000, &ret)) {
    cr_expect_fail("a traced call after the cancelled one hung: the record "
                   "lock is held by the cancelled thread");
    /* The report at exit would hang as well. */
    _exit(1);
  }
  cr_expect_eq(ret, (void *)second);
  drain();

  /* The trace: the header, the rows the test wrote, then the two rows,
   * each whole. */
  const char *header = "Thread,Time,Action,Pointer,Size,Stream\n";
  cr_assert_eq(strncmp(got, header, strlen(header)), 0);
  cr_expect(has_row(first), "the cancelled thread's row is missing:\n%s",
            got + strlen(header) + filled * strlen(FILL_ROW));
  cr_expect(has_row(second), "the later row is missing");
  size_t rows = 0;
  for (const char *l = got + strlen(header); *l != '\0'; rows++) {
    const char *end = strchr(l, '\n');
    cr_assert_not_null(end, "a row cut short: '%s'", l);
    int commas = 0;
    for (const char *c = l; c < end; c++)
      commas += *c == ',';
    cr_expect_eq(commas, 5, "a row not of 6 fields: '%.*s'", (int)(end - l), l);
    l = end + 1;
  }
  cr_expect_eq(rows, filled + 2);
}
