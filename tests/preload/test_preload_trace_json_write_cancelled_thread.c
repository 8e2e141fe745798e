/* test_preload_trace_json_write_cancelled_thread.c - a thread cancelled
 * (pthread_cancel, deferred: the default) while it writes an event of the
 * .json trace (MEMPOOL_TRACE ending in ".json": a Chrome / Perfetto
 * trace) leaves the trace usable: its event is written whole and its
 * cancellation takes effect once the record lock is given back; the trace
 * closes as valid JSON.
 *
 * The trace's stdio buffer, full, is written with write(2), a
 * cancellation point (pthreads(7)); cancelled there, the thread ended
 * holding the record lock, and every later traced call of the process
 * (and the report at exit) hung. test_preload_trace_write_cancelled_thread
 * checks the CSV trace; the .json one writes through another path
 * (mp__json_event, fully buffered).
 *
 * The shim's sources run in this process on the fake driver, the trace a
 * FIFO this test reads (trace_fifo.h): a thread records allocations until the
 * FIFO is full and its write blocks, is cancelled there, and the test drains
 * the FIFO. Each traced call runs on a thread joined with a deadline, so that
 * a hang fails the test. */
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>

#include "preload/preload.h"
#include "trace_fifo.h"

static void traced(void) {
  mp_fifo_traced(".json");
}

static atomic_long writer_tid;
#define FIRST 0x7f0000000000ull /* the first thread's first allocation */
#define LATER 0x7e0000000000ull /* the later thread's */
#define BYTES 4096

/* Traced allocations of BYTES at FIRST, FIRST + BYTES, ..., each followed
 * by a cancellation point, until cancelled. */
static void *record_thread(void *arg) {
  (void)arg;
  atomic_store(&writer_tid, (long)syscall(SYS_gettid));
  for (uintptr_t p = FIRST; p < FIRST + (1ull << 32); p += BYTES) {
    mp__pl_record_alloc(p, BYTES, 0, true);
    pthread_testcancel();
  }
  return NULL;
}

/* One traced allocation at LATER, then the trace closed. */
static void *later_thread(void *arg) {
  (void)arg;
  mp__pl_record_alloc(LATER, BYTES, 0, true);
  mp__pl_counts_t n;
  return mp__pl_record_close(&n) ? arg : NULL;
}

/* The number of "allocate" events at ptr in the trace. */
static unsigned allocations_at(uintptr_t ptr) {
  char want[64];
  snprintf(want, sizeof want, "\"args\":{\"ptr\":\"%#lx\",",
           (unsigned long)ptr);
  unsigned n = 0;
  for (const char *c = mp_fifo_got; (c = strstr(c, want)) != NULL; c++)
    n++;
  return n;
}

Test(preload_trace_json_write_cancelled_thread, cancelled_in_the_trace_write,
     .init = traced, .fini = mp_fifo_untraced) {
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, record_thread, NULL), 0);
  /* Blocked in the trace's write (the FIFO full), then cancelled. */
  mp_fifo_cancel_in_write(t, &writer_tid);

  /* Another thread's traced call, then the trace's end. */
  static int later_ok;
  pthread_t later;
  cr_assert_eq(pthread_create(&later, NULL, later_thread, &later_ok), 0);
  cr_expect_eq(mp_fifo_later(later), &later_ok, "the trace's close failed");
  mp_fifo_drain();
  char *got = mp_fifo_got;
  size_t got_n = mp_fifo_got_n;

  /* The trace: its head, then events each whole (an object of its own,
   * ",\n" between two), the later thread's allocation among them, and its
   * end. */
  const char *head = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  const char *tail = "\n]}\n";
  cr_assert_eq(strncmp(got, head, strlen(head)), 0);
  cr_assert_geq(got_n, strlen(head) + strlen(tail));
  cr_expect_str_eq(got + got_n - strlen(tail), tail, "the trace's end");
  got[got_n - strlen(tail)] = '\0';
  size_t events = 0;
  for (char *e = got + strlen(head); e != NULL; events++) {
    char *next = strstr(e, ",\n");
    if (next != NULL)
      *next = '\0';
    int depth = 0;
    bool whole = e[0] == '{';
    for (const char *c = e; whole && *c != '\0'; c++) {
      depth += (*c == '{') - (*c == '}');
      whole = depth > 0 || c[1] == '\0';
    }
    cr_expect(whole && depth == 0, "an event cut short: '%s'", e);
    e = next != NULL ? next + 2 : NULL;
    if (next != NULL)
      *next = ',';
  }
  cr_expect_eq(allocations_at(LATER), 1, "the later event is missing");
  /* The head's process name, then three events per allocation: the
   * cancelled thread's, each whole, and the later one. */
  cr_expect_eq((events - 1) % 3, 0, "%zu events", events);
  cr_expect_gt(events, 4);
}
