/* lookup_during_reset.h - a reset on one thread (cuDevicePrimaryCtxReset,
 * what cudaDeviceReset does) made to run while a lookup of a pool on
 * another thread has that pool in hand: the tests that include it wrap,
 * with -Wl,--wrap, the lookup they check and the pool's destruction, and
 * call mp_race_looking and mp_race_destroyed from the wrappers.
 *
 * The interleaving is made, not waited for: the armed lookup, once it has
 * its pool, waits (up to MP_WAIT_MS) for the reset begun then to destroy
 * it. Where the lookup holds nothing that keeps the pool alive, the reset
 * destroys it meanwhile, and the lookup would read freed memory: the
 * wrapper sees that (mp_race.used_freed) and answers without reading it.
 * Where the lookup does hold the reset off, the wait times out and the
 * reset destroys the pool after the lookup. The shim's sources run in the
 * test's process (no LD_PRELOAD), on the fake driver (tests/fakecuda). */
#ifndef MP_TESTS_PRELOAD_LOOKUP_DURING_RESET_H
#define MP_TESTS_PRELOAD_LOOKUP_DURING_RESET_H

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "preload/hooks.h"

#define MP_WAIT_MS 500

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool armed;            /* the next lookup of a pool waits */
  const void *target;    /* armed for this pool only (NULL: any) */
  bool in_lookup;        /* a lookup has its pool and waits */
  bool used_freed;       /* a lookup had a pool destroyed under it */
  const void *destroyed; /* the pool a reset destroyed last */
} mp_race = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

/* The next lookup of target (NULL: of any pool) waits for its
 * destruction. */
static inline void mp_race_arm(const void *target) {
  pthread_mutex_lock(&mp_race.mu);
  mp_race.armed = true;
  mp_race.target = target;
  pthread_mutex_unlock(&mp_race.mu);
}

/* From the destruction's wrapper, after the real one: ok, it succeeded. */
static inline void mp_race_destroyed(const void *pool, bool ok) {
  pthread_mutex_lock(&mp_race.mu);
  if (ok)
    mp_race.destroyed = pool;
  pthread_cond_broadcast(&mp_race.cv);
  pthread_mutex_unlock(&mp_race.mu);
}

/* From the lookup's wrapper, before the real one: whether pool is
 * destroyed (the wrapper must not read it then). */
static inline bool mp_race_looking(const void *pool) {
  pthread_mutex_lock(&mp_race.mu);
  if (mp_race.armed && pool != NULL &&
      (mp_race.target == NULL || mp_race.target == pool)) {
    mp_race.armed = false;
    mp_race.in_lookup = true;
    pthread_cond_broadcast(&mp_race.cv);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += MP_WAIT_MS * 1000000L;
    until.tv_sec += until.tv_nsec / 1000000000L;
    until.tv_nsec %= 1000000000L;
    while (mp_race.destroyed != pool &&
           pthread_cond_timedwait(&mp_race.cv, &mp_race.mu, &until) !=
               ETIMEDOUT)
      ;
  }
  bool freed = pool != NULL && pool == mp_race.destroyed;
  mp_race.used_freed |= freed;
  pthread_mutex_unlock(&mp_race.mu);
  return freed;
}

typedef struct {
  int ordinal;         /* the device to reset */
  mp__curesult result; /* the reset's */
} mp_race_reset_t;

/* Thread body: once the armed lookup has its pool, resets the device. */
static inline void *mp_race_reset_once_looking(void *arg) {
  mp_race_reset_t *r = arg;
  pthread_mutex_lock(&mp_race.mu);
  while (!mp_race.in_lookup)
    pthread_cond_wait(&mp_race.cv, &mp_race.mu);
  pthread_mutex_unlock(&mp_race.mu);
  r->result = cuDevicePrimaryCtxReset_v2(r->ordinal);
  return NULL;
}

static inline void mp_race_cuda_mode(void) {
  setenv("MEMPOOL_DEVICE", "cuda", 1);
  unsetenv("MEMPOOL_PRELOAD");
  unsetenv("MEMPOOL_CONF");
}

/* As a program starts, or switches devices, on the calling thread: the
 * driver initialized, device `ordinal`'s primary context current (entry
 * points the shim does not hook, from the driver). Whether it is (no
 * assertion: any thread may call it). */
static inline bool mp_race_make_current(int ordinal) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (lib == NULL)
    return false;
  mp__curesult (*init)(unsigned) = NULL;
  mp__curesult (*retain)(void **, int) = NULL;
  mp__curesult (*set)(void *) = NULL;
  *(void **)&init = dlsym(lib, "cuInit");
  *(void **)&retain = dlsym(lib, "cuDevicePrimaryCtxRetain");
  *(void **)&set = dlsym(lib, "cuCtxSetCurrent");
  void *ctx = NULL;
  return init != NULL && retain != NULL && set != NULL && init(0) == 0 &&
         retain(&ctx, ordinal) == 0 && set(ctx) == 0;
}

/* mp_race_make_current on the test's thread, asserted. */
static inline void mp_race_use_device(int ordinal) {
  cr_assert(mp_race_make_current(ordinal), "the fake driver's device %d",
            ordinal);
}

/* The shim started, pooling on the fake driver. */
static inline const mp__pl_t *mp_race_shim(void) {
  const mp__pl_t *pl = mp__pl_get();
  cr_assert(pl != NULL && pl->mode == MP__PL_POOL && !pl->host,
            "the shim is not pooling on the fake driver");
  return pl;
}

/* Arms the lookup of target (NULL: of any pool), resets device `ordinal`
 * on another thread once that lookup has its pool, and meanwhile runs
 * call(arg) here, which is to make that lookup. The reset's result;
 * *looked: whether the call looked in an armed pool. */
static inline mp__curesult mp_race_during_reset(const void *target, int ordinal,
                                                void (*call)(void *), void *arg,
                                                bool *looked) {
  mp_race_arm(target);
  mp_race_reset_t reset = {.ordinal = ordinal, .result = 99};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, mp_race_reset_once_looking, &reset), 0);
  call(arg);
  pthread_mutex_lock(&mp_race.mu);
  *looked = mp_race.in_lookup;
  mp_race.in_lookup = true; /* the reset goes on either way: no hang */
  pthread_cond_broadcast(&mp_race.cv);
  pthread_mutex_unlock(&mp_race.mu);
  pthread_join(t, NULL);
  return reset.result;
}

/* Frees memory the shim never saw (and no driver's): the lookup, then the
 * driver's refusal. */
static inline void mp_race_free_foreign(void *arg) {
  int foreign = 0;
  *(mp__curesult *)arg = cuMemFree_v2((mp__cuptr)(uintptr_t)&foreign);
}

/* Arms the lookup of target (NULL: of any pool), resets device `ordinal`
 * on another thread once that lookup has its pool, and meanwhile frees
 * here memory the shim never saw (and no driver's): the lookup, then the
 * driver's refusal. The reset's result. */
static inline mp__curesult mp_race_free_foreign_during_reset(const void *target,
                                                             int ordinal) {
  mp__curesult r = MP__CU_SUCCESS;
  bool looked = false;
  mp__curesult reset =
      mp_race_during_reset(target, ordinal, mp_race_free_foreign, &r, &looked);
  cr_expect(looked, "the free looked in no armed pool");
  cr_expect_neq(r, MP__CU_SUCCESS, "cuMemFree of a foreign pointer");
  return reset;
}

/* A call on device 0 (an allocation of 4 KiB, its memory in *p) that the
 * next pool destruction, armed, makes on another thread and waits for,
 * while the reset that destroys the pool has not yet reset the device:
 * armed, made and read on the test's thread, the reset's. */
static struct {
  bool armed;
  bool current;   /* the thread had device 0's primary context current */
  mp__curesult a; /* the call's answer */
  void *p;        /* and its memory */
  mp__curesult (*call)(void **p);
} mp_race_in_reset;

static inline void *mp_race_in_reset_main(void *arg) {
  (void)arg;
  mp_race_in_reset.current = mp_race_make_current(0);
  if (mp_race_in_reset.current)
    mp_race_in_reset.a = mp_race_in_reset.call(&mp_race_in_reset.p);
  return NULL;
}

/* From the destruction's wrapper, before the real one: the armed call. */
static inline void mp_race_in_reset_run(void) {
  pthread_t t;
  if (mp_race_in_reset.armed &&
      pthread_create(&t, NULL, mp_race_in_reset_main, NULL) == 0) {
    mp_race_in_reset.armed = false;
    pthread_join(t, NULL);
  }
}

/* Resets device 0 with call armed (what: its name): the reset succeeds,
 * destroys a pool, and call, made during it, succeeds. Its memory. */
static inline void *mp_race_reset_with_call(mp__curesult (*call)(void **),
                                            const char *what) {
  mp_race_in_reset.armed = true;
  mp_race_in_reset.a = 99;
  mp_race_in_reset.call = call;
  mp__curesult reset = cuDevicePrimaryCtxReset_v2(0);
  cr_assert_eq(reset, MP__CU_SUCCESS, "the reset");
  cr_assert_not(mp_race_in_reset.armed, "the reset destroyed no pool");
  cr_assert(mp_race_in_reset.current, "device 0 current on the thread");
  cr_assert_eq(mp_race_in_reset.a, 0, "%s during the reset: %u (%s)", what,
               mp_race_in_reset.a, mp_last_error());
  return mp_race_in_reset.p;
}

#endif
