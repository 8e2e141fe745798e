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
 * loaded yet) first. The scenario runs in a child (child_within.h). */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "child_within.h"
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

MP_CHILD_SCENARIO("MP_BESIDE_DLOPEN_CHILD", scenario)

Test(preload_real_cudart_beside_dlopen,
     a_local_runtime_found_while_another_thread_loads) {
  mp_child_within("MP_BESIDE_DLOPEN_CHILD", 10,
                  "the runtime's lookup and the other thread's dlopen");
}
