/* thread.c - the threads mempool starts for itself (the host device's
 * stream workers, the preload shim's snapshot helper) take no asynchronous
 * signal: a signal sent to the process (kill, Ctrl-C, a profiler's timer)
 * goes to one of the program's own threads, whose handlers and masks the
 * program chose, never to a worker that happens not to block it. The
 * signals a fault raises in the thread itself (SIGSEGV, SIGBUS, SIGFPE,
 * SIGILL, SIGTRAP, SIGSYS) stay open, so that a host function that faults
 * on a stream worker reaches the program's handler (or a sanitizer's)
 * instead of killing the process outright. */
#include <pthread.h>
#include <signal.h>

#include "internal.h"

int mp__thread_start(pthread_t *t, void *(*fn)(void *), void *arg) {
  static const int faults[] = {SIGSEGV, SIGBUS,  SIGFPE,
                               SIGILL,  SIGTRAP, SIGSYS};
  sigset_t quiet, old;
  sigfillset(&quiet);
  for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++)
    sigdelset(&quiet, faults[i]);
  /* The new thread inherits the creator's mask: set it around the create
   * and give the creator its own back. */
  pthread_sigmask(SIG_SETMASK, &quiet, &old);
  int rc = pthread_create(t, NULL, fn, arg);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return rc;
}
