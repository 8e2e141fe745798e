/* test_preload_trace_write_interrupted.c - a signal that interrupts the
 * trace's write (MEMPOOL_TRACE) loses nothing: the row (the .json
 * trace's events) is written whole once the write can go on.
 *
 * A write(2) blocked on a full FIFO (a live reader that is behind) returns
 * EINTR when a handler installed without SA_RESTART runs in the writing
 * thread (signal(7); Python installs its handlers so). stdio passes that
 * on as an error (glibc's file write gives up on any write(2) failure) and
 * drops what it held: the row was lost, or, in the .json trace, a whole
 * buffer cut through its events, and the trace was said to be incomplete
 * for an interruption.
 *
 * The shim's sources run in this process on the fake driver, the trace a
 * FIFO this test reads (trace_fifo.h), filled up so that the trace's write
 * blocks; the writing thread is then signalled, and the FIFO drained. */
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>

#include "preload/preload.h"
#include "trace_fifo.h"

/* The FIFO's capacity filled with whole rows (a write of at most PIPE_BUF
 * bytes is whole or refused). */
#define FILL_ROW "1,00:00:00.000000,allocate,0x10,16,0\n"

static atomic_long writer_tid;
static atomic_int handled;

static void on_signal(int sig) {
  (void)sig;
  atomic_fetch_add(&handled, 1);
}

/* SIGUSR2 handled without SA_RESTART: a blocked write(2) is interrupted. */
static void interrupting(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  cr_assert_eq(sigaction(SIGUSR2, &sa, NULL), 0);
}

static void traced_csv(void) {
  interrupting();
  mp_fifo_traced(".csv");
}

static void traced_json(void) {
  interrupting();
  mp_fifo_traced(".json");
}

/* A traced allocation of 4096 bytes at arg. */
static void *record_thread(void *arg) {
  atomic_store(&writer_tid, (long)syscall(SYS_gettid));
  mp__pl_record_alloc((uintptr_t)arg, 4096, 0, true);
  return arg;
}

/* Thread t blocks in the trace's write (the FIFO full) and is signalled
 * there (twice); then the FIFO is drained until t is done: its answer. */
static void *interrupted_join(pthread_t t) {
  long id = 0;
  struct timespec nap = {0, 5 * 1000 * 1000};
  for (int i = 0; i < 6000 && ((id = atomic_load(&writer_tid)) == 0 ||
                               !mp_fifo_in_write(id));
       i++)
    nanosleep(&nap, NULL);
  cr_assert(id != 0 && mp_fifo_in_write(id),
            "the traced call never blocked in the trace's write(2)");
  int before = atomic_load(&handled);
  cr_assert_eq(pthread_kill(t, SIGUSR2), 0);
  for (int i = 0; i < 6000 && atomic_load(&handled) == before; i++)
    nanosleep(&nap, NULL);
  cr_assert_gt(atomic_load(&handled), before, "the signal was not handled");
  /* Blocked again (or done, its row dropped): signalled once more. */
  for (int i = 0; i < 20 && !mp_fifo_in_write(id); i++)
    nanosleep(&nap, NULL);
  (void)pthread_kill(t, SIGUSR2);
  void *ret = NULL;
  cr_assert(mp_fifo_joined(t, 30000, &ret), "the traced call hung");
  return ret;
}

static void interrupted_write(uintptr_t ptr) {
  pthread_t t;
  atomic_store(&writer_tid, 0);
  cr_assert_eq(pthread_create(&t, NULL, record_thread, (void *)ptr), 0);
  cr_expect_eq(interrupted_join(t), (void *)ptr);
}

Test(preload_trace_write_interrupted, csv_row_written_whole, .init = traced_csv,
     .fini = mp_fifo_untraced) {
  mp_fifo_drain(); /* the header */
  size_t filled = mp_fifo_fill(FILL_ROW);
  const uintptr_t first = 0x7f0000100000, second = 0x7f0000200000;
  interrupted_write(first);
  /* A later row, written at once. */
  mp__pl_record_alloc(second, 4096, 0, true);
  mp_fifo_drain();

  const char *got = mp_fifo_got;
  const char *header = "Thread,Time,Action,Pointer,Size,Stream\n";
  cr_assert_eq(strncmp(got, header, strlen(header)), 0);
  char want[64];
  snprintf(want, sizeof want, ",allocate,%#lx,4096,0\n", (unsigned long)first);
  cr_expect_not_null(strstr(got, want), "the interrupted row is missing:\n%s",
                     got + strlen(header) + filled * strlen(FILL_ROW));
  snprintf(want, sizeof want, ",allocate,%#lx,4096,0\n", (unsigned long)second);
  cr_expect_not_null(strstr(got, want), "the later row is missing");
  size_t rows = 0;
  for (const char *l = got + strlen(header); *l != '\0'; rows++) {
    const char *end = strchr(l, '\n');
    cr_assert_not_null(end, "a row cut short: '%s'", l);
    l = end + 1;
  }
  cr_expect_eq(rows, filled + 2);
}

/* The .json trace is fully buffered: its events reach the FIFO in
 * buffer-sized writes; an interrupted one dropped a buffer cut through
 * its events. */
#define JSON_EVENTS 200
#define JSON_BASE   ((uintptr_t)0x7f0000000000)

static void *events_thread(void *arg) {
  (void)arg;
  atomic_store(&writer_tid, (long)syscall(SYS_gettid));
  for (uintptr_t k = 0; k < JSON_EVENTS; k++)
    mp__pl_record_alloc(JSON_BASE + (k << 20), 4096, 0, true);
  return arg;
}

Test(preload_trace_write_interrupted, json_events_kept, .init = traced_json,
     .fini = mp_fifo_untraced) {
  mp_fifo_drain();         /* the header, if it was written already */
  (void)mp_fifo_fill(" "); /* a byte JSON allows between tokens */
  pthread_t t;
  atomic_store(&writer_tid, 0);
  cr_assert_eq(pthread_create(&t, NULL, events_thread, NULL), 0);
  interrupted_join(t);
  mp__pl_counts_t n;
  cr_assert(mp__pl_record_close(&n));
  mp_fifo_drain();

  /* Every event there, whole. */
  for (uintptr_t k = 0; k < JSON_EVENTS; k++) {
    char want[64];
    snprintf(want, sizeof want, "\"ptr\":\"%#lx\",\"size\":4096",
             (unsigned long)(JSON_BASE + (k << 20)));
    cr_expect_not_null(strstr(mp_fifo_got, want), "event %lu is missing",
                       (unsigned long)k);
  }
  cr_expect_not_null(strstr(mp_fifo_got, "\n]}\n"), "the trace is not closed");
}

/* The trace's open(2) of a FIFO waits for a reader; a signal there no
 * longer leaves the program untraced ("cannot write MEMPOOL_TRACE"). */
static atomic_int started;

static void *start_thread(void *arg) {
  (void)arg;
  atomic_store(&writer_tid, (long)syscall(SYS_gettid));
  const mp__pl_t *pl = mp__pl_get(); /* opens the trace */
  atomic_store(&started, 1);
  return (void *)pl;
}

/* Whether thread tid is in openat(2). */
static bool in_open(long tid) {
  return mp_fifo_in_syscall(tid, SYS_openat);
}

Test(preload_trace_write_interrupted, open_retried, .fini = mp_fifo_untraced) {
  interrupting();
  snprintf(mp_fifo_path, sizeof mp_fifo_path, "/tmp/mp_trace_open_%d.csv",
           (int)getpid());
  unlink(mp_fifo_path);
  cr_assert_eq(mkfifo(mp_fifo_path, 0600), 0, "mkfifo: %s", strerror(errno));
  setenv("MEMPOOL_TRACE", mp_fifo_path, 1);
  setenv("MEMPOOL_DEVICE", "cuda", 1);
  unsetenv("MEMPOOL_PRELOAD");
  unsetenv("MEMPOOL_CONF");
  (void)mp_in_process_context();
  pthread_t t;
  atomic_store(&writer_tid, 0);
  cr_assert_eq(pthread_create(&t, NULL, start_thread, NULL), 0);
  long id = 0;
  struct timespec nap = {0, 5 * 1000 * 1000};
  for (int i = 0;
       i < 6000 && ((id = atomic_load(&writer_tid)) == 0 || !in_open(id)); i++)
    nanosleep(&nap, NULL);
  cr_assert(id != 0 && in_open(id), "the start never waited in open(2)");
  int before = atomic_load(&handled);
  cr_assert_eq(pthread_kill(t, SIGUSR2), 0);
  for (int i = 0; i < 6000 && atomic_load(&handled) == before; i++)
    nanosleep(&nap, NULL);
  cr_assert_gt(atomic_load(&handled), before, "the signal was not handled");
  /* Given up (the bug) or waiting again: the reader comes now. */
  for (int i = 0; i < 20 && !atomic_load(&started) && !in_open(id); i++)
    nanosleep(&nap, NULL);
  mp_fifo_rfd = open(mp_fifo_path, O_RDONLY | O_NONBLOCK);
  cr_assert_geq(mp_fifo_rfd, 0);
  void *ret = NULL;
  cr_assert(mp_fifo_joined(t, 30000, &ret), "the start hung");
  mp__pl_record_alloc(0x7f0000100000, 4096, 0, true);
  mp_fifo_drain();
  cr_expect(
      strncmp(mp_fifo_got, "Thread,Time,Action,Pointer,Size,Stream\n", 39) ==
              0 &&
          strstr(mp_fifo_got, ",allocate,0x7f0000100000,4096,0\n") != NULL,
      "not traced: '%s'", mp_fifo_got);
}
