/* test_preload_device_lookup_during_reset.c - a cuDevicePrimaryCtxReset
 * (what cudaDeviceReset does) of one device, on one thread, never destroys
 * that device's pool under a lookup of it on another: a cuMemFree of a
 * pointer the shim does not know asks whether it lies in any device pool's
 * memory (mp__pl_pools_hold), and the reset destroys the device's pool
 * (devices.c, mp__pl_devices_release). Here the free is made in another
 * device's context: the reset's rule (cuda.h, cuDevicePrimaryCtxReset:
 * nothing else may use that device meanwhile) does not forbid it.
 *
 * The interleaving is made with lookup_during_reset.h: the link wraps the
 * pools' lookup and destruction (-Wl,--wrap). */
#include "lookup_during_reset.h"

mp_status_t __real_mp_pool_destroy_ex(mp_pool_t *pool, int *destroyed);
bool __real_mp__pool_contains(mp_pool_t *pool, const void *ptr);
mp_status_t __wrap_mp_pool_destroy_ex(mp_pool_t *pool, int *destroyed);
bool __wrap_mp__pool_contains(mp_pool_t *pool, const void *ptr);

/* A cuMemAlloc of 4 KiB (mp_race_reset_with_call). */
static mp__curesult alloc_4k(void **p) {
  mp__cuptr d = 0;
  mp__curesult r = cuMemAlloc_v2(&d, 4096);
  *p = (void *)(uintptr_t)d;
  return r;
}

mp_status_t __wrap_mp_pool_destroy_ex(mp_pool_t *pool, int *destroyed) {
  mp_race_in_reset_run();
  int gone = 0;
  mp_status_t st = __real_mp_pool_destroy_ex(pool, &gone);
  if (destroyed != NULL)
    *destroyed = gone;
  mp_race_destroyed(pool, gone != 0);
  return st;
}

bool __wrap_mp__pool_contains(mp_pool_t *pool, const void *ptr) {
  return !mp_race_looking(pool) && __real_mp__pool_contains(pool, ptr);
}

/* A pause or resume of a destroyed pool answers without touching it. */
mp_status_t __real_mp_pool_pause(mp_pool_t *pool, unsigned flags);
mp_status_t __real_mp_pool_resume(mp_pool_t *pool);
mp_status_t __wrap_mp_pool_pause(mp_pool_t *pool, unsigned flags);
mp_status_t __wrap_mp_pool_resume(mp_pool_t *pool);

mp_status_t __wrap_mp_pool_pause(mp_pool_t *pool, unsigned flags) {
  return mp_race_looking(pool) ? MP_EINVAL : __real_mp_pool_pause(pool, flags);
}

mp_status_t __wrap_mp_pool_resume(mp_pool_t *pool) {
  return mp_race_looking(pool) ? MP_EINVAL : __real_mp_pool_resume(pool);
}

static void two_devices(void) {
  mp_race_cuda_mode();
  setenv("FAKECUDA_DEVICE_COUNT", "2", 1);
}

/* Failed before: the lookup collected the pools under the walk lock and
 * looked in them after releasing it; the reset destroyed device 0's pool
 * in between ("a lookup used device 0's pool after the reset destroyed
 * it"). */
/* Device 0's pool, made (a block allocated and freed: the pool stays),
 * and device 1 current on this thread, which leaves device 0 to the
 * reset. */
static mp_pool_t *device_0_pool(void) {
  mp_race_use_device(0);
  const mp__pl_t *pl = mp_race_shim();
  mp__cuptr d = 0;
  mp__curesult a = cuMemAlloc_v2(&d, 4096);
  cr_assert_eq(a, 0, "cuMemAlloc: %u (%s)", a, mp_last_error());
  cr_assert_eq(cuMemFree_v2(d), 0, "cuMemFree");
  mp_pool_t *pool0 = mp__pl_pool_first(pl);
  cr_assert_not_null(pool0, "device 0 has no pool");
  mp_race_use_device(1);
  return pool0;
}

Test(preload_device_lookup_during_reset,
     a_reset_never_destroys_a_device_pool_under_a_lookup, .init = two_devices) {
  mp_pool_t *pool0 = device_0_pool();
  mp__curesult reset = mp_race_free_foreign_during_reset(pool0, 0);
  cr_expect_eq(reset, MP__CU_SUCCESS, "the reset");
  cr_expect_eq(mp_race.destroyed, (const void *)pool0,
               "the reset did not destroy device 0's pool");
  cr_expect_not(mp_race.used_freed,
                "a lookup used device 0's pool after the reset destroyed it");
}

/* mempool_preload_pause(0) or, with *arg true, mempool_preload_resume();
 * its answer in *arg. */
static void pause_or_resume(void *arg) {
  int *r = arg;
  *r = *r ? mempool_preload_resume() : mempool_preload_pause(0);
}

/* The process-wide pause (resume: the resume) on this thread while device
 * 0 is reset on another, once the pause has device 0's pool in hand. */
static void pause_during_reset(bool resume) {
  mp_pool_t *pool0 = device_0_pool();
  if (resume)
    cr_assert_eq(mempool_preload_pause(0), 0, "the pause before the resume");
  int r = resume;
  bool looked = false;
  mp__curesult reset =
      mp_race_during_reset(pool0, 0, pause_or_resume, &r, &looked);
  cr_expect(looked, "the %s took no pool", resume ? "resume" : "pause");
  cr_expect_eq(reset, MP__CU_SUCCESS, "the reset");
  cr_expect_eq(mp_race.destroyed, (const void *)pool0,
               "the reset did not destroy device 0's pool");
  cr_expect_not(mp_race.used_freed,
                "the %s used device 0's pool after the reset destroyed it",
                resume ? "resume" : "pause");
  cr_expect_eq(r, 0, "the %s: %d (%s)", resume ? "resume" : "pause", r,
               mp_last_error());
}

/* Failed before: the pause collected the pools under the walk lock and
 * paused them after releasing it; the reset destroyed device 0's pool in
 * between ("the pause used device 0's pool after the reset destroyed
 * it"). */
Test(preload_device_lookup_during_reset,
     a_reset_never_destroys_a_device_pool_under_a_pause, .init = two_devices) {
  pause_during_reset(false);
}

/* Failed before, as the pause. */
Test(preload_device_lookup_during_reset,
     a_reset_never_destroys_a_device_pool_under_a_resume, .init = two_devices) {
  pause_during_reset(true);
}

/* Failed before: a cuMemAlloc on the device between the retirement of its
 * pool and the driver's reset found the slot empty and made a new pool in
 * the primary context being reset; the reset then destroyed that pool's
 * memory while the shim still held it as its cache and handed it out ("the
 * block allocated during the reset is in a device pool"). Such a call
 * breaks cuda.h's rule for cuDevicePrimaryCtxReset ("it is responsibility
 * of the calling function to ensure that no other module in the process
 * is using the device any more"), and the shim keeps the driver's answer
 * for it: the driver serves it, and its memory goes with the context. */
Test(preload_device_lookup_during_reset,
     an_allocation_during_a_reset_makes_no_pool_it_destroys,
     .init = mp_race_cuda_mode) {
  mp_race_use_device(0);
  const mp__pl_t *pl = mp_race_shim();
  mp__cuptr d = 0;
  cr_assert_eq(cuMemAlloc_v2(&d, 4096), 0, "cuMemAlloc: %s", mp_last_error());
  cr_assert_eq(cuMemFree_v2(d), 0, "cuMemFree");
  void *p = mp_race_reset_with_call(alloc_4k, "cuMemAlloc");
  mp__pl_block_t b;
  cr_expect_not(mp__pl_table_find_pool((uintptr_t)p, &b),
                "the block allocated during the reset is in a device pool");
  /* After the reset (the primary context made again, as a program's
   * next call does) the device gets a pool again. */
  mp_race_use_device(0);
  mp__curesult a = cuMemAlloc_v2(&d, 4096);
  cr_assert_eq(a, 0, "cuMemAlloc after the reset: %u (%s)", a, mp_last_error());
  cr_expect_not_null(mp__pl_pool_first(pl), "no pool after the reset");
  cr_expect(mp__pl_table_find_pool((uintptr_t)d, &b), "not the pool's");
  cr_expect_eq(cuMemFree_v2(d), 0, "cuMemFree");
}
