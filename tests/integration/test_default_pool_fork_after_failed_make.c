/* A child forked from a process whose default pool could not be made: it
 * has no pool of its parent's, so its calls say why there is none, with
 * the parent's status, as the parent's do. They said "this process was
 * forked from the one that made the default pools, whose device memory
 * and stream threads it does not have" (MP_EINVAL), of pools never made:
 * a child of a parent without a GPU (MP_ENODEV) got an invalid argument
 * instead of an unavailable device. Found by a review, 2026-12-07. */
#include <criterion/criterion.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mempool/mempool.h>

/* 0 when every check holds, else the number of the first that failed. */
static int child_checks(mp_status_t parents) {
  alarm(20); /* a hang is a failure, not a stuck test */
  void *p = NULL;
  if (mp_malloc(&p, 4096) != parents || p != NULL)
    return 1;
  if (strstr(mp_last_error(), "forked") != NULL ||
      strstr(mp_last_error(), "nosuchdevice") == NULL)
    return 2;
  if (mp_default_pool() != NULL || mp_last_status() != parents)
    return 3;
  /* A free: no pool holds the pointer, as in the parent. */
  int local;
  if (mp_free(&local) != MP_EINVAL ||
      strncmp(mp_last_error(), "mp_free: ", 9) != 0 ||
      strstr(mp_last_error(), "nosuchdevice") == NULL)
    return 4;
  if (mp_malloc_async(&p, 64, NULL) != parents)
    return 5;
  return 0;
}

/* The child's checks in a fork of this process, asked to exit 0. */
static void in_a_child(int (*checks)(mp_status_t), mp_status_t parents) {
  fflush(NULL);
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0)
    _exit(checks(parents));
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "child check %d failed (signal %d)",
            WIFEXITED(status) ? WEXITSTATUS(status) : -1,
            WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

Test(default_pool_fork_after_failed_make, the_child_gets_the_parents_reason) {
  setenv("MEMPOOL_DEVICE", "nosuchdevice", 1);
  unsetenv("MEMPOOL_CONF");
  void *p = NULL;
  mp_status_t st = mp_malloc(&p, 4096);
  cr_assert_neq(st, MP_OK);
  cr_assert_neq(strstr(mp_last_error(), "nosuchdevice"), NULL, "%s",
                mp_last_error());
  in_a_child(child_checks, st);
}

static int refused_pool_checks(mp_status_t parents) {
  alarm(20);
  void *p = NULL;
  if (mp_malloc(&p, 64) != parents)
    return 1;
  if (strstr(mp_last_error(), "pausable") == NULL)
    return 2;
  return mp_last_status() == parents ? 0 : 3;
}

/* The parent's status is passed on, whatever it is: a device that opens
 * but a pool it refuses (MP_ENOTSUP here), not only MP_EINVAL. */
Test(default_pool_fork_after_failed_make, the_child_gets_the_parents_status) {
  setenv("MEMPOOL_DEVICE", "host:vmm=0", 1);
  setenv("MEMPOOL_CONF", "pausable=1", 1); /* a pool this device refuses */
  void *p = NULL;
  cr_assert_eq(mp_malloc(&p, 64), MP_ENOTSUP, "%s", mp_last_error());
  in_a_child(refused_pool_checks, MP_ENOTSUP);
}
