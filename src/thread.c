/* thread.c - the threads mempool starts for itself (the host device's
 * stream workers, the preload shim's snapshot helper) take no asynchronous
 * signal: a signal sent to the process (kill, Ctrl-C, a profiler's timer)
 * goes to one of the program's own threads, whose handlers and masks the
 * program chose, never to a worker that happens not to block it. The
 * signals a fault raises in the thread itself (SIGSEGV, SIGBUS, SIGFPE,
 * SIGILL, SIGTRAP, SIGSYS) stay open, so that a host function that faults
 * on a stream worker reaches the program's handler (or a sanitizer's)
 * instead of killing the process outright.
 *
 * mp__thread_start returns once the new thread runs fn: a thread's start
 * (in the C library, and in a sanitizer's runtime, which allocates there)
 * is over before the caller goes on. A program that forks right after its
 * first device call would otherwise fork while the worker is still
 * starting, perhaps inside the allocator, and the child inherits the
 * allocator's lock with no thread to drop it: under GCC 12's
 * AddressSanitizer, whose allocator has no fork handler, such a child hung
 * at its first allocation of that size (the lock of the 152-byte calloc in
 * pthread_getattr_np, which the runtime calls as a thread starts). */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "internal.h"

typedef struct mp__thread_boot {
  void *(*fn)(void *);
  void *arg;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool running;
} mp__thread_boot_t;

static atomic_ulong mp__booted;

unsigned long mp__threads_started(void) {
  return atomic_load(&mp__booted);
}

static void *mp__thread_main(void *p) {
  mp__thread_boot_t *boot = p; /* the creator's stack: read it first */
  void *(*fn)(void *) = boot->fn;
  void *arg = boot->arg;
  atomic_fetch_add(&mp__booted, 1);
  pthread_mutex_lock(&boot->mu);
  boot->running = true;
  pthread_cond_signal(&boot->cv);
  pthread_mutex_unlock(&boot->mu);
  return fn(arg);
}

int mp__thread_start(pthread_t *t, void *(*fn)(void *), void *arg) {
  static const int faults[] = {SIGSEGV, SIGBUS,  SIGFPE,
                               SIGILL,  SIGTRAP, SIGSYS};
  sigset_t quiet, old;
  sigfillset(&quiet);
  for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++)
    sigdelset(&quiet, faults[i]);
  /* The new thread inherits the creator's mask: set it around the create
   * and give the creator its own back. */
  mp__thread_boot_t boot = {.fn = fn, .arg = arg};
  pthread_mutex_init(&boot.mu, NULL);
  pthread_cond_init(&boot.cv, NULL);
  pthread_sigmask(SIG_SETMASK, &quiet, &old);
  int rc = pthread_create(t, NULL, mp__thread_main, &boot);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc == 0) {
    pthread_mutex_lock(&boot.mu);
    while (!boot.running)
      pthread_cond_wait(&boot.cv, &boot.mu);
    pthread_mutex_unlock(&boot.mu);
  }
  pthread_cond_destroy(&boot.cv);
  pthread_mutex_destroy(&boot.mu);
  return rc;
}
