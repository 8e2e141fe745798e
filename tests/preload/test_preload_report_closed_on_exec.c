/* test_preload_report_closed_on_exec.c - the report file (MEMPOOL_REPORT)
 * is opened close-on-exec, as the trace is (open(2), O_CLOEXEC; fopen's
 * "e" mode): a program another thread execs while the shim writes it at
 * exit does not inherit its descriptor. The report is written by the
 * shim's destructor, so the test runs this executable again as a child
 * (MP_REPORT_CHILD names the file for its findings): its constructor
 * starts the shim's sources on the fake driver, makes one allocation and
 * exits, and the wrapped fopen (-Wl,--wrap=fopen) looks at the report's
 * descriptor as the shim opens it. */
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "in_process.h"

extern char **environ;

FILE *__real_fopen(const char *path, const char *mode);
FILE *__wrap_fopen(const char *path, const char *mode);

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
FILE *__wrap_fopen(const char *path, const char *mode) {
  FILE *f = __real_fopen(path, mode);
  const char *out = getenv("MP_REPORT_CHILD");
  const char *report = getenv("MEMPOOL_REPORT");
  if (f == NULL || out == NULL || report == NULL || strcmp(path, report) != 0)
    return f;
  int fd = fileno(f);
  int flags = fcntl(fd, F_GETFD);
  FILE *o = __real_fopen(out, "w");
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
  setenv("MEMPOOL_DEVICE", "cuda", 1);
  unsetenv("MEMPOOL_PRELOAD");
  unsetenv("MEMPOOL_CONF");
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (lib == NULL)
    _exit(2);
  mp__curesult (*init)(unsigned) = NULL;
  mp__curesult (*retain)(void **, int) = NULL;
  mp__curesult (*set)(void *) = NULL;
  *(void **)&init = dlsym(lib, "cuInit");
  *(void **)&retain = dlsym(lib, "cuDevicePrimaryCtxRetain");
  *(void **)&set = dlsym(lib, "cuCtxSetCurrent");
  void *ctx = NULL;
  mp__cuptr d = 0;
  if (init == NULL || retain == NULL || set == NULL || init(0) != 0 ||
      retain(&ctx, 0) != 0 || set(ctx) != 0 ||
      cuMemAlloc_v2(&d, 4096) != MP__CU_SUCCESS ||
      cuMemFree_v2(d) != MP__CU_SUCCESS)
    _exit(3);
  exit(0);
}

Test(preload_report_closed_on_exec, an_execd_program_does_not_hold_the_report) {
  char report[64], found[64];
  snprintf(report, sizeof report, "/tmp/mp_report_cloexec_%d.json",
           (int)getpid());
  snprintf(found, sizeof found, "/tmp/mp_report_cloexec_%d.txt", (int)getpid());
  unlink(found);
  setenv("MEMPOOL_REPORT", report, 1);
  setenv("MP_REPORT_CHILD", found, 1);
  char *argv[] = {"report_child", NULL};
  pid_t pid;
  cr_assert_eq(posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, environ),
               0);
  unsetenv("MP_REPORT_CHILD");
  unsetenv("MEMPOOL_REPORT");
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
