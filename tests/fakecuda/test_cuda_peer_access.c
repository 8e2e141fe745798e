/* test_cuda_peer_access.c - mp_pool_set_access(pool, peer): another device
 * may read and write the pool's memory, on the chunks mapped already and on
 * those mapped later (cuMemSetAccess per chunk; peer access of contexts
 * does not cover virtual-memory mappings). The fake records which devices
 * each mapping was opened to (cuFakeAccessMask); on a real driver (the GPU
 * twin) only the calls' answers are checked, and one GPU skips. */
#include <pthread.h>
#include <stdlib.h>

#include <cuda.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "fakecuda_test.h"

static int access_mask(void *p) {
  int (*mask)(CUdeviceptr);
  void *sym = fk_test_sym_opt("cuFakeAccessMask");
  if (sym == NULL)
    return -2; /* a real driver: not asked */
  memcpy(&mask, &sym, sizeof sym);
  return mask((CUdeviceptr)(uintptr_t)p);
}

/* On a GPU, devices 1..n-1 must be able to reach device 0's memory at all
 * (cuda.h, cuDeviceCanAccessPeer: 1 "if contexts on dev are capable of
 * directly accessing memory from contexts on peerDev"); machines whose GPUs
 * have no peer path between them refuse the access, which is no fault of
 * the pool's, so the twin skips there. The fake's devices are peers. */
static void skip_unless_peers_of_device_0(int n) {
  if (!fk_is_real())
    return;
  CUresult (*can_access)(int *, CUdevice, CUdevice);
  void *sym = fk_test_sym_opt("cuDeviceCanAccessPeer");
  if (sym == NULL) /* every driver since CUDA 4.0 has it */
    return;
  memcpy(&can_access, &sym, sizeof sym);
  for (int d = 1; d < n; d++) {
    int can = 0;
    cr_assert_eq(can_access(&can, d, 0), CUDA_SUCCESS);
    if (!can)
      cr_skip_test("device %d cannot access device 0's memory", d);
  }
}

static void two_devices(void) {
  setenv("FAKECUDA_DEVICE_COUNT", "2", 1);
}

static void three_devices(void) {
  setenv("FAKECUDA_DEVICE_COUNT", "3", 1);
}

Test(cuda_peer_access, a_peer_gets_access_to_mapped_and_later_chunks,
     .init = two_devices) {
  mp_device_t *d0 = open_dev("cuda:0");
  mp_device_t *d1 = NULL;
  if (mp_device_open("cuda:1", &d1) != MP_OK) {
    mp_device_close(d0);
    cr_skip_test("one device only");
  }
  skip_unless_peers_of_device_0(2);
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(d0, NULL, &pool), MP_OK, "%s", mp_last_error());
  void *a = NULL, *b = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 4u << 20, NULL, &a), MP_OK);
  int before = access_mask(a);
  if (before != -2)
    cr_assert_eq(before, 1, "only device 0 before: %d", before);
  cr_assert_eq(mp_pool_set_access(pool, d1), MP_OK, "%s", mp_last_error());
  if (before != -2)
    cr_assert_eq(access_mask(a), 3, "the mapped chunk: %d", access_mask(a));
  /* Growth after: the new chunk is opened to the peer too. */
  cr_assert_eq(mp_pool_alloc(pool, 64u << 20, NULL, &b), MP_OK);
  if (before != -2)
    cr_assert_eq(access_mask(b), 3, "a later chunk: %d", access_mask(b));
  cr_assert_eq(mp_pool_set_access(pool, d1), MP_OK, "twice is once");
  cr_assert_eq(mp_pool_set_access(pool, d0), MP_OK, "its own device");
  cr_assert_eq(mp_pool_free(pool, a), MP_OK);
  cr_assert_eq(mp_pool_free(pool, b), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(d1);
  mp_device_close(d0);
}

/* The peer's own work on the pool's memory: refused by the fake until
 * mp_pool_set_access (a mapping is accessible only to the devices
 * cuMemSetAccess names; a GPU would fault), allowed after it, on chunks
 * mapped before and after. On a real driver only the legal half runs. */
Test(cuda_peer_access, a_peer_writes_the_pools_memory_only_after_set_access,
     .init = two_devices) {
  mp_device_t *d0 = open_dev("cuda:0");
  mp_device_t *d1 = NULL;
  if (mp_device_open("cuda:1", &d1) != MP_OK) {
    mp_device_close(d0);
    cr_skip_test("one device only");
  }
  skip_unless_peers_of_device_0(2);
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(d0, NULL, &pool), MP_OK, "%s", mp_last_error());
  void *a = NULL, *b = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 1u << 20, NULL, &a), MP_OK);
  bool fake = access_mask(a) != -2;
  if (fake)
    cr_expect_neq(mp_memset_async(d1, a, 7, 1u << 20, NULL), MP_OK,
                  "device 1 wrote device 0's mapping without access");
  cr_assert_eq(mp_pool_set_access(pool, d1), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, 64u << 20, NULL, &b), MP_OK);
  cr_expect_eq(mp_memset_async(d1, a, 7, 1u << 20, NULL), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_memset_async(d1, b, 7, 64u << 20, NULL), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_memcpy_async(d1, b, a, 1u << 20, NULL), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_device_synchronize(d1), MP_OK);
  cr_assert_eq(mp_pool_free(pool, a), MP_OK);
  cr_assert_eq(mp_pool_free(pool, b), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(d1);
  mp_device_close(d0);
}

Test(cuda_peer_access, bad_peers_are_refused) {
  mp_device_t *d0 = open_dev("cuda:0");
  mp_device_t *h = open_dev("host:capacity=64M");
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(d0, NULL, &pool), MP_OK);
  cr_assert_eq(mp_pool_set_access(pool, h), MP_EINVAL);
  cr_assert_eq(mp_pool_set_access(pool, NULL), MP_EINVAL);
  cr_assert_eq(mp_pool_set_access(NULL, d0), MP_EINVAL);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(h);
  mp_device_close(d0);
}

/* ---- a pool with arenas (arenas=N) -------------------------------------- */
typedef struct arena_alloc {
  mp_pool_t *pool;
  void *p;
  mp_status_t st;
} arena_alloc_t;

static void *alloc_4m(void *arg) {
  arena_alloc_t *j = arg;
  j->st = mp_pool_alloc(j->pool, 4u << 20, NULL, &j->p);
  return NULL;
}

/* On a new thread, so in an arena of its own (arenas=4, at most three
 * threads). */
static void *alloc_on_thread(mp_pool_t *pool) {
  arena_alloc_t j = {.pool = pool};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, alloc_4m, &j), 0);
  pthread_join(t, NULL);
  cr_assert_eq(j.st, MP_OK);
  return j.p;
}

/* Every arena made gets the peer (two threads' arenas), an arena made
 * later too, and a peer given while the pool is paused reaches every arena
 * when it resumes. Was MP_EINVAL on a pool with arenas. */
Test(cuda_peer_access, every_arena_and_every_later_arena_gets_the_peer,
     .init = three_devices) {
  mp_device_t *d0 = open_dev("cuda:0");
  mp_device_t *d1 = NULL, *d2 = NULL;
  if (mp_device_open("cuda:1", &d1) != MP_OK ||
      mp_device_open("cuda:2", &d2) != MP_OK) {
    if (d1 != NULL)
      mp_device_close(d1);
    mp_device_close(d0);
    cr_skip_test("fewer than three devices");
  }
  skip_unless_peers_of_device_0(3);
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_assert_eq(mp_pool_config_parse(&cfg, "arenas=4"), MP_OK);
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(d0, &cfg, &pool), MP_OK, "%s", mp_last_error());
  void *a = alloc_on_thread(pool), *b = alloc_on_thread(pool);
  int before = access_mask(a);
  if (before != -2)
    cr_assert_eq(before, 1, "only device 0 before: %d", before);
  cr_assert_eq(mp_pool_set_access(pool, d1), MP_OK, "%s", mp_last_error());
  if (before != -2) {
    cr_expect_eq(access_mask(a), 3, "the first arena: %d", access_mask(a));
    cr_expect_eq(access_mask(b), 3, "the second arena: %d", access_mask(b));
  }
  /* An arena made after. */
  void *c = alloc_on_thread(pool);
  if (before != -2)
    cr_expect_eq(access_mask(c), 3, "a later arena: %d", access_mask(c));
  cr_assert_eq(mp_pool_set_access(pool, d1), MP_OK, "twice is once");
  /* Kept while paused, for the resume (pool.h). */
  cr_assert_eq(mp_pool_pause(pool, 0), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_set_access(pool, d2), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  if (before != -2) {
    cr_expect_eq(access_mask(a), 7, "after the resume: %d", access_mask(a));
    cr_expect_eq(access_mask(b), 7, "after the resume: %d", access_mask(b));
    cr_expect_eq(access_mask(c), 7, "after the resume: %d", access_mask(c));
  }
  cr_assert_eq(mp_pool_free(pool, a), MP_OK);
  cr_assert_eq(mp_pool_free(pool, b), MP_OK);
  cr_assert_eq(mp_pool_free(pool, c), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
  mp_device_close(d2);
  mp_device_close(d1);
  mp_device_close(d0);
}
