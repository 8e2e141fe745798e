/* A fork while another thread copies the real driver's table in (real.c's
 * mp__publish, under mp__publish_lock): the child's first lookup of the
 * table must not wait for the lock, which no thread of the child will
 * give back. pthread_once, before the lock, recovered in a forked child;
 * the lock alone left the child's first CUDA call hanging for good.
 *
 * pthread_mutex_lock is wrapped (-Wl,--wrap=pthread_mutex_lock): the first
 * lock the resolving thread takes (the publish lock: the lookups before it
 * take none of the shim's) holds it while the other thread forks. The
 * forked child bounds itself (alarm) and asks for the table; the scenario
 * runs in a child of the test (child_within.h). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <unistd.h>

#include "child_within.h"
#include "preload/preload.h"

int __real_pthread_mutex_lock(pthread_mutex_t *m);
int __wrap_pthread_mutex_lock(pthread_mutex_t *m);

static sem_t held, forked;
static _Thread_local bool arm_here;
static _Atomic bool armed;

int __wrap_pthread_mutex_lock(pthread_mutex_t *m) {
  int rc = __real_pthread_mutex_lock(m);
  bool was = true;
  if (arm_here && atomic_compare_exchange_strong(&armed, &was, false)) {
    sem_post(&held);
    while (sem_wait(&forked) != 0)
      ;
  }
  return rc;
}

static void *resolve(void *arg) {
  (void)arg;
  arm_here = true;
  return (void *)mp__pl_real_cuda();
}

/* The forked child: 0 when it had the driver's table. */
static int in_forked_child(void) {
  alarm(5);
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  return rc->cuMemAlloc_v2 != NULL ? 0 : 5;
}

/* The child of the test: 0 when the forked child and the resolving thread
 * both had the table; 7 when the forked child hung (its alarm ended it)
 * or had no table. */
static int scenario(void) {
  if (sem_init(&held, 0, 0) != 0 || sem_init(&forked, 0, 0) != 0)
    return 2;
  atomic_store(&armed, true);
  pthread_t t;
  if (pthread_create(&t, NULL, resolve, NULL) != 0)
    return 3;
  while (sem_wait(&held) != 0)
    ;
  pid_t pid = fork();
  if (pid == 0)
    _exit(in_forked_child());
  sem_post(&forked);
  void *table = NULL;
  pthread_join(t, &table);
  if (pid < 0 || table == NULL)
    return 4;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid)
    return 6;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 7;
}

MP_CHILD_SCENARIO("MP_FORK_DURING_PUBLISH_CHILD", scenario)

Test(preload_real_cuda_fork_during_publish,
     a_child_forked_while_the_table_is_copied_in_has_it) {
  mp_child_within("MP_FORK_DURING_PUBLISH_CHILD", 20,
                  "the forked child's first lookup");
}
