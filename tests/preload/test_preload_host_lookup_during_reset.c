/* test_preload_host_lookup_during_reset.c - a cuDevicePrimaryCtxReset (what
 * cudaDeviceReset does) on one thread never destroys the page-locked host
 * pool under a lookup of it on another: a cuMemFree of a pointer the shim
 * does not know asks whether it lies in the host pool's chunks
 * (mp__pl_memory_holds), and the reset destroys that pool (host.c,
 * mp__pl_host_reset). The free may be of another device's memory: the
 * reset's rule (cuda.h, cuDevicePrimaryCtxReset: nothing else may use
 * that device meanwhile) does not forbid it. Nor under an allocation from
 * it: a cuMemAllocHost takes the pool under the host pools' lock and
 * allocates from it after letting go.
 *
 * The interleaving is made with lookup_during_reset.h: the link wraps the
 * host pool's lookup, allocation and destruction (-Wl,--wrap). */
#include "lookup_during_reset.h"

mp_status_t __real_mp_host_pool_destroy(mp_host_pool_t *hp);
bool __real_mp__host_pool_contains(mp_host_pool_t *hp, const void *ptr);
mp_status_t __wrap_mp_host_pool_destroy(mp_host_pool_t *hp);
bool __wrap_mp__host_pool_contains(mp_host_pool_t *hp, const void *ptr);
mp_status_t __real_mp_host_pool_alloc(mp_host_pool_t *hp, size_t bytes,
                                      mp_stream_t s, void **out);
mp_status_t __wrap_mp_host_pool_alloc(mp_host_pool_t *hp, size_t bytes,
                                      mp_stream_t s, void **out);

/* A cuMemAllocHost of 4 KiB (mp_race_reset_with_call). */
static mp__curesult alloc_host_4k(void **p) {
  return cuMemAllocHost_v2(p, 4096);
}

mp_status_t __wrap_mp_host_pool_destroy(mp_host_pool_t *hp) {
  mp_race_in_reset_run();
  mp_status_t st = __real_mp_host_pool_destroy(hp);
  mp_race_destroyed(hp, st == MP_OK);
  return st;
}

bool __wrap_mp__host_pool_contains(mp_host_pool_t *hp, const void *ptr) {
  return !mp_race_looking(hp) && __real_mp__host_pool_contains(hp, ptr);
}

/* An allocation from a destroyed pool answers without touching it. */
mp_status_t __wrap_mp_host_pool_alloc(mp_host_pool_t *hp, size_t bytes,
                                      mp_stream_t s, void **out) {
  return mp_race_looking(hp) ? MP_ENOMEM
                             : __real_mp_host_pool_alloc(hp, bytes, s, out);
}

/* The shim pooling on the fake driver's device 0, its host pool made and
 * cached (a block allocated and freed). */
static void host_pool_cached(void) {
  mp_race_use_device(0);
  (void)mp_race_shim();
  void *h = NULL;
  mp__curesult a = cuMemAllocHost_v2(&h, 4096);
  cr_assert_eq(a, 0, "cuMemAllocHost: %u (%s)", a, mp_last_error());
  cr_assert_eq(cuMemFreeHost(h), 0, "cuMemFreeHost"); /* the pool stays */
}

/* Failed before: the lookup read the pool under the host pool's lock only
 * to take it, and then looked in it without any; the reset destroyed it in
 * between ("a lookup used the host pool after the reset destroyed it"). */
Test(preload_host_lookup_during_reset,
     a_reset_never_destroys_the_host_pool_under_a_lookup,
     .init = mp_race_cuda_mode) {
  host_pool_cached();
  mp__curesult reset = mp_race_free_foreign_during_reset(NULL, 0);
  cr_expect_eq(reset, MP__CU_SUCCESS, "the reset");
  cr_expect(mp_race.destroyed != NULL, "the reset destroyed no host pool");
  cr_expect_not(mp_race.used_freed,
                "a lookup used the host pool after the reset destroyed it");
}

/* A cuMemAllocHost of 4 KiB, its answer in *arg. */
static void alloc_host(void *arg) {
  void *h = NULL;
  *(mp__curesult *)arg = cuMemAllocHost_v2(&h, 4096);
}

/* Failed before: the allocation took the pool under the host pools' lock
 * and allocated from it after letting go; the reset destroyed it in
 * between ("an allocation used the host pool after the reset destroyed
 * it"). The reset now waits for the calls holding the pool it retired. */
Test(preload_host_lookup_during_reset,
     a_reset_never_destroys_the_host_pool_under_an_allocation,
     .init = mp_race_cuda_mode) {
  host_pool_cached();
  mp__curesult a = 99;
  bool allocated = false;
  mp__curesult reset =
      mp_race_during_reset(NULL, 0, alloc_host, &a, &allocated);
  cr_expect(allocated, "the allocation took no host pool");
  cr_expect_eq(reset, MP__CU_SUCCESS, "the reset");
  cr_expect(mp_race.destroyed != NULL, "the reset destroyed no host pool");
  cr_expect_not(mp_race.used_freed,
                "an allocation used the host pool after the reset destroyed "
                "it (its answer %u)",
                a);
}

/* Failed before: a page-locked allocation on the device between the
 * retirement of its host pool and the driver's reset found the slot empty
 * and made a new host pool in the primary context being reset; the reset
 * then destroyed that pool's chunks while the shim still handed out their
 * blocks ("the block allocated during the reset is in a host pool"). Now
 * such a call goes to the driver, whose memory goes with the context. */
Test(preload_host_lookup_during_reset,
     a_page_locked_allocation_during_a_reset_makes_no_host_pool_it_destroys,
     .init = mp_race_cuda_mode) {
  host_pool_cached();
  const mp__pl_t *pl = mp_race_shim();
  void *h = mp_race_reset_with_call(alloc_host_4k, "cuMemAllocHost");
  mp__pl_block_t b;
  bool live = false;
  cr_expect_not(mp__pl_host_block(pl, (uintptr_t)h, &b, &live),
                "the block allocated during the reset is in a host pool "
                "(live: %d), made in the context the reset destroyed",
                live);
  cr_expect_neq(cuMemFreeHost(h), 0,
                "cuMemFreeHost after the reset of the memory allocated "
                "during it: the reset destroyed it");
}
