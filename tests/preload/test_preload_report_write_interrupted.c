/* test_preload_report_write_interrupted.c - a signal that interrupts the
 * report's write at exit (MEMPOOL_REPORT) loses nothing: the report is
 * written whole once the write can go on.
 *
 * The report was a glibc file stream, which gives up on a write(2) that
 * fails with EINTR (a handler installed without SA_RESTART ran while the
 * write waited on a full FIFO or a slow disk, signal(7)) and drops what it
 * held: the report was lost, and said to be incomplete. It is now written
 * as the trace is (mp__pl_record_fopen).
 *
 * The report is written by the shim's destructor, so the test runs this
 * executable again as a child (MP_REPORT_EINTR_CHILD set): its constructor
 * installs the handler, starts the shim's sources on the fake driver,
 * makes one allocation and exits. MEMPOOL_REPORT is a FIFO the test has
 * filled up (trace_fifo.h), so the report's write blocks; the child is
 * signalled there, then the FIFO drained. */
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "trace_fifo.h"

static void on_signal(int sig) {
  (void)sig;
}

__attribute__((constructor)) static void child(void) {
  if (getenv("MP_REPORT_EINTR_CHILD") == NULL)
    return;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal; /* no SA_RESTART */
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGUSR2, &sa, NULL) != 0)
    _exit(4);
  int st = mp_in_process_child_served();
  if (st != 0)
    _exit(st);
  exit(0);
}

/* Whether child pid has ended, its status in *status. */
static bool ended(pid_t pid, int *status) {
  return waitpid(pid, status, WNOHANG) == pid;
}

Test(preload_report_write_interrupted, report_written_whole,
     .fini = mp_fifo_untraced) {
  snprintf(mp_fifo_path, sizeof mp_fifo_path, "/tmp/mp_report_eintr_%d.json",
           (int)getpid());
  unlink(mp_fifo_path);
  cr_assert_eq(mkfifo(mp_fifo_path, 0600), 0, "mkfifo: %s", strerror(errno));
  mp_fifo_rfd = open(mp_fifo_path, O_RDONLY | O_NONBLOCK);
  cr_assert_geq(mp_fifo_rfd, 0);
  size_t filled = mp_fifo_fill(" "); /* a byte JSON allows between tokens */

  pid_t pid =
      mp_in_process_report_child(mp_fifo_path, "MP_REPORT_EINTR_CHILD", "1");

  /* The child blocks in the report's write (the FIFO full): signalled
   * there, twice (after the first, waiting again or done). */
  int status = 0;
  bool done = false;
  struct timespec nap = {0, 5 * 1000 * 1000};
  for (int i = 0; i < 6000 && !(done = ended(pid, &status)) &&
                  !mp_fifo_in_syscall(pid, SYS_write);
       i++)
    nanosleep(&nap, NULL);
  cr_assert(!done, "the child ended before its report's write blocked");
  cr_assert(mp_fifo_in_syscall(pid, SYS_write),
            "the child never blocked in the report's write(2)");
  cr_assert_eq(kill(pid, SIGUSR2), 0);
  for (int i = 0; i < 20 && !mp_fifo_in_syscall(pid, SYS_write); i++)
    nanosleep(&nap, NULL);
  (void)kill(pid, SIGUSR2);
  for (int i = 0; i < 6000 && !(done = ended(pid, &status)); i++) {
    mp_fifo_drain();
    nanosleep(&nap, NULL);
  }
  if (!done) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    cr_assert_fail("the child hung writing its report");
  }
  mp_fifo_drain();
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "the child failed (status %#x)", (unsigned)status);

  const char *report = mp_fifo_got + filled;
  cr_assert_geq(mp_fifo_got_n, filled);
  cr_expect_eq(strncmp(report, "{\n  \"mode\": \"pool\"", 18), 0,
               "the report is missing or cut: '%s'", report);
  size_t n = strlen(report);
  cr_expect(n >= 3 && strcmp(report + n - 3, "\n}\n") == 0,
            "the report is not whole: '%s'", report);
}
