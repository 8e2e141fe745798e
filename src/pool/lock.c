/* lock.c - the pool lock, and the one protocol for dropping it around a
 * device call.
 *
 * mp__pool_lock / mp__pool_unlock (inline in pool_internal.h: they are on
 * the hot path) take and drop the mutex; in MP_DEBUG builds they also
 * record which thread holds it, so that a function that expects the lock
 * held says so with MP__ASSERT_LOCKED.
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
#include "pool_internal.h"

static void mp__pool_wait(mp_pool_t *pool) {
  MP__ASSERT_LOCKED(pool);
#if MP__LOCK_OWNER
  pool->lock_owned = false;
#endif
  pthread_cond_wait(&pool->idle_cv, &pool->lock);
#if MP__LOCK_OWNER
  pool->lock_owner = pthread_self();
  pool->lock_owned = true;
#endif
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
  pthread_cond_broadcast(&pool->idle_cv);
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
