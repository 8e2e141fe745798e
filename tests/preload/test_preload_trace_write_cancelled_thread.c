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
 * FIFO this test reads (trace_fifo.h): filled up to its capacity, it makes
 * the trace's write block until the test drains it. Each traced call runs on a
 * thread joined with a deadline, so that a hang fails the test. */
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>

#include "preload/preload.h"
#include "trace_fifo.h"

/* The FIFO's capacity filled with whole rows (a write of at most PIPE_BUF
 * bytes is whole or refused). */
#define FILL_ROW "1,00:00:00.000000,allocate,0x10,16,0\n"

static void traced(void) {
  mp_fifo_traced(".csv");
}

static atomic_long writer_tid;

/* A traced allocation of 4096 bytes at arg, then a cancellation point. */
static void *record_thread(void *arg) {
  atomic_store(&writer_tid, (long)syscall(SYS_gettid));
  mp__pl_record_alloc((uintptr_t)arg, 4096, 0, true);
  pthread_testcancel();
  return arg;
}

/* Whether the trace holds the row of a 4096-byte allocation at ptr. */
static bool has_row(uintptr_t ptr) {
  char want[64];
  snprintf(want, sizeof want, ",allocate,%#lx,4096,0\n", (unsigned long)ptr);
  return strstr(mp_fifo_got, want) != NULL;
}

Test(preload_trace_write_cancelled_thread, cancelled_in_the_trace_write,
     .init = traced, .fini = mp_fifo_untraced) {
  mp_fifo_drain(); /* the header */
  size_t filled = mp_fifo_fill(FILL_ROW);

  pthread_t t;
  const uintptr_t first = 0x7f0000100000, second = 0x7f0000200000;
  cr_assert_eq(pthread_create(&t, NULL, record_thread, (void *)first), 0);
  /* Blocked in the trace's write (the FIFO full), then cancelled. */
  mp_fifo_cancel_in_write(t, &writer_tid);

  /* Another thread's traced call. */
  cr_assert_eq(pthread_create(&t, NULL, record_thread, (void *)second), 0);
  cr_expect_eq(mp_fifo_later(t), (void *)second);
  mp_fifo_drain();

  /* The trace: the header, the rows the test wrote, then the two rows,
   * each whole. */
  const char *got = mp_fifo_got;
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
