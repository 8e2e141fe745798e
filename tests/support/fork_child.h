/* fork_child.h - runs a check in a forked child of the test: the child
 * exits with in_child()'s answer (0, or the number of the check that
 * failed) and is killed by SIGALRM after 10 s (a call that hung), and the
 * test expects a clean exit. The child must start no thread (TSan refuses
 * one after a multi-threaded fork). */
#ifndef MEMPOOL_TEST_FORK_CHILD_H
#define MEMPOOL_TEST_FORK_CHILD_H

#include <criterion/criterion.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static inline void expect_child_passes(int (*in_child)(void)) {
  pid_t child = fork();
  cr_assert_geq(child, 0);
  if (child == 0) {
    alarm(10);
    _exit(in_child());
  }
  int status = 0;
  pid_t waited = waitpid(child, &status, 0);
  cr_assert_eq(waited, child);
  cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "the child %s #%d (status %#x)",
            WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM
                ? "hung after check"
                : "failed check",
            WIFEXITED(status) ? WEXITSTATUS(status) : -1, status);
}

#endif /* MEMPOOL_TEST_FORK_CHILD_H */
