/* stream_named.h - for tests that inject faults into one file's stdio
 * stream: whether a stream is open on a file of a given name. */
#ifndef MPBENCH_TEST_STREAM_NAMED_H
#define MPBENCH_TEST_STREAM_NAMED_H

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Whether f is open on a file whose last path component is name (false
 * when name is NULL). */
static inline int stream_named(FILE *f, const char *name) {
  if (name == NULL)
    return 0;
  char fd[64], path[PATH_MAX];
  snprintf(fd, sizeof fd, "/proc/self/fd/%d", fileno(f));
  ssize_t n = readlink(fd, path, sizeof path - 1);
  if (n <= 0)
    return 0;
  path[n] = '\0';
  const char *base = strrchr(path, '/');
  return base != NULL && strcmp(base + 1, name) == 0;
}

#endif /* MPBENCH_TEST_STREAM_NAMED_H */
