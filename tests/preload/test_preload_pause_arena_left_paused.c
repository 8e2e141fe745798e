/* test_preload_pause_arena_left_paused.c - the shim's process-wide resume
 * (mempool_preload_resume) of a pool with arenas that runs with one arena
 * paused. A pause failing in one arena resumes the arenas it paused; where
 * that resume fails too (a second device failure: another tenant took the
 * memory meanwhile), the arena stays paused, its content kept, "until
 * mp_pool_resume" (pool.h, Arenas), while the pool runs. The shim's resume
 * took such a pool for running ("every pool is running already",
 * MP_EBUSY): the arena's threads got MP_EBUSY from every call for good,
 * and its kept content never came back. Now it resumes that arena.
 *
 * The shim's sources run in this process (no LD_PRELOAD: the test reaches
 * the shim's pool), on the host device. White-box: the state such a
 * double failure leaves (pause.c, mp__arenas_pause: the pool's paused flag
 * cleared, the arena paused with its host copy) is made by pausing that
 * arena alone, as the failed undo leaves it; the host device has no way to
 * fail an unmap of one arena and then a map. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>

#include "pool/pool_internal.h"
#include "preload/hooks.h"

#define MiB ((size_t)1 << 20)

static void host_mode(void) {
  setenv("MEMPOOL_DEVICE", "host:capacity=64M", 1);
  setenv("MEMPOOL_CONF", "arenas=2", 1);
  unsetenv("MEMPOOL_PRELOAD");
}

typedef struct {
  mp_pool_t *pool;
  unsigned char tag;
  void *p;
  mp_status_t st;
} block_t;

/* A block of 1 MiB holding tag, allocated on a thread of its own (so in an
 * arena of its own: a new thread takes the next arena). */
static void *alloc_tagged(void *arg) {
  block_t *b = arg;
  mp_device_t *dev = mp_pool_device(b->pool);
  b->st = mp_pool_alloc(b->pool, MiB, NULL, &b->p);
  if (b->st == MP_OK)
    b->st = mp_memset_async(dev, b->p, b->tag, MiB, NULL);
  if (b->st == MP_OK)
    b->st = mp_device_synchronize(dev);
  return NULL;
}

static void alloc_on_thread(block_t *b) {
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, alloc_tagged, b), 0);
  cr_assert_eq(pthread_join(t, NULL), 0);
  cr_assert_eq(b->st, MP_OK, "%s", mp_last_error());
}

/* Whether b's bytes all hold its tag. */
static bool kept(const block_t *b) {
  mp_device_t *dev = mp_pool_device(b->pool);
  unsigned char *h = malloc(MiB);
  cr_assert_not_null(h);
  cr_assert_eq(mp_memcpy_async(dev, h, b->p, MiB, NULL), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  size_t i = 0;
  while (i < MiB && h[i] == b->tag)
    i++;
  free(h);
  return i == MiB;
}

Test(preload_pause_arena_left_paused, the_process_resume_brings_it_back,
     .init = host_mode) {
  const mp__pl_t *pl = mp__pl_get();
  cr_assert_not_null(pl);
  cr_assert_eq(pl->mode, MP__PL_POOL);
  mp_pool_t *pool = mp__pl_pool_here(pl);
  cr_assert_not_null(pool, "the shim's pool");
  cr_assert_not_null(pool->arenas, "MEMPOOL_CONF's arenas=2");
  block_t a = {.pool = pool, .tag = 0xa1}, b = {.pool = pool, .tag = 0xb2};
  alloc_on_thread(&a);
  alloc_on_thread(&b);
  mp_pool_t *arena_a = mp__arena_owner(pool, a.p),
            *arena_b = mp__arena_owner(pool, b.p);
  cr_assert(arena_a != NULL && arena_b != NULL && arena_a != arena_b,
            "one block in each arena");

  /* What a pause failing in the other arena, whose undo could not map
   * this arena again, leaves: this arena paused (content kept), the pool
   * running. */
  cr_assert_eq(mp_pool_pause(arena_a, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  cr_assert(!mp__pool_is_paused(pool), "the pool runs");
  cr_assert(mp__pool_is_paused(arena_a) && !mp__pool_is_paused(arena_b));
  cr_assert(kept(&b));

  /* The process-wide resume brings that arena back, content and all. */
  int r = mempool_preload_resume();
  cr_assert_eq(r, MP_OK, "the resume answered %d: %s", r, mp_last_error());
  cr_expect(!mp__pool_is_paused(arena_a), "the arena left paused runs again");
  cr_expect(kept(&a), "the arena's kept content came back");
  cr_expect(kept(&b));
  cr_expect_eq(mempool_preload_resume(), MP_EBUSY, "nothing left to resume");

  /* And the process pauses and resumes whole again. */
  cr_assert_eq(mempool_preload_pause(MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  cr_expect(mp__pool_is_paused(arena_a) && mp__pool_is_paused(arena_b));
  cr_assert_eq(mempool_preload_resume(), MP_OK, "%s", mp_last_error());
  cr_expect(kept(&a));
  cr_expect(kept(&b));
  cr_expect_eq(mp_pool_free(pool, a.p), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_free(pool, b.p), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
}
