/* The lookup of a CUDA runtime that the global scope does not show (a
 * runtime loaded RTLD_LOCAL, found among the loaded objects by name,
 * real.c) while another thread loads a library.
 *
 * glibc's dl_iterate_phdr holds the loader's write lock
 * (dl_load_write_lock) while it calls its callback, and dlopen takes the
 * loader's lock (dl_load_lock) first and the write lock while it adds the
 * new object to the list. A dlopen made from the callback takes the two in
 * the other order: with a dlopen on another thread between them, neither
 * thread went on, and the process hung in its first runtime call.
 *
 * dlopen is wrapped (-Wl,--wrap=dlopen) so that the shim's dlopen of the
 * runtime's name lets the other thread start its dlopen (of a library not
 * loaded yet) first. The scenario runs in a fresh process (this program
 * again, MP_BESIDE_DLOPEN_CHILD set: a constructor runs it and exits), which
 * a hang does not take the test with; not in a forked one, whose threads
 * TSan refuses after a fork of a process with threads (Criterion's). */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "preload/preload.h"

void *__real_dlopen(const char *name, int flags);
void *__wrap_dlopen(const char *name, int flags);

static sem_t go;
static bool armed;

void *__wrap_dlopen(const char *name, int flags) {
  if (armed && (flags & RTLD_NOLOAD) && name != NULL &&
      strstr(name, "libcudart.so") != NULL) {
    armed = false;
    sem_post(&go);
    /* Time for the other thread's dlopen to take the loader's lock (and,
     * where this thread holds the write lock, to wait for it). */
    usleep(300 * 1000);
  }
  return __real_dlopen(name, flags);
}

static void *open_other(void *arg) {
  (void)arg;
  while (sem_wait(&go) != 0)
    ;
  return __real_dlopen(MP_OTHER_LIBRARY, RTLD_NOW | RTLD_LOCAL);
}

/* The child: 0 when the runtime's cudaMalloc was found and the other
 * library loaded. */
static int scenario(void) {
  if (__real_dlopen(MP_LOCAL_CUDART, RTLD_NOW | RTLD_LOCAL) == NULL)
    return 2;
  if (sem_init(&go, 0, 0) != 0)
    return 3;
  pthread_t t;
  if (pthread_create(&t, NULL, open_other, NULL) != 0)
    return 4;
  armed = true;
  const mp__real_cudart_t *rt = mp__pl_real_cudart();
  void *other = NULL;
  pthread_join(t, &other);
  return rt->cudaMalloc != NULL && other != NULL ? 0 : 5;
}

__attribute__((constructor)) static void child_main(void) {
  if (getenv("MP_BESIDE_DLOPEN_CHILD") != NULL)
    _exit(scenario());
}

extern char **environ;

Test(preload_real_cudart_beside_dlopen,
     a_local_runtime_found_while_another_thread_loads) {
  char self[] = "/proc/self/exe";
  char *argv[] = {self, NULL};
  pid_t pid;
  cr_assert_eq(setenv("MP_BESIDE_DLOPEN_CHILD", "1", 1), 0);
  int rc = posix_spawn(&pid, self, NULL, NULL, argv, environ);
  unsetenv("MP_BESIDE_DLOPEN_CHILD");
  cr_assert_eq(rc, 0);
  int status = 0;
  pid_t got = 0;
  for (int i = 0; i < 200 && (got = waitpid(pid, &status, WNOHANG)) == 0; i++)
    usleep(50 * 1000);
  if (got == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    cr_assert_fail(
        "the runtime's lookup and the other thread's dlopen hung (10 s)");
  }
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "the child ended with status %d", status);
}
