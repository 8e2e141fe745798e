/* spawn.h - runs a test program with extra environment and collects what
 * it wrote, for the preload tests (header-only: each test file is one
 * executable). */
#ifndef MEMPOOL_TEST_SPAWN_H
#define MEMPOOL_TEST_SPAWN_H

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct spawn_result {
  int exited;      /* 1: exited normally; 0: killed by a signal */
  int code;        /* exit status, or the signal */
  char out[16384]; /* stdout */
  char err[16384]; /* stderr */
} spawn_result_t;

/* A fresh scratch directory for one test; files are named inside it. */
static inline void scratch_dir(char *dir, size_t cap) {
  snprintf(dir, cap, "/tmp/mp_preload_XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
}

static inline void slurp(const char *path, char *buf, size_t cap) {
  buf[0] = '\0';
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return;
  size_t n = fread(buf, 1, cap - 1, f);
  buf[n] = '\0';
  fclose(f);
}

/* argv: NULL-terminated; env: NULL-terminated "K=V" added (or, with an
 * empty value, removed) on top of this process's environment. */
static inline void spawn(const char *const *argv, const char *const *env,
                         spawn_result_t *r) {
  char dir[64], out_path[96], err_path[96];
  scratch_dir(dir, sizeof dir);
  snprintf(out_path, sizeof out_path, "%s/out", dir);
  snprintf(err_path, sizeof err_path, "%s/err", dir);
  fflush(NULL);
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (o < 0 || e < 0)
      _exit(126);
    dup2(o, 1);
    dup2(e, 2);
    for (size_t i = 0; env != NULL && env[i] != NULL; i++) {
      char kv[8192]; /* room for a path past PATH_MAX */
      snprintf(kv, sizeof kv, "%s", env[i]);
      char *eq = strchr(kv, '=');
      if (eq == NULL)
        continue;
      *eq = '\0';
      if (eq[1] == '\0')
        unsetenv(kv);
      else
        setenv(kv, eq + 1, 1);
    }
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  r->exited = WIFEXITED(status);
  r->code = WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status);
  slurp(out_path, r->out, sizeof r->out);
  slurp(err_path, r->err, sizeof r->err);
  unlink(out_path);
  unlink(err_path);
  rmdir(dir);
}

/* The integer after the word "key=" in s, or -1. */
static inline long long word_value(const char *s, const char *key) {
  char pat[64];
  snprintf(pat, sizeof pat, "%s=", key);
  for (const char *p = strstr(s, pat); p != NULL; p = strstr(p + 1, pat))
    if (p == s || p[-1] == ' ' || p[-1] == '\n')
      return strtoll(p + strlen(pat), NULL, 10);
  return -1;
}

/* Lines of a file that contain needle. */
static inline int count_lines(const char *path, const char *needle) {
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return -1;
  char line[1024];
  int n = 0;
  while (fgets(line, sizeof line, f) != NULL)
    if (strstr(line, needle) != NULL)
      n++;
  fclose(f);
  return n;
}

/* Runs a shell command line (for python3 and mpbench); its exit status. */
static inline int sh(const char *fmt, ...) {
  char cmd[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  int st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

#endif /* MEMPOOL_TEST_SPAWN_H */
