/* test_preload_trace_closed_on_exec.c - the trace file (MEMPOOL_TRACE) is
 * opened close-on-exec: a program the traced process execs does not
 * inherit its descriptor (open(2), O_CLOEXEC; fopen's "e" mode). The
 * shim's sources run in this process on the fake driver, started with
 * MEMPOOL_TRACE set; the trace's descriptor is found in /proc/self/fd. */
#include <fcntl.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "in_process.h"

extern char **environ;

static char trace_path[64];

static void traced(void) {
  mp_in_process_trace_to(trace_path, sizeof trace_path, "cloexec");
  mp_in_process_cuda();
}

static void untraced(void) {
  unlink(trace_path);
}

/* The descriptor open on trace_path, or -1. */
static int trace_fd(void) {
  char want[PATH_MAX];
  cr_assert_not_null(realpath(trace_path, want), "no trace file %s",
                     trace_path);
  return mp_in_process_fd_on(trace_path);
}

Test(preload_trace_closed_on_exec, the_trace_descriptor_is_close_on_exec,
     .init = traced, .fini = untraced) {
  int fd = trace_fd();
  cr_assert_geq(fd, 0, "the trace %s is not open", trace_path);
  int flags = fcntl(fd, F_GETFD);
  cr_assert_geq(flags, 0);
  cr_expect(flags & FD_CLOEXEC, "descriptor %d of the trace is inherited", fd);
}

/* What a program the traced process execs sees: no descriptor fd. */
Test(preload_trace_closed_on_exec, an_execd_child_does_not_hold_the_trace,
     .init = traced, .fini = untraced) {
  int fd = trace_fd();
  cr_assert_geq(fd, 0, "the trace %s is not open", trace_path);
  char script[64];
  snprintf(script, sizeof script, "test ! -e /proc/self/fd/%d", fd);
  char *argv[] = {"/bin/sh", "-c", script, NULL};
  pid_t pid;
  cr_assert_eq(posix_spawn(&pid, "/bin/sh", NULL, NULL, argv, environ), 0);
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "the exec'd child holds the trace's descriptor %d", fd);
}
