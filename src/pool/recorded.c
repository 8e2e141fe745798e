/* recorded.c - an allocation whose block is also used on a second stream
 * (mp__pool_alloc_used): mp_pool_alloc on one stream, then
 * mp_pool_record_stream of the other, in one hold of the lock. The host
 * pool allocates every buffer for its own stream and records the caller's
 * (host_pool.c); the two calls took the lock twice and looked the block
 * up again in the live map, which the allocation had just made live. */
#include "pool_internal.h"

/* The record of p's use refused with st: p goes back unused, the
 * refusal's message kept. */
static mp_status_t mp__record_refused(mp_pool_t *pool, void *p, mp_status_t st,
                                      const char **who) {
  mp__error_saved_t why;
  mp__error_save(&why);
  (void)mp_pool_free(pool, p);
  mp__error_restore(&why);
  *who = "mp_pool_record_stream";
  return st;
}

/* The two calls, as they are: a pool with arenas, or one in a rare state
 * (pool->rare: paused, a history, graph pools, ...), where mp_pool_alloc
 * takes paths this file does not copy. */
static mp_status_t mp__alloc_then_record(mp_pool_t *pool, size_t bytes,
                                         mp_stream_t own, mp_stream_t s,
                                         void **out, const char **who) {
  void *p = NULL;
  mp_status_t st = mp_pool_alloc(pool, bytes, own, &p);
  if (st != MP_OK || p == NULL) {
    *out = p;
    return st;
  }
  if ((st = mp_pool_record_stream(pool, p, s)) != MP_OK)
    return mp__record_refused(pool, p, st, who);
  *out = p;
  return MP_OK;
}

mp_status_t mp__pool_alloc_used(mp_pool_t *pool, size_t bytes, mp_stream_t own,
                                mp_stream_t s, void **out, const char **who) {
  *who = "mp_pool_alloc";
  if (MP__UNLIKELY(bytes == 0 || pool->arenas != NULL ||
                   mp__pool_hot(pool) != pool || mp__pool_gate(pool) != NULL))
    return mp__alloc_then_record(pool, bytes, own, s, out, who);
  mp__pool_lock(pool);
  if (MP__UNLIKELY(pool->rare != 0)) {
    mp__pool_unlock(pool);
    return mp__alloc_then_record(pool, bytes, own, s, out, who);
  }
  void *p = NULL;
  /* mp_pool_alloc's plain path: a failure the pool's out-of-memory
   * handler may answer is tried once more (pool.c, mp__pool_alloc_failed:
   * the pool is no arena). The ladder may drop the lock; it holds it
   * again when it returns. */
  mp_status_t st = mp__pool_alloc_locked_hot(pool, bytes, own, &p, true);
  if (MP__UNLIKELY(st != MP_OK) && mp__pool_oom_retry(pool, st, bytes))
    st = mp__pool_alloc_locked(pool, bytes, own, &p);
  if (MP__UNLIKELY(st != MP_OK)) {
    mp__pool_unlock(pool);
    return st;
  }
  /* The block just made live, still under this hold: the record of s as
   * mp_pool_record_stream makes it, s's slot found beside own's (own stays
   * the pool's last stream). s's slot may be missing (forgotten
   * meanwhile; a new one refused: the stream is gone, or no host memory
   * for the table): the block goes back unused. */
  mp__block_t *b = NULL;
  mp__slot_t *slot = NULL;
  uint32_t sidx;
  st = mp__pool_find_live(pool, "mp_pool_record_stream", p, true, false, &b,
                          &slot);
  if (MP__LIKELY(st == MP_OK) &&
      MP__LIKELY((st = mp__stream_index_second(pool, s, &sidx)) == MP_OK))
    mp__stream_add_use(pool, b, sidx);
  mp__pool_unlock(pool);
  if (MP__UNLIKELY(st != MP_OK))
    return mp__record_refused(pool, p, st, who);
  *out = p;
  return MP_OK;
}
