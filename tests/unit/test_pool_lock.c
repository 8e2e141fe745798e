/* The pool lock (lock.c): mutual exclusion under contention, a contended
 * taker sleeping until the holder drops it, and the waits for a flagged
 * drop (a device call in flight) ending only when the flag is cleared. */
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
