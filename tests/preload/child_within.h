/* child_within.h - a scenario that may hang (a deadlock the test looks
 * for), run in a fresh process: this program again, with NAME set in its
 * environment, which a constructor of the test (MP_CHILD_SCENARIO) sees
 * and runs the scenario in, exiting with its status before main. A hang
 * does not take the test with it, and the child is no fork of a process
 * with threads (Criterion's), whose new threads TSan refuses. */
#ifndef MP_TESTS_PRELOAD_CHILD_WITHIN_H
#define MP_TESTS_PRELOAD_CHILD_WITHIN_H

#include <criterion/criterion.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* The constructor that runs fn (its status: 0 for success) in the child
 * that mp_child_within(name, ...) starts. */
#define MP_CHILD_SCENARIO(name, fn)                                            \
  __attribute__((constructor)) static void mp_child_main(void) {               \
    if (getenv(name) != NULL)                                                  \
      _exit(fn());                                                             \
  }

/* Runs the child for name; fails the test when it hangs past seconds or
 * ends other than with status 0. what: the hang, as the failure says it. */
static inline void mp_child_within(const char *name, int seconds,
                                   const char *what) {
  char self[] = "/proc/self/exe";
  char *argv[] = {self, NULL};
  pid_t pid;
  cr_assert_eq(setenv(name, "1", 1), 0);
  int rc = posix_spawn(&pid, self, NULL, NULL, argv, environ);
  unsetenv(name);
  cr_assert_eq(rc, 0);
  int status = 0;
  pid_t got = 0;
  for (int i = 0;
       i < seconds * 20 && (got = waitpid(pid, &status, WNOHANG)) == 0; i++)
    usleep(50 * 1000);
  if (got == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    cr_assert_fail("%s: hung (%d s)", what, seconds);
  }
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "the child ended with status %d", status);
}

#endif
