/* The first lookup of the real driver's table (real.c) while another
 * thread, in a library's constructor, makes its own first call.
 *
 * glibc runs a library's constructors holding the loader's lock
 * (dl_load_lock), which the first lookup's dlopen of libcuda.so.1 takes
 * too. The table was resolved inside pthread_once: a constructor (a
 * static initializer's CUDA call) that asked for the table waited for the
 * once, whose dlopen waited for the constructor's lock, and both threads
 * hung for good.
 *
 * dlopen is wrapped (-Wl,--wrap=dlopen) so that the lookup's dlopen of
 * the driver lets the other thread load the library first (ctor_call.c,
 * whose constructor calls constructor_call below) and waits until its
 * constructor runs. The scenario runs in a child (child_within.h). */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "child_within.h"
#include "preload/preload.h"

void *__real_dlopen(const char *name, int flags);
void *__wrap_dlopen(const char *name, int flags);

static sem_t go, in_constructor;
static _Atomic bool armed;
static const mp__real_cuda_t *seen_in_constructor;

void *__wrap_dlopen(const char *name, int flags) {
  bool was = true;
  if (name != NULL && strcmp(name, "libcuda.so.1") == 0 &&
      atomic_compare_exchange_strong(&armed, &was, false)) {
    sem_post(&go);
    while (sem_wait(&in_constructor) != 0)
      ;
  }
  return __real_dlopen(name, flags);
}

static void constructor_call(void) {
  sem_post(&in_constructor);
  seen_in_constructor = mp__pl_real_cuda();
}

static void *open_other(void *arg) {
  (void)arg;
  while (sem_wait(&go) != 0)
    ;
  return __real_dlopen(MP_CTOR_LIBRARY, RTLD_NOW | RTLD_LOCAL);
}

/* The child: 0 when both threads had the driver's table. */
static int scenario(void) {
  char addr[32];
  snprintf(addr, sizeof addr, "%jx", (uintmax_t)(uintptr_t)constructor_call);
  if (setenv("MP_CTOR_CALL", addr, 1) != 0 || sem_init(&go, 0, 0) != 0 ||
      sem_init(&in_constructor, 0, 0) != 0)
    return 2;
  pthread_t t;
  if (pthread_create(&t, NULL, open_other, NULL) != 0)
    return 3;
  atomic_store(&armed, true);
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  void *other = NULL;
  pthread_join(t, &other);
  return other != NULL && rc->cuMemAlloc_v2 != NULL && seen_in_constructor == rc
             ? 0
             : 4;
}

MP_CHILD_SCENARIO("MP_BESIDE_CONSTRUCTOR_CHILD", scenario)

Test(preload_real_cuda_beside_constructor,
     a_first_lookup_while_a_constructor_makes_its_own) {
  mp_child_within("MP_BESIDE_CONSTRUCTOR_CHILD", 10,
                  "the driver's lookup and the constructor's");
}
