/* The out-of-memory ladder and blocks that other streams' recent work
 * holds: when the device is full and the only free block that fits was
 * freed on another stream while the ladder waited for the streams (so its
 * work is newer than that wait), the ladder waits for that work too and
 * serves the request from the block, never handing it out before the work
 * completed, instead of answering MP_ENOMEM beside it. Driven by stream
 * gates on the host device (capacity full), with and without the virtual
 * range. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "../support/pool_helpers.h"
#include "../support/stream_gate.h"
#include <mempool/mempool.h>

#define MiB     ((size_t)1 << 20)
#define NBLOCKS 8

/* The allocation that runs through the ladder, on a thread of its own. */
typedef struct asker {
  mp_pool_t *pool;
  mp_stream_t s;
  void *ptr;
  mp_status_t st;
  char why[256];
  _Atomic bool done;
  _Atomic bool *work_done; /* set by the last gate's host function */
  bool work_done_at_return;
} asker_t;

static void *ask(void *arg) {
  asker_t *a = arg;
  a->st = mp_pool_alloc(a->pool, MiB, a->s, &a->ptr);
  a->work_done_at_return = atomic_load(a->work_done);
  snprintf(a->why, sizeof a->why, "%s", mp_last_error());
  atomic_store(&a->done, true);
  return NULL;
}

/* The second gate: opens the gate, then says so (the work behind it, the
 * marker of the block freed on its stream, completes after it). */
typedef struct last_gate {
  gate_t g;
  _Atomic bool done;
} last_gate_t;

static void last_gate_wait(void *arg) {
  last_gate_t *lg = arg;
  gate_wait(&lg->g);
  atomic_store(&lg->done, true);
}

/* Waits (up to 30 s: 5 s was short for a loaded machine, the asker being
 * a thread of its own) until the asker's ladder reached its synchronization
 * of the streams: the pool counts the retry before it waits, and the lock
 * this stats call takes is free only while the wait runs. */
static void wait_for_retry(mp_pool_t *p, const asker_t *a) {
  for (int i = 0; i < 30000 && stats(p).alloc_retry_count == 0; i++) {
    cr_assert(!atomic_load(&a->done), "the allocation returned early: %d %s",
              a->st, a->why);
    usleep(1000);
  }
  cr_assert_eq(stats(p).alloc_retry_count, 1,
               "the ladder never reached its synchronization");
}

static void
free_block_pending_during_ladder_sync_is_waited_for(const char *spec) {
  mp_device_t *dev = NULL;
  cr_assert_eq(mp_device_open(spec, &dev), MP_OK, "%s", mp_last_error());
  mp_pool_t *p = make_pool(dev, "segment_bytes=8M");
  mp_stream_t a, b;
  cr_assert_eq(mp_stream_create(dev, &a), MP_OK);
  cr_assert_eq(mp_stream_create(dev, &b), MP_OK);
  /* Fill the device on stream b: nothing can grow. */
  void *v[NBLOCKS];
  for (int i = 0; i < NBLOCKS; i++)
    cr_assert_eq(mp_pool_alloc(p, MiB, b, &v[i]), MP_OK, "%s", mp_last_error());
  cr_assert_eq(stats(p).reserved_bytes, NBLOCKS * MiB);
  /* The two neighbours that will make the free block. */
  int x = -1;
  for (int i = 0; i < NBLOCKS && x < 0; i++)
    for (int j = 0; j < NBLOCKS; j++)
      if ((char *)v[j] == (char *)v[i] + MiB) {
        x = i;
        break;
      }
  cr_assert_geq(x, 0, "no two blocks are neighbours");
  void *xp = v[x], *yp = (char *)v[x] + MiB;

  /* Work on b holds x when it is freed. */
  gate_t g1;
  last_gate_t g2 = {.done = false};
  gate_init(&g1);
  gate_init(&g2.g);
  cr_assert_eq(mp_stream_launch_host(dev, b, gate_wait, &g1), MP_OK);
  cr_assert_eq(mp_pool_free(p, xp), MP_OK);

  /* The ask on stream a: x is held by b's work, the device is full, so the
   * ladder ends up waiting for the streams (behind g1). */
  asker_t ak = {.pool = p, .s = a, .done = false, .work_done = &g2.done};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, ask, &ak), 0);
  wait_for_retry(p, &ak);

  /* Meanwhile more work on b uses y, freed behind it: it merges with x, and
   * the merged block now waits for work newer than the ladder's wait. */
  cr_assert_eq(mp_stream_launch_host(dev, b, last_gate_wait, &g2), MP_OK);
  cr_assert_eq(mp_pool_free(p, yp), MP_OK);
  gate_open(&g1);

  /* While the ladder holds the merged block (live in the stats, no
   * caller's), a stale pointer to it is refused, not freed, and it is no
   * allocation yet (waited for 30 s at most). */
  for (int i = 0; i < 30000 && stats(p).live_blocks != NBLOCKS - 1 &&
                  !atomic_load(&ak.done);
       i++)
    usleep(1000);
  if (!atomic_load(&ak.done)) {
    cr_expect_eq(mp_pool_free(p, xp), MP_EINVAL,
                 "a double free took the block the ladder holds");
    cr_expect_eq(mp_pool_record_stream(p, xp, a), MP_EINVAL);
    mp_stats_t h = stats(p);
    if (!atomic_load(&ak.done)) {
      cr_expect_eq(h.alloc_count, NBLOCKS, "the ladder's held block counted");
      cr_expect_eq(h.free_count, 2);
    }
  }

  /* The ladder's wait ends; b's last work still runs until g2 opens: once
   * the allocation returned, or after half a second. */
  for (int i = 0; i < 500 && !atomic_load(&ak.done); i++)
    usleep(1000);
  gate_open(&g2.g);
  pthread_join(t, NULL);

  cr_assert_eq(ak.st, MP_OK,
               "MP_ENOMEM beside a free block that only waited for "
               "another stream's work: %s",
               ak.why);
  cr_expect(ak.work_done_at_return,
            "the block was handed to stream a before b's work on it ended");
  cr_expect((char *)ak.ptr == (char *)xp || (char *)ak.ptr == (char *)yp,
            "%p is not in the freed pair at %p", ak.ptr, xp);
  mp_stats_t s = stats(p);
  cr_expect_eq(s.oom_count, 0);
  cr_expect_eq(s.reserved_bytes, NBLOCKS * MiB);
  cr_expect_eq(s.live_blocks, NBLOCKS - 1);
  cr_expect_eq(s.alloc_count, NBLOCKS + 1);
  cr_expect_eq(s.free_count, 2);
  check(p);

  cr_assert_eq(mp_pool_free(p, ak.ptr), MP_OK);
  for (int i = 0; i < NBLOCKS; i++)
    if (i != x && v[i] != yp)
      cr_assert_eq(mp_pool_free(p, v[i]), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, b), MP_OK);
  gate_destroy(&g1);
  gate_destroy(&g2.g);
  check(p);
  mp_pool_destroy(p);
  mp_stream_destroy(dev, a);
  mp_stream_destroy(dev, b);
  mp_device_close(dev);
}

Test(pool_oom_pending, free_block_pending_during_ladder_sync_is_waited_for) {
  free_block_pending_during_ladder_sync_is_waited_for("host:capacity=8M");
}

Test(pool_oom_pending,
     free_block_pending_during_ladder_sync_is_waited_for_plain) {
  free_block_pending_during_ladder_sync_is_waited_for("host:capacity=8M,vmm=0");
}
