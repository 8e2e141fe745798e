/* A host function (cuLaunchHostFunc runs it on the stream's worker, "after
 * currently enqueued work", cuda.h) that allocates from a pool with arenas
 * at its cap, while another thread's free gives a plain segment of another
 * arena back (release_threshold). That device free waits for the host
 * functions queued on the streams (cuda.h, cuMemFree: "this API may perform
 * implicit synchronization"; the host device's free synchronizes the
 * device), the running one too. The allocation's reclaim (mp__arena_alloc_oom:
 * the share of the cap, then every other arena trimmed) trimmed the
 * releasing arena, and the trim's synchronization waited for the release in
 * flight (mp__pool_wait_sync): the release waited for the host function, the
 * host function for the release, and neither returned. From a host
 * function the reclaim trims nothing now: the request is MP_ELIMIT, and the
 * release goes on. White-box: the device's free is wrapped to tell when the
 * release reaches it. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "../support/device_helpers.h"
#include "../support/pool_helpers.h"
#include "arena_holding.h"
#include "device/backend.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)

static const mp__backend_t *host_ops;
static mp__backend_t ops;
static atomic_bool armed, gate_open;

/* The device free of the released segment: opens the gate of the host
 * function queued before it, then frees (waiting for it). */
static mp_status_t free_opening_the_gate(mp_device_t *d, void *ptr) {
  if (atomic_load(&armed))
    atomic_store(&gate_open, true);
  return host_ops->free(d, ptr);
}

/* dev's frees go through free_opening_the_gate (its own ops put back
 * before it closes). */
static void gate_the_frees(mp_device_t *dev) {
  host_ops = dev->ops;
  ops = *host_ops;
  ops.free = free_opening_the_gate;
  dev->ops = &ops;
}

typedef struct {
  mp_pool_t *pool;
  bool gate_seen; /* false: the gate timed out (no release meanwhile) */
  bool releasing; /* arena 1's device call was in flight at the request */
  unsigned arena; /* the worker's arena (mp__arena_thread - 1, mod 2) */
  mp_status_t st; /* the host function's allocation */
  char why[512];
  void *p;
} host_fn_arg_t;

/* Waits (at most 30 s) for the release's device free, then asks for 64 KiB
 * (no loan: below MP__LARGE_ROUND) in its own arena, which is full. */
static void alloc_after_the_gate(void *v) {
  host_fn_arg_t *a = v;
  for (int ms = 0; ms < 30000 && !atomic_load(&gate_open); ms++) /* 30 s */
    nanosleep(&(struct timespec){0, 1000000}, NULL);
  a->gate_seen = atomic_load(&gate_open);
  mp_pool_t *b = mp__arena_at(a->pool, 1);
  mp__pool_lock(b);
  a->releasing = b->inflight;
  mp__pool_unlock(b);
  a->st = mp_pool_alloc(a->pool, 64 * 1024, NULL, &a->p);
  snprintf(a->why, sizeof a->why, "%s", mp_last_error());
  a->arena = (mp__arena_thread - 1) % 2;
}

static void *filled[3];

/* The second thread to use the pool's arenas: arena 1. filled[0], 1 MiB in
 * a 2 MiB segment (first, while the arena's share has room for a whole
 * one), whose free rest no release can give back; filled[1] and filled[2],
 * 2 MiB in plain segments of their own, filled[2] freed (cached). Returns
 * the first failure's status, or MP_OK. */
static void *fill_arena_1(void *pool) {
  static const size_t sizes[3] = {1 * MiB, 2 * MiB, 2 * MiB};
  mp_status_t st = MP_OK;
  for (int i = 0; i < 3 && st == MP_OK; i++)
    st = mp_pool_alloc(pool, sizes[i], NULL, &filled[i]);
  if (st == MP_OK)
    st = mp_pool_free(pool, filled[2]);
  return (void *)(intptr_t)st;
}

/* max_bytes=8M: arena 0 holds this thread's 2 MiB, arena 1 the other 6.
 * release_threshold=2M: 1 MiB an arena, so arena 1's next free gives the
 * cached 2 MiB segment back (and keeps the 1 MiB rest). */
Test(pool_arenas_reclaim_host_function,
     a_full_pool_answers_elimit_beside_another_arenas_release, .timeout = 60) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  gate_the_frees(dev);
  mp_pool_t *pool =
      make_pool(dev, "max_bytes=8M,arenas=2,release_threshold=2M,virtual=0");
  void *m;
  cr_assert_eq(mp_pool_alloc(pool, 2 * MiB, NULL, &m), MP_OK, "%s",
               mp_last_error());
  pthread_t t;
  void *filled_st;
  cr_assert_eq(pthread_create(&t, NULL, fill_arena_1, pool), 0);
  pthread_join(t, &filled_st);
  cr_assert_eq((mp_status_t)(intptr_t)filled_st, MP_OK,
               "arena 1 not filled: %s",
               mp_status_name((mp_status_t)(intptr_t)filled_st));
  cr_assert_eq(arena_holding(pool, m), 0, "the test needs arena 0 here");
  cr_assert_eq(arena_holding(pool, filled[1]), 1,
               "the test needs arena 1 there");
  mp_stats_t s0 = stats(pool);
  cr_assert_eq(s0.reserved_bytes, 8 * MiB, "the test needs the pool full: %zu",
               (size_t)s0.reserved_bytes);
  cr_assert_eq(s0.segment_count, 4, "the test needs plain segments");

  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  host_fn_arg_t a = {.pool = pool};
  atomic_store(&armed, true);
  cr_assert_eq(mp_stream_launch_host(dev, s, alloc_after_the_gate, &a), MP_OK,
               "%s", mp_last_error());
  /* Gives filled[2]'s segment back first (a free releases before its own block
   * joins the cache), and that device free waits for the host function.
   * It hung here: Criterion's timeout fails the test. */
  cr_expect_eq(mp_pool_free(pool, filled[1]), MP_OK, "%s", mp_last_error());
  atomic_store(&armed, false);
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK, "%s", mp_last_error());
  cr_expect(a.gate_seen, "no device free during the free: the test needs "
                         "the plain segment given back there");
  cr_expect(a.releasing, "arena 1's release was not in flight");
  cr_expect_eq(a.arena, 0, "the host function's arena is not arena 0");
  cr_expect_eq(a.st, MP_ELIMIT, "%s: %s", mp_status_name(a.st), a.why);
  cr_expect_neq(strstr(a.why, "pool max_bytes"), NULL, "%s", a.why);
  if (a.st == MP_OK)
    cr_expect_eq(mp_pool_free(pool, a.p), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(pool).segment_count, 3, "filled[2]'s segment given back");

  /* The pool runs on: the room the release gave back serves this thread. */
  void *q;
  cr_expect_eq(mp_pool_alloc(pool, 64 * 1024, NULL, &q), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_free(pool, q), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, filled[0]), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, m), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  dev->ops = host_ops;
  mp_device_close(dev);
}
