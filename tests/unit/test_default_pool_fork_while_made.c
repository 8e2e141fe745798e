/* test_default_pool_fork_while_made.c - a child forked while another
 * thread of its parent is making the default pools. glibc's pthread_once
 * runs an initializer again in a child forked while it was running, so the
 * child went on to make pools of its own from the parent's half-made state:
 * here it waited for ever in a device open its parent had begun (any lock
 * the parent's open held would do the same). The child's calls are now
 * refused as they are after the pools were made. The library's
 * pthread_atfork is wrapped (CMake: --wrap; a libc call, so that the wrap
 * holds in a unity build too) so that the fork comes exactly while the
 * parent's thread is making the pools, after their fork handler is
 * registered. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mempool/mempool.h>

int __real_pthread_atfork(void (*prepare)(void), void (*parent)(void),
                          void (*child)(void));
int __wrap_pthread_atfork(void (*prepare)(void), void (*parent)(void),
                          void (*child)(void));

static atomic_int entered; /* makes that reached the wrapper */
static atomic_bool released;

/* The default pools' make registers its handler first of all; the
 * device's own registration comes later, in its open. */
int __wrap_pthread_atfork(void (*prepare)(void), void (*parent)(void),
                          void (*child)(void)) {
  int rc = __real_pthread_atfork(prepare, parent, child);
  if (atomic_fetch_add(&entered, 1) == 0 || !atomic_load(&released))
    while (!atomic_load(&released))
      usleep(1000);
  return rc;
}

static void *first_malloc(void *arg) {
  void **p = arg;
  return (void *)(intptr_t)mp_malloc(p, 4096);
}

/* The child: every default-pool call is refused at once, and none makes
 * pools again (the make would wait for a release no thread of the child
 * gives: the alarm then kills it). */
static int child_checks(void) {
  alarm(10);
  void *q = NULL;
  if (mp_malloc(&q, 4096) != MP_EINVAL || q != NULL)
    return 1;
  if (strstr(mp_last_error(), "forked") == NULL)
    return 2;
  if (mp_default_pool() != NULL)
    return 3;
  if (mp_malloc_async(&q, 4096, NULL) != MP_EINVAL)
    return 4;
  if (atomic_load(&entered) != 1) /* the parent's make, copied */
    return 5;
  return 0;
}

Test(default_pool_fork_while_made, the_child_is_refused_and_opens_nothing) {
  setenv("MEMPOOL_DEVICE", "host", 1);
  unsetenv("MEMPOOL_CONF");
  void *p = NULL;
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, first_malloc, &p), 0);
  while (atomic_load(&entered) == 0)
    usleep(1000);
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0)
    _exit(child_checks());
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  atomic_store(&released, true);
  void *rc;
  cr_assert_eq(pthread_join(t, &rc), 0);
  cr_assert(WIFEXITED(status), "the child was killed (signal %d): it hung",
            WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  cr_assert_eq(WEXITSTATUS(status), 0, "child check %d failed",
               WEXITSTATUS(status));
  /* The parent's pool is made and works. */
  cr_assert_eq((mp_status_t)(intptr_t)rc, MP_OK, "%s", mp_last_error());
  cr_assert_not_null(p);
  cr_expect_geq(atomic_load(&entered), 1);
  cr_expect_eq(mp_free(p), MP_OK, "%s", mp_last_error());
  cr_expect_not_null(mp_default_pool());
}
