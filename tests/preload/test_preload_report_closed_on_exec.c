/* test_preload_report_closed_on_exec.c - the report file (MEMPOOL_REPORT)
 * is opened close-on-exec, as the trace is (open(2), O_CLOEXEC): a
 * program another thread execs while the shim writes it at
 * exit does not inherit its descriptor. The report is written by the
 * shim's destructor, so the test runs this executable again as a child
 * (MP_REPORT_CHILD names the file for its findings): its constructor
 * starts the shim's sources on the fake driver, makes one allocation and
 * exits, and the wrapped opener (-Wl,--wrap=mp__pl_record_fopen, which
 * the trace's open does not go through: record.c calls it from within)
 * looks at the report's descriptor as the shim opens it. */
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "in_process.h"

extern char **environ;

FILE *__real_mp__pl_record_fopen(const char *path);
FILE *__wrap_mp__pl_record_fopen(const char *path);

/* Whether a program exec'd now sees descriptor fd: 1 yes, 0 no, -1 when
 * it could not be asked. */
static int execd_sees(int fd) {
  char script[64];
  snprintf(script, sizeof script, "test -e /proc/self/fd/%d", fd);
  char *argv[] = {"/bin/sh", "-c", script, NULL};
  pid_t pid;
  int status = 0;
  if (posix_spawn(&pid, "/bin/sh", NULL, NULL, argv, environ) != 0 ||
      waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
    return -1;
  return WEXITSTATUS(status) == 0;
}

/* In the child: the report's descriptor's FD_CLOEXEC and what an exec'd
 * program sees, written to MP_REPORT_CHILD's file as "cloexec=C execd=E". */
FILE *__wrap_mp__pl_record_fopen(const char *path) {
  FILE *f = __real_mp__pl_record_fopen(path);
  const char *out = getenv("MP_REPORT_CHILD");
  const char *report = getenv("MEMPOOL_REPORT");
  if (f == NULL || out == NULL || report == NULL || strcmp(path, report) != 0)
    return f;
  int fd = mp_in_process_fd_on(path);
  int flags = fd >= 0 ? fcntl(fd, F_GETFD) : -1;
  FILE *o = fopen(out, "w");
  if (o != NULL) {
    fprintf(o, "cloexec=%d execd=%d\n", flags < 0 ? -1 : !!(flags & FD_CLOEXEC),
            execd_sees(fd));
    fclose(o);
  }
  return f;
}

/* The child: pooling on the fake driver (as mp_in_process_cuda, without
 * the test's assertions), one allocation made and freed, and exit (the
 * shim's destructor writes the report). */
__attribute__((constructor)) static void child(void) {
  if (getenv("MP_REPORT_CHILD") == NULL)
    return;
  int st = mp_in_process_child_served();
  if (st != 0)
    _exit(st);
  exit(0);
}

Test(preload_report_closed_on_exec, an_execd_program_does_not_hold_the_report) {
  char report[64], found[64];
  snprintf(report, sizeof report, "/tmp/mp_report_cloexec_%d.json",
           (int)getpid());
  snprintf(found, sizeof found, "/tmp/mp_report_cloexec_%d.txt", (int)getpid());
  unlink(found);
  pid_t pid = mp_in_process_report_child(report, "MP_REPORT_CHILD", found);
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "the child failed (status %#x)", (unsigned)status);
  FILE *f = fopen(found, "r");
  cr_assert_not_null(f, "the child opened no report (%s)", report);
  int cloexec = -2, execd = -2;
  int n = fscanf(f, "cloexec=%d execd=%d", &cloexec, &execd);
  fclose(f);
  unlink(found);
  unlink(report);
  cr_assert_eq(n, 2);
  cr_expect_eq(cloexec, 1,
               "the report's descriptor is inherited (FD_CLOEXEC "
               "not set)");
  cr_expect_eq(execd, 0, "an exec'd program holds the report's descriptor");
}
