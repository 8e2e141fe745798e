/* alloc.c - an allocation under the lock: what mp_pool_alloc, handles,
 * child pools and graph pools' borrowing share. Refuses while paused,
 * closes the IPC leases whose importers let go (export.c) when blocks are
 * held, rounds, takes a block through the out-of-memory ladder (core.c)
 * and makes it live. The ladder drops the lock, and a pause may run
 * meanwhile: a take that ends in a paused pool is undone (MP_EBUSY). The live
 * map's room is asked for before the block is taken, so that a host failure
 * there changes nothing. */
#include "pool_internal.h"

MP__HOT mp_status_t mp__pool_take_unpaused(mp_pool_t *pool, size_t size,
                                           uint32_t sidx, mp__block_t **out,
                                           const char *fn, bool *laddered) {
  mp_status_t st = mp__pool_take(pool, size, sidx, out, laddered);
  /* Without the ladder the lock was held throughout: no pause ran. */
  if (MP__LIKELY(!*laddered) || MP__LIKELY(!pool->paused))
    return st;
  /* A pause ran while the ladder had the lock dropped (a wait for another
   * thread's growth, a synchronization, a short sleep): the memory the
   * block lies in is unmapped now. */
  if (st == MP_OK)
    mp__block_untake(pool, *out);
  return mp__pool_paused(pool, fn);
}

/* The body of mp__pool_alloc_locked_hot and _done: any takes a block
 * whose work is done on every stream, s's own included. */
static inline __attribute__((always_inline)) mp_status_t
mp__alloc_locked_as(mp_pool_t *pool, size_t bytes, mp_stream_t s, void **out,
                    bool plain, bool any) {
  MP__ASSERT_LOCKED(pool);
  MP__ASSERT(!plain || pool->rare == 0);
  uint32_t sidx;
  mp_status_t st = plain ? MP_OK : mp__pool_paused(pool, "allocation");
  if (!plain && MP__UNLIKELY(pool->nheld > 0) && st == MP_OK)
    mp__export_reap(pool);
  if (st == MP_OK)
    st = mp__stream_index_as(pool, s, &sidx, plain);
  if (st != MP_OK)
    return st;
  size_t size;
  if (!mp__pool_round(pool, bytes, &size) || size > pool->cap)
    return mp__pool_oom(pool, pool->cap_is_max ? MP_ELIMIT : MP_ENOMEM, bytes,
                        MP__HIST_STREAM(pool, sidx));
  /* Room in the live map first, so that a host failure there leaves the
   * device memory as it was; taking may drop the lock (growth), and
   * another thread may fill the room meanwhile: looked at again after
   * (only then: with the lock held throughout, the room is still there). */
  mp__block_t *b = NULL; /* set by a take that succeeds */
  bool laddered;
  if (MP__UNLIKELY(!mp__map_has_room(pool, 1)) && !mp__map_reserve(pool, 1))
    return mp__fail(MP_ENOMEM, "out of host memory for the block map");
  if ((st = mp__pool_take_unpaused(pool, size, any ? UINT32_MAX : sidx, &b,
                                   "allocation", &laddered)) != MP_OK)
    return st;
  if (MP__UNLIKELY(laddered) && !mp__map_has_room(pool, 1) &&
      !mp__map_reserve(pool, 1)) {
    mp__block_untake(pool, b);
    return mp__fail(MP_ENOMEM, "out of host memory for the block map");
  }
  mp__block_make_live(pool, b, bytes, sidx, plain);
  *out = (void *)b->addr;
  return MP_OK;
}

MP__HOT mp_status_t mp__pool_alloc_locked_hot(mp_pool_t *pool, size_t bytes,
                                              mp_stream_t s, void **out,
                                              bool plain) {
  return mp__alloc_locked_as(pool, bytes, s, out, plain, false);
}

mp_status_t mp__pool_alloc_locked(mp_pool_t *pool, size_t bytes, mp_stream_t s,
                                  void **out) {
  return mp__pool_alloc_locked_hot(pool, bytes, s, out, false);
}

mp_status_t mp__pool_alloc_locked_done(mp_pool_t *pool, size_t bytes,
                                       mp_stream_t s, void **out) {
  /* Restored after: a graph pool's take (its own stream's) may run inside
   * another's borrowing (an out-of-memory handler's allocation). */
  mp_stream_t was = mp__take_stream;
  mp__take_stream = s;
  mp_status_t st = mp__alloc_locked_as(pool, bytes, s, out, false, true);
  mp__take_stream = was;
  return st;
}

/* mp__pool_alloc_cached's body; plain: no history to record in; any: a
 * block whose work is done on every stream, s's own included (looked for
 * as a stranger's, mp__pool_alloc_locked_done). */
static inline __attribute__((always_inline)) mp_status_t
mp__alloc_cached_as(mp_pool_t *pool, size_t bytes, mp_stream_t s, void **out,
                    bool lend, bool plain, bool any) {
  MP__ASSERT_LOCKED(pool);
  /* Held blocks (export.c) are not reaped here: they are neither free
   * nor in the index, and the arena reaps them on its other paths. */
  uint32_t sidx = UINT32_MAX; /* stays so for a stranger */
  size_t size;
  mp__block_t *b;
  if (!mp__pool_round(pool, bytes, &size) ||
      (lend && mp__free_bytes(pool) < size))
    return MP__EMISS;
  /* A stream the arena knows only by a capture's mark is a stranger too:
   * looked up (and so kept after the capture) only once a block is
   * lent. */
  bool stranger = any || (lend && !mp__stream_met(pool, s));
  if ((!stranger && mp__stream_index(pool, s, &sidx) != MP_OK) ||
      (!mp__map_has_room(pool, 1) && !mp__map_reserve(pool, 1)) ||
      !mp__pool_take_cached(pool, size, sidx, &b, !stranger))
    return MP__EMISS;
  /* Lent to a stream it did not know: the block's work is done on every
   * stream; now the stream gets its slot. */
  if (stranger && mp__stream_index(pool, s, &sidx) != MP_OK) {
    mp__block_untake(pool, b);
    return MP__EMISS;
  }
  /* An arena records no stack (config.c). */
  mp__block_make_live(pool, b, bytes, sidx, plain);
  *out = (void *)b->addr;
  return MP_OK;
}

mp_status_t mp__pool_alloc_cached_rec(mp_pool_t *pool, size_t bytes,
                                      mp_stream_t s, void **out, bool lend,
                                      bool any) {
  if (pool->paused)
    return MP__EMISS;
  return mp__alloc_cached_as(pool, bytes, s, out, lend, false, any);
}

mp_status_t mp__pool_alloc_cached_off(mp_pool_t *pool, size_t bytes,
                                      mp_stream_t s, void **out) {
  if (pool->paused || pool->hist.ev != NULL || mp__stream_captured(pool, s))
    return MP__EMISS;
  return mp__alloc_cached_as(pool, bytes, s, out, false, true, false);
}

/* One flag for what this path leaves out (cached_off), tested where the
 * paused flag alone was: the same instructions as before arenas kept a
 * history. An arena with a history misses, and its miss path asks
 * mp__pool_alloc_cached_rec first (arena.c). (Deciding here, with a call
 * to the recording body, cost 1.8 instructions a pair: the registers the
 * call needs saved.) */
MP__HOT mp_status_t mp__pool_alloc_cached(mp_pool_t *pool, size_t bytes,
                                          mp_stream_t s, void **out,
                                          bool lend) {
  if (MP__UNLIKELY(pool->cached_off))
    return MP__EOFF; /* mp__pool_alloc_cached_off, on the miss path */
  return mp__alloc_cached_as(pool, bytes, s, out, lend, true, false);
}
