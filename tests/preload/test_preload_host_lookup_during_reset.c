/* test_preload_host_lookup_during_reset.c - a cuDevicePrimaryCtxReset (what
 * cudaDeviceReset does) on one thread never destroys the page-locked host
 * pool under a lookup of it on another: a cuMemFree of a pointer the shim
 * does not know asks whether it lies in the host pool's chunks
 * (mp__pl_memory_holds), and the reset destroys that pool (host.c,
 * mp__pl_host_reset). The free may be of another device's memory: the
 * reset's rule (cuda.h, cuDevicePrimaryCtxReset: nothing else may use
 * that device meanwhile) does not forbid it.
 *
 * The interleaving is made, not waited for: the link wraps the host pool's
 * lookup and destruction (-Wl,--wrap), so the lookup, once it has the pool,
 * waits (up to MP_WAIT_MS) for the reset begun then to destroy it. Where
 * the lookup holds nothing that keeps the pool alive, the reset destroys
 * it meanwhile, and the lookup would read freed memory: the wrapper sees
 * that and answers without reading it. The shim's sources run in this
 * process (no LD_PRELOAD), on the fake driver (tests/fakecuda). */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "preload/hooks.h"

#define MP_WAIT_MS 500

mp_status_t __real_mp_host_pool_destroy(mp_host_pool_t *hp);
bool __real_mp__host_pool_contains(mp_host_pool_t *hp, const void *ptr);
mp_status_t __wrap_mp_host_pool_destroy(mp_host_pool_t *hp);
bool __wrap_mp__host_pool_contains(mp_host_pool_t *hp, const void *ptr);

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool armed;      /* the next lookup of a pool waits */
  bool in_lookup;  /* a lookup has its pool and waits */
  bool used_freed; /* a lookup had a pool destroyed under it */
  mp_host_pool_t *destroyed;
} mp_race = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

mp_status_t __wrap_mp_host_pool_destroy(mp_host_pool_t *hp) {
  mp_status_t st = __real_mp_host_pool_destroy(hp);
  pthread_mutex_lock(&mp_race.mu);
  if (st == MP_OK)
    mp_race.destroyed = hp;
  pthread_cond_broadcast(&mp_race.cv);
  pthread_mutex_unlock(&mp_race.mu);
  return st;
}

bool __wrap_mp__host_pool_contains(mp_host_pool_t *hp, const void *ptr) {
  pthread_mutex_lock(&mp_race.mu);
  if (mp_race.armed && hp != NULL) {
    mp_race.armed = false;
    mp_race.in_lookup = true;
    pthread_cond_broadcast(&mp_race.cv);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += MP_WAIT_MS * 1000000L;
    until.tv_sec += until.tv_nsec / 1000000000L;
    until.tv_nsec %= 1000000000L;
    while (mp_race.destroyed != hp &&
           pthread_cond_timedwait(&mp_race.cv, &mp_race.mu, &until) !=
               ETIMEDOUT)
      ;
  }
  bool freed = hp != NULL && hp == mp_race.destroyed;
  mp_race.used_freed |= freed;
  pthread_mutex_unlock(&mp_race.mu);
  return !freed && __real_mp__host_pool_contains(hp, ptr);
}

static void *reset_once_looking(void *out) {
  pthread_mutex_lock(&mp_race.mu);
  while (!mp_race.in_lookup)
    pthread_cond_wait(&mp_race.cv, &mp_race.mu);
  pthread_mutex_unlock(&mp_race.mu);
  *(mp__curesult *)out = cuDevicePrimaryCtxReset_v2(0);
  return NULL;
}

static void cuda_mode(void) {
  setenv("MEMPOOL_DEVICE", "cuda", 1);
  unsetenv("MEMPOOL_PRELOAD");
  unsetenv("MEMPOOL_CONF");
}

/* As a program starts: the driver initialized, device 0's primary context
 * current (entry points the shim does not hook, from the driver). */
static void start_driver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  cr_assert_not_null(lib, "the fake driver: %s", dlerror());
  mp__curesult (*init)(unsigned) = NULL;
  mp__curesult (*retain)(void **, int) = NULL;
  mp__curesult (*set)(void *) = NULL;
  *(void **)&init = dlsym(lib, "cuInit");
  *(void **)&retain = dlsym(lib, "cuDevicePrimaryCtxRetain");
  *(void **)&set = dlsym(lib, "cuCtxSetCurrent");
  cr_assert(init != NULL && retain != NULL && set != NULL);
  void *ctx = NULL;
  cr_assert(init(0) == 0 && retain(&ctx, 0) == 0 && set(ctx) == 0,
            "the fake driver's device 0");
}

/* Failed before: the lookup read the pool under the host pool's lock only
 * to take it, and then looked in it without any; the reset destroyed it in
 * between ("a lookup used the host pool after the reset destroyed it"). */
Test(preload_host_lookup_during_reset,
     a_reset_never_destroys_the_host_pool_under_a_lookup, .init = cuda_mode) {
  start_driver();
  const mp__pl_t *pl = mp__pl_get();
  cr_assert(pl != NULL && pl->mode == MP__PL_POOL && !pl->host,
            "the shim is not pooling on the fake driver");
  void *h = NULL;
  mp__curesult a = cuMemAllocHost_v2(&h, 4096);
  cr_assert_eq(a, 0, "cuMemAllocHost: %u (%s)", a, mp_last_error());
  cr_assert_eq(cuMemFreeHost(h), 0, "cuMemFreeHost"); /* the pool stays */
  pthread_mutex_lock(&mp_race.mu);
  mp_race.armed = true;
  pthread_mutex_unlock(&mp_race.mu);
  mp__curesult reset = 99;
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, reset_once_looking, &reset), 0);
  /* Memory the shim never saw (and no driver's): the lookup, then the
   * driver's refusal. */
  int foreign = 0;
  mp__curesult r = cuMemFree_v2((mp__cuptr)(uintptr_t)&foreign);
  pthread_join(t, NULL);
  cr_expect_neq(r, MP__CU_SUCCESS, "cuMemFree of a foreign pointer");
  cr_expect_eq(reset, MP__CU_SUCCESS, "the reset");
  cr_expect(mp_race.destroyed != NULL, "the reset destroyed no host pool");
  cr_expect_not(mp_race.used_freed,
                "a lookup used the host pool after the reset destroyed it");
}
