/* The pool lock (lock.c): mutual exclusion under contention, a contended
 * taker sleeping until the holder drops it, and the waits for a flagged
 * drop (a device call in flight) ending only when the flag is cleared; the
 * contended path: takers counted as sleepers and woken in turn, no wake-up
 * lost among many, and a taker that keeps losing still getting in. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

#define THREADS 4
#define ROUNDS  100000

typedef struct shared {
  mp_pool_t *pool;
  uint64_t counter; /* plain: only the lock keeps increments whole */
  uint64_t inside;  /* plain: threads inside the critical section */
  uint64_t overlaps;
  atomic_int stage;
} shared_t;

static void *hammer(void *arg) {
  shared_t *sh = arg;
  for (int i = 0; i < ROUNDS; i++) {
    mp__pool_lock(sh->pool);
    if (sh->inside++ != 0)
      sh->overlaps++;
    sh->counter++;
    sh->inside--;
    mp__pool_unlock(sh->pool);
  }
  return NULL;
}

Test(pool_lock, contended_lock_admits_one_thread_at_a_time) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  shared_t sh = {.pool = make_pool(dev, NULL)};
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, hammer, &sh), 0);
  for (int i = 0; i < THREADS; i++)
    pthread_join(t[i], NULL);
  cr_expect_eq(sh.overlaps, 0);
  cr_expect_eq(sh.counter, (uint64_t)THREADS * ROUNDS);
  /* Dropped for good: a further take does not block. */
  mp__pool_lock(sh.pool);
  mp__pool_unlock(sh.pool);
  mp_pool_destroy(sh.pool);
  fake_close(dev);
}

static void *take_after_holder(void *arg) {
  shared_t *sh = arg;
  atomic_store(&sh->stage, 1);
  mp__pool_lock(sh->pool);
  /* The holder wrote counter before dropping the lock. */
  sh->inside = sh->counter;
  mp__pool_unlock(sh->pool);
  return NULL;
}

Test(pool_lock, a_blocked_taker_gets_the_lock_when_the_holder_drops_it) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  shared_t sh = {.pool = make_pool(dev, NULL)};
  mp__pool_lock(sh.pool);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, take_after_holder, &sh), 0);
  while (atomic_load(&sh.stage) == 0)
    sched_yield();
  usleep(20000); /* let it reach the lock and sleep on it */
  cr_expect_eq(sh.inside, 0, "the taker got in while the lock was held");
  sh.counter = 42;
  mp__pool_unlock(sh.pool);
  pthread_join(t, NULL);
  cr_expect_eq(sh.inside, 42);
  mp_pool_destroy(sh.pool);
  fake_close(dev);
}

static void *wait_for_idle(void *arg) {
  shared_t *sh = arg;
  mp__pool_lock(sh->pool);
  atomic_store(&sh->stage, 1);
  mp__pool_wait_idle(sh->pool); /* drops the lock while inflight */
  /* Back with the lock, after the device call ended. */
  sh->inside = sh->pool->inflight ? 1 : 2;
  sh->overlaps = sh->counter;
  mp__pool_unlock(sh->pool);
  return NULL;
}

Test(pool_lock, waiting_for_a_device_call_ends_only_when_it_ends) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  shared_t sh = {.pool = make_pool(dev, NULL)};
  mp__pool_lock(sh.pool);
  mp__pool_device_begin(sh.pool); /* inflight set, lock dropped */
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, wait_for_idle, &sh), 0);
  while (atomic_load(&sh.stage) == 0)
    sched_yield();
  usleep(20000); /* the waiter is asleep in mp__pool_wait_idle */
  /* The waiter dropped the lock while it waits: it can be taken. */
  mp__pool_lock(sh.pool);
  cr_expect_eq(sh.inside, 0, "the wait ended while the call was in flight");
  sh.counter = 7;
  mp__pool_unlock(sh.pool);
  mp__pool_device_end(sh.pool); /* retakes, clears inflight, wakes */
  mp__pool_unlock(sh.pool);
  pthread_join(t, NULL);
  cr_expect_eq(sh.inside, 2, "the waiter saw inflight still set");
  cr_expect_eq(sh.overlaps, 7);
  mp_pool_destroy(sh.pool);
  fake_close(dev);
}

static void *sync_waiter(void *arg) {
  shared_t *sh = arg;
  mp__pool_lock(sh->pool);
  atomic_fetch_add(&sh->stage, 1);
  mp__pool_sync_begin(sh->pool); /* waits for the sync in flight */
  mp__pool_sync_end(sh->pool);
  sh->counter++;
  mp__pool_unlock(sh->pool);
  return NULL;
}

Test(pool_lock, every_waiter_wakes_when_the_sync_in_flight_ends) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  shared_t sh = {.pool = make_pool(dev, NULL)};
  mp__pool_lock(sh.pool);
  mp__pool_sync_begin(sh.pool); /* syncing set, lock dropped */
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, sync_waiter, &sh), 0);
  while (atomic_load(&sh.stage) < THREADS)
    sched_yield();
  usleep(20000);
  mp__pool_lock(sh.pool);
  cr_expect_eq(sh.counter, 0, "a sync began beside the one in flight");
  mp__pool_unlock(sh.pool);
  mp__pool_sync_end(sh.pool);
  mp__pool_unlock(sh.pool);
  for (int i = 0; i < THREADS; i++)
    pthread_join(t[i], NULL);
  cr_expect_eq(sh.counter, THREADS);
  mp_pool_destroy(sh.pool);
  fake_close(dev);
}

/* ---- the contended path: counted sleepers, the wake, patient retries ---- */

typedef struct sleepers {
  mp_pool_t *pool;
  int rounds;
  unsigned hold_us; /* every 64th round holds the lock this long */
  uint64_t counter; /* plain: only the lock keeps increments whole */
  uint64_t inside, overlaps;
  atomic_int done;
} sleepers_t;

static void *take_rounds(void *arg) {
  sleepers_t *sh = arg;
  for (int i = 0; i < sh->rounds; i++) {
    mp__pool_lock(sh->pool);
    if (sh->inside++ != 0)
      sh->overlaps++;
    sh->counter++;
    /* A long hold sends the other takers to sleep on the lock. */
    if (sh->hold_us != 0 && i % 64 == 0)
      usleep(sh->hold_us);
    sh->inside--;
    mp__pool_unlock(sh->pool);
  }
  atomic_fetch_add(&sh->done, 1);
  return NULL;
}

/* Starts n detached takers of sh; false if one could not start. */
static bool start_takers(sleepers_t *sh, int n) {
  for (int i = 0; i < n; i++) {
    pthread_t t;
    if (pthread_create(&t, NULL, take_rounds, sh) != 0)
      return false;
    pthread_detach(t);
  }
  return true;
}

/* Waits up to ms milliseconds for n takers of sh to finish. A lost wake-up
 * leaves a taker asleep for good: wait a while, not forever. */
static bool takers_done(sleepers_t *sh, int n, int ms) {
  for (int i = 0; i < ms && atomic_load(&sh->done) < n; i++)
    usleep(1000);
  return atomic_load(&sh->done) == n;
}

Test(pool_lock, takers_asleep_on_a_held_lock_all_get_it_once_it_is_dropped) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  sleepers_t sh = {.pool = make_pool(dev, NULL), .rounds = 1};
  mp__pool_lock(sh.pool);
  cr_assert(start_takers(&sh, THREADS));
  /* Each taker counts itself a sleeper on the word before it sleeps (30 s
   * at most for THREADS new threads to get there on a loaded machine). */
  for (int i = 0; i < 30000 && atomic_load(&sh.pool->lock) / MP__LOCK_SLEEPER <
                                   (uint32_t)THREADS;
       i++)
    usleep(1000);
  cr_expect_eq(atomic_load(&sh.pool->lock) / MP__LOCK_SLEEPER, THREADS,
               "the takers did not all go to sleep on the held lock");
  cr_expect_eq(sh.counter, 0, "a taker got in while the lock was held");
  /* One drop: each taker in turn is woken by the drop before it. */
  mp__pool_unlock(sh.pool);
  cr_assert(takers_done(&sh, THREADS, 30000),
            "%d of %d takers still asleep 30 s after the lock was dropped",
            THREADS - atomic_load(&sh.done), THREADS);
  cr_expect_eq(sh.counter, THREADS);
  cr_expect_eq(atomic_load(&sh.pool->lock), 0,
               "the lock word is not back to free: %#x",
               atomic_load(&sh.pool->lock));
  mp_pool_destroy(sh.pool);
  fake_close(dev);
}

Test(pool_lock, takers_mixing_long_and_short_holds_all_finish_one_at_a_time) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  enum { N = 8 };
  sleepers_t sh = {
      .pool = make_pool(dev, NULL), .rounds = 20000, .hold_us = 20};
  cr_assert(start_takers(&sh, N));
  cr_assert(takers_done(&sh, N, 60000),
            "%d of %d takers still blocked after 60 s (a lost wake-up)",
            N - atomic_load(&sh.done), N);
  cr_expect_eq(sh.overlaps, 0);
  cr_expect_eq(sh.counter, (uint64_t)N * 20000);
  cr_expect_eq(atomic_load(&sh.pool->lock), 0,
               "the lock word is not back to free: %#x",
               atomic_load(&sh.pool->lock));
  mp_pool_destroy(sh.pool);
  fake_close(dev);
}

typedef struct hammer2 {
  mp_pool_t *pool;
  atomic_bool stop;
  atomic_int taken; /* the other thread's takes so far */
} hammer2_t;

static void *hammer_until_stopped(void *arg) {
  hammer2_t *h = arg;
  volatile unsigned work = 0;
  while (!atomic_load_explicit(&h->stop, memory_order_relaxed)) {
    mp__pool_lock(h->pool);
    /* A hold of a microsecond or so: a taker woken by the drop before
     * mostly finds the lock retaken, and takes the patient path. */
    for (unsigned i = 0; i < 1000; i++)
      work = work + 1;
    mp__pool_unlock(h->pool);
  }
  return NULL;
}

static void *take_a_hundred(void *arg) {
  hammer2_t *h = arg;
  for (int i = 0; i < 100; i++) {
    mp__pool_lock(h->pool);
    mp__pool_unlock(h->pool);
    atomic_fetch_add(&h->taken, 1);
    usleep(100);
  }
  return NULL;
}

Test(pool_lock,
     a_taker_gets_the_lock_while_another_thread_retakes_it_back_to_back) {
  /* The other thread drops and retakes the lock with nothing between: a
   * taker that failed after a wake retries after a short sleep, and must
   * still get in. */
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  hammer2_t h = {.pool = make_pool(dev, NULL)};
  pthread_t ht, tt;
  cr_assert_eq(pthread_create(&ht, NULL, hammer_until_stopped, &h), 0);
  cr_assert_eq(pthread_create(&tt, NULL, take_a_hundred, &h), 0);
  pthread_detach(tt);
  for (int ms = 0; ms < 30000 && atomic_load(&h.taken) < 100; ms++)
    usleep(1000);
  int taken = atomic_load(&h.taken);
  atomic_store(&h.stop, true);
  pthread_join(ht, NULL);
  cr_assert_eq(taken, 100,
               "the taker got the lock %d times of 100 in 30 s beside a "
               "thread retaking it back to back",
               taken);
  mp_pool_destroy(h.pool);
  fake_close(dev);
}
