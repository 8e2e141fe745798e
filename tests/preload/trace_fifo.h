/* trace_fifo.h - for the tests of the shim's sources in the test's
 * process (in_process.h) that read the trace (MEMPOOL_TRACE) through a
 * FIFO: filled up to its capacity, it makes the trace's write(2) block
 * until the test drains it. */
#ifndef MP_TESTS_PRELOAD_TRACE_FIFO_H
#define MP_TESTS_PRELOAD_TRACE_FIFO_H

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

static char mp_fifo_path[64];
static int mp_fifo_rfd = -1;      /* the test's end of the FIFO, non-blocking */
static char mp_fifo_got[1 << 22]; /* what the trace wrote, drained */
static size_t mp_fifo_got_n;

/* MEMPOOL_TRACE a new FIFO, its name ending in ext (".csv", ".json"),
 * the test's end open; then the shim on the fake driver. */
static inline void mp_fifo_traced(const char *ext) {
  snprintf(mp_fifo_path, sizeof mp_fifo_path, "/tmp/mp_trace_cancel_%d%s",
           (int)getpid(), ext);
  unlink(mp_fifo_path);
  cr_assert_eq(mkfifo(mp_fifo_path, 0600), 0, "mkfifo: %s", strerror(errno));
  /* The reader first: the shim's open for writing then does not block. */
  mp_fifo_rfd = open(mp_fifo_path, O_RDONLY | O_NONBLOCK);
  cr_assert_geq(mp_fifo_rfd, 0);
  setenv("MEMPOOL_TRACE", mp_fifo_path, 1);
  mp_in_process_cuda();
}

static inline void mp_fifo_untraced(void) {
  unlink(mp_fifo_path);
}

/* Reads what the FIFO holds now into mp_fifo_got (kept terminated). */
static inline void mp_fifo_drain(void) {
  for (;;) {
    ssize_t n = read(mp_fifo_rfd, mp_fifo_got + mp_fifo_got_n,
                     sizeof mp_fifo_got - 1 - mp_fifo_got_n);
    if (n <= 0)
      return;
    mp_fifo_got_n += (size_t)n;
    mp_fifo_got[mp_fifo_got_n] = '\0';
    cr_assert_lt(mp_fifo_got_n, sizeof mp_fifo_got - 1,
                 "the trace is longer than expected");
  }
}

/* Joins t within ms milliseconds, draining the FIFO meanwhile: true with
 * *ret its answer, false when it hung. */
static inline bool mp_fifo_joined(pthread_t t, unsigned ms, void **ret) {
  for (unsigned waited = 0;; waited += 5) {
    mp_fifo_drain();
    if (pthread_tryjoin_np(t, ret) == 0)
      return true;
    if (waited >= ms)
      return false;
    struct timespec nap = {0, 5 * 1000 * 1000};
    nanosleep(&nap, NULL);
  }
}

/* Fills the FIFO up to its capacity with copies of `with` (a write of at
 * most PIPE_BUF bytes is whole or refused): how many. */
static inline size_t mp_fifo_fill(const char *with) {
  int wfd = open(mp_fifo_path, O_WRONLY | O_NONBLOCK);
  cr_assert_geq(wfd, 0);
  size_t filled = 0;
  while (write(wfd, with, strlen(with)) > 0)
    filled++;
  cr_assert_eq(errno, EAGAIN);
  close(wfd);
  return filled;
}

/* Whether thread tid (of this process or another: a process's first
 * thread's id is its pid) is in system call nr: the first field of
 * /proc/TID/syscall, the number of the system call it is blocked in
 * (proc(5)). */
static inline bool mp_fifo_in_syscall(long tid, long nr) {
  char path[64], line[128] = "";
  snprintf(path, sizeof path, "/proc/%ld/syscall", tid);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return false;
  bool got_line = fgets(line, sizeof line, f) != NULL;
  fclose(f);
  char *end;
  long got = strtol(line, &end, 10);
  return got_line && end != line && got == nr;
}

/* Whether thread tid is in write(2) (the trace's, the FIFO full). */
static inline bool mp_fifo_in_write(long tid) {
  return mp_fifo_in_syscall(tid, SYS_write);
}

/* Waits (5 s at most) for the thread whose id *tid becomes to block in
 * the trace's write, then cancels t, which must end within 5 s
 * cancelled. */
static inline void mp_fifo_cancel_in_write(pthread_t t, atomic_long *tid) {
  long id = 0;
  struct timespec nap = {0, 5 * 1000 * 1000};
  for (int i = 0;
       i < 6000 && ((id = atomic_load(tid)) == 0 || !mp_fifo_in_write(id)); i++)
    nanosleep(&nap, NULL);
  cr_assert(id != 0 && mp_fifo_in_write(id),
            "the traced call never blocked in the trace's write(2)");
  cr_assert_eq(pthread_cancel(t), 0);
  void *ret = NULL;
  cr_assert(mp_fifo_joined(t, 30000, &ret), "the cancelled thread did not end");
  cr_expect_eq(ret, PTHREAD_CANCELED);
}

/* Joins t (a traced call made after the cancelled one) within 30 s: its
 * answer; a hang fails the test and ends the process (the report at exit
 * would hang as well). */
static inline void *mp_fifo_later(pthread_t t) {
  void *ret = NULL;
  if (!mp_fifo_joined(t, 30000, &ret)) {
    cr_expect_fail("a traced call after the cancelled one hung: the record "
                   "lock is held by the cancelled thread");
    _exit(1);
  }
  return ret;
}

#endif
