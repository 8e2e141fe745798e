/* cli_run.h - mpbench's command from the tests: mpb_main with its
 * arguments, stdout where the test wants it. */
#ifndef MPBENCH_TEST_CLI_RUN_H
#define MPBENCH_TEST_CLI_RUN_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "mpbench.h"

/* mpb_main("mpbench", args...) (args ends with NULL, at most 30 of them);
 * stdout into path unless it is NULL. Its exit status; -1 when stdout
 * cannot be moved. */
static inline int mpb_test_run(const char **args, const char *path) {
  char *argv[32];
  int argc = 0;
  argv[argc++] = "mpbench";
  for (; args[argc - 1] != NULL && argc < 31; argc++)
    argv[argc] = (char *)args[argc - 1];
  argv[argc] = NULL;
  fflush(stdout);
  int saved = -1;
  if (path != NULL) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    saved = dup(1);
    if (fd < 0 || saved < 0 || dup2(fd, 1) < 0)
      return -1;
    close(fd);
  }
  int rc = mpb_main(argc, argv);
  fflush(stdout);
  if (saved >= 0) {
    dup2(saved, 1);
    close(saved);
  }
  return rc;
}

/* mpb_test_run(args, path) with what it writes on stderr into err (n
 * bytes, terminated; empty where it could not be caught). */
static inline int mpb_test_run_err(const char **args, const char *path,
                                   char *err, size_t n) {
  char tmp[] = "/tmp/mp_cli_err_XXXXXX";
  int fd = mkstemp(tmp);
  fflush(stderr);
  int saved = dup(2);
  err[0] = '\0';
  if (fd < 0 || saved < 0 || dup2(fd, 2) < 0) {
    if (saved >= 0)
      close(saved);
    if (fd >= 0) {
      close(fd);
      unlink(tmp);
    }
    return -1;
  }
  int rc = mpb_test_run(args, path);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  ssize_t got = pread(fd, err, n - 1, 0);
  err[got > 0 ? got : 0] = '\0';
  close(fd);
  unlink(tmp);
  return rc;
}

#endif /* MPBENCH_TEST_CLI_RUN_H */
