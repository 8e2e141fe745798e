/* Threads mempool starts for itself take no asynchronous signal: a signal
 * sent to the process while the program's own thread blocks it waits for
 * that thread (it is never handled on a host device stream worker), and
 * the workers still take the signals of their own faults. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <mempool/mempool.h>

static atomic_long handled_on; /* the thread that ran on_usr1, 0: none */
static atomic_long worker_tid; /* a stream worker (a host function's) */

static long self_tid(void) {
  return (long)syscall(SYS_gettid);
}

static void on_usr1(int sig) {
  (void)sig;
  atomic_store(&handled_on, self_tid());
}

static void note_worker(void *arg) {
  (void)arg;
  atomic_store(&worker_tid, self_tid());
}

/* The blocked-signal mask of thread tid, from /proc (SigBlk, hex). */
static unsigned long long blocked_of(long tid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/self/task/%ld/status", tid);
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f, "%s", path);
  unsigned long long mask = 0;
  bool found = false;
  while (fgets(line, sizeof line, f) != NULL)
    if (sscanf(line, "SigBlk: %llx", &mask) == 1) {
      found = true;
      break;
    }
  fclose(f);
  cr_assert(found, "no SigBlk in %s", path);
  return mask;
}

static bool in_mask(unsigned long long mask, int sig) {
  return (mask >> (sig - 1)) & 1;
}

Test(thread_signals, a_process_signal_waits_for_the_program_not_a_worker) {
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host:capacity=64M", &dev), MP_OK, "%s",
               mp_last_error());
  mp_stream_t s[3];
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(mp_stream_create(dev, &s[i]), MP_OK);
    cr_assert_eq(mp_stream_synchronize(dev, s[i]), MP_OK); /* started */
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_usr1;
  sigemptyset(&sa.sa_mask);
  cr_assert_eq(sigaction(SIGUSR1, &sa, NULL), 0);
  sigset_t usr1, old;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  cr_assert_eq(pthread_sigmask(SIG_BLOCK, &usr1, &old), 0);
  cr_assert_eq(kill(getpid(), SIGUSR1), 0);
  /* A thread that does not block it would run the handler now. */
  struct timespec ts = {0, 200 * 1000 * 1000};
  nanosleep(&ts, NULL);
  long early = atomic_load(&handled_on);
  cr_assert_eq(early, 0, "the signal ran on thread %ld, not the program's %ld",
               early, self_tid());
  cr_assert_eq(pthread_sigmask(SIG_SETMASK, &old, NULL), 0);
  cr_assert_eq(atomic_load(&handled_on), self_tid()); /* delivered on unblock */
  for (int i = 0; i < 3; i++)
    cr_assert_eq(mp_stream_destroy(dev, s[i]), MP_OK);
  mp_device_close(dev);
}

Test(thread_signals, a_worker_blocks_async_signals_and_keeps_fault_signals) {
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host:capacity=64M", &dev), MP_OK, "%s",
               mp_last_error());
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, s, note_worker, NULL), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  long tid = atomic_load(&worker_tid);
  cr_assert_neq(tid, 0);
  cr_assert_neq(tid, self_tid());
  unsigned long long mask = blocked_of(tid);
  static const int async[] = {SIGINT,  SIGTERM, SIGUSR1, SIGUSR2,
                              SIGALRM, SIGPROF, SIGCHLD, SIGHUP};
  for (size_t i = 0; i < sizeof async / sizeof async[0]; i++)
    cr_assert(in_mask(mask, async[i]), "signal %d open on a worker (%llx)",
              async[i], mask);
  static const int faults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
  for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++)
    cr_assert(!in_mask(mask, faults[i]), "fault signal %d blocked (%llx)",
              faults[i], mask);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
  mp_device_close(dev);
}
