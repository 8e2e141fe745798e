/* test_preload_host_lookup_during_reset.c - a cuDevicePrimaryCtxReset (what
 * cudaDeviceReset does) on one thread never destroys the page-locked host
 * pool under a lookup of it on another: a cuMemFree of a pointer the shim
 * does not know asks whether it lies in the host pool's chunks
 * (mp__pl_memory_holds), and the reset destroys that pool (host.c,
 * mp__pl_host_reset). The free may be of another device's memory: the
 * reset's rule (cuda.h, cuDevicePrimaryCtxReset: nothing else may use
 * that device meanwhile) does not forbid it.
 *
 * The interleaving is made with lookup_during_reset.h: the link wraps the
 * host pool's lookup and destruction (-Wl,--wrap). */
#include "lookup_during_reset.h"

mp_status_t __real_mp_host_pool_destroy(mp_host_pool_t *hp);
bool __real_mp__host_pool_contains(mp_host_pool_t *hp, const void *ptr);
mp_status_t __wrap_mp_host_pool_destroy(mp_host_pool_t *hp);
bool __wrap_mp__host_pool_contains(mp_host_pool_t *hp, const void *ptr);

mp_status_t __wrap_mp_host_pool_destroy(mp_host_pool_t *hp) {
  mp_status_t st = __real_mp_host_pool_destroy(hp);
  mp_race_destroyed(hp, st == MP_OK);
  return st;
}

bool __wrap_mp__host_pool_contains(mp_host_pool_t *hp, const void *ptr) {
  return !mp_race_looking(hp) && __real_mp__host_pool_contains(hp, ptr);
}

/* Failed before: the lookup read the pool under the host pool's lock only
 * to take it, and then looked in it without any; the reset destroyed it in
 * between ("a lookup used the host pool after the reset destroyed it"). */
Test(preload_host_lookup_during_reset,
     a_reset_never_destroys_the_host_pool_under_a_lookup,
     .init = mp_race_cuda_mode) {
  mp_race_use_device(0);
  (void)mp_race_shim();
  void *h = NULL;
  mp__curesult a = cuMemAllocHost_v2(&h, 4096);
  cr_assert_eq(a, 0, "cuMemAllocHost: %u (%s)", a, mp_last_error());
  cr_assert_eq(cuMemFreeHost(h), 0, "cuMemFreeHost"); /* the pool stays */
  mp__curesult reset = mp_race_free_foreign_during_reset(NULL, 0);
  cr_expect_eq(reset, MP__CU_SUCCESS, "the reset");
  cr_expect(mp_race.destroyed != NULL, "the reset destroyed no host pool");
  cr_expect_not(mp_race.used_freed,
                "a lookup used the host pool after the reset destroyed it");
}
