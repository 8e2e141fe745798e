/* lock.c - the pool lock, and the one protocol for dropping it around a
 * device call.
 *
 * mp__pool_lock / mp__pool_unlock (inline in pool_internal.h: they are on
 * the hot path) take and drop the lock; in MP_DEBUG builds they also
 * record which thread holds it, so that a function that expects the lock
 * held says so with MP__ASSERT_LOCKED.
 *
 * The lock is one 32-bit word, 0 free, 1 held, 2 held with a sleeper
 * possible: the three-state futex mutex of Drepper's "Futexes Are Tricky"
 * (the algorithm, not its code). Taking a free lock is one compare-and-
 * swap and dropping it one exchange, against some 55 instructions for a
 * pthread mutex round trip (callgrind, bench_pool_pairs): a pair of
 * free + alloc takes it twice. A contended taker sets 2 and sleeps in
 * FUTEX_WAIT until the word changes; a dropper that finds 2 wakes one.
 * It does not spin first: with the pool's data moving between cores, a
 * spinning waiter measured slower than a sleeping one (bench_pool_threads).
 * Waiting for a flag to drop (mp__pool_wait) sleeps on idle_seq, a counter
 * the flag's clearer bumps: read under the lock, so a bump after the
 * lock is dropped makes FUTEX_WAIT return at once (no lost wake-up).
 * Without futex (not Linux) the sleeps are sched_yield loops. Acquire and
 * release orders on the word are what TSan sees. futex(2) is the source
 * for FUTEX_WAIT returning at once when the word differs from the
 * expected value, and for spurious wake-ups (so every wait loops).
 *
 * Invariant: the pool lock is never held across a blocking device call, and
 * is dropped in one of three ways only:
 *  - around a device call that changes what the pool holds (a map, unmap,
 *    allocation, free or reservation: growth and release):
 *    mp__pool_device_begin / mp__pool_device_end, with pool->inflight set
 *    meanwhile. One at a time: mp__pool_wait_idle waits for the one in
 *    flight.
 *  - around a synchronization (waiting for the pool's streams):
 *    mp__pool_sync_begin / mp__pool_sync_end, with pool->syncing set. One
 *    at a time and never beside a grow or release (mp__pool_wait_sync);
 *    growth and frees do not wait for it (the stream it waits for may be
 *    waiting for them).
 *  - around a call out of the pool that takes the lock itself or may take
 *    long (the application's out-of-memory handler, defragmentation, a
 *    short sleep, destroy's wait for its streams): mp__pool_unlock, then
 *    mp__pool_lock, no flag.
 * Whoever drops the lock reads the pool's state again after retaking it:
 * anything may have changed but what the flag it set keeps out. */
#include <limits.h>
#include <sched.h>

#include "pool_internal.h"

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Sleeps while *word == expected (or until a spurious wake-up). */
static void mp__futex_wait(_Atomic uint32_t *word, uint32_t expected) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL,
          0);
}

static void mp__futex_wake(_Atomic uint32_t *word, int n) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}
#else
static void mp__futex_wait(_Atomic uint32_t *word, uint32_t expected) {
  if (atomic_load_explicit(word, memory_order_relaxed) == expected)
    sched_yield();
}

static void mp__futex_wake(_Atomic uint32_t *word, int n) {
  (void)word;
  (void)n;
}
#endif

void mp__pool_lock_wait(mp_pool_t *pool) {
  /* Mark the word contended; whoever holds it wakes a sleeper on drop. */
  while (atomic_exchange_explicit(&pool->lock, 2, memory_order_acquire) != 0)
    mp__futex_wait(&pool->lock, 2);
}

void mp__pool_lock_wake(mp_pool_t *pool) {
  mp__futex_wake(&pool->lock, 1);
}

static void mp__pool_wait(mp_pool_t *pool) {
  uint32_t seq = atomic_load_explicit(&pool->idle_seq, memory_order_relaxed);
  pool->idle_waiters++;
  mp__pool_unlock(pool);
  mp__futex_wait(&pool->idle_seq, seq);
  mp__pool_lock(pool);
  pool->idle_waiters--;
}

/* Under the lock: wakes every mp__pool_wait sleeper (they recheck). */
static void mp__pool_wake_idle(mp_pool_t *pool) {
  if (pool->idle_waiters == 0)
    return;
  atomic_fetch_add_explicit(&pool->idle_seq, 1, memory_order_relaxed);
  mp__futex_wake(&pool->idle_seq, INT_MAX);
}

void mp__pool_wait_idle(mp_pool_t *pool) {
  while (pool->inflight)
    mp__pool_wait(pool);
}

void mp__pool_wait_sync(mp_pool_t *pool) {
  while (pool->inflight || pool->syncing)
    mp__pool_wait(pool);
}

/* The drop of both flagged kinds: *flag marks what is in flight while the
 * lock is down; the retake clears it and wakes whoever waits for it. */
static void mp__pool_drop_flagged(mp_pool_t *pool, bool *flag) {
  MP__ASSERT_LOCKED(pool);
  MP__ASSERT(!*flag);
  *flag = true;
  mp__pool_unlock(pool);
}

static void mp__pool_retake_flagged(mp_pool_t *pool, bool *flag) {
  mp__pool_lock(pool);
  MP__ASSERT(*flag);
  *flag = false;
  mp__pool_wake_idle(pool);
}

void mp__pool_device_begin(mp_pool_t *pool) {
  mp__pool_drop_flagged(pool, &pool->inflight);
}

void mp__pool_device_end(mp_pool_t *pool) {
  mp__pool_retake_flagged(pool, &pool->inflight);
}

void mp__pool_sync_begin(mp_pool_t *pool) {
  mp__pool_wait_sync(pool);
  mp__pool_drop_flagged(pool, &pool->syncing);
}

void mp__pool_sync_end(mp_pool_t *pool) {
  mp__pool_retake_flagged(pool, &pool->syncing);
}
