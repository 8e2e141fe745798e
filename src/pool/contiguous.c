/* contiguous.c - mp_pool_alloc_contiguous's pieces: one block taken for
 * their sum, cut into count adjacent live blocks, each freeable alone.
 * Below pool.c and arena.c, which both ask it (a pool, or the calling
 * thread's arena). */
#include "pool_internal.h"

bool mp__pool_pieces_total(const mp_pool_t *pool, size_t count,
                           const size_t *sizes, size_t *total) {
  size_t sum = 0;
  for (size_t i = 0; i < count; i++) {
    size_t r;
    if (!mp__pool_round(pool, sizes[i], &r) || sum > SIZE_MAX - r) {
      *total = SIZE_MAX;
      return false;
    }
    sum += r;
  }
  *total = sum;
  return true;
}

/* One try at the block for the pieces, under the lock (which the take
 * may drop): refused while paused, out of memory for a sum that overflows
 * or exceeds the cap, else taken with room in the live map for every
 * piece and *recs holding the records the cut needs (made once, kept for
 * a second try). The leases importers let go are closed first, as
 * mp_pool_alloc closes them (alloc.c): their held blocks may be what
 * serves the pieces. */
static mp_status_t mp__pieces_take(mp_pool_t *pool, size_t count, size_t total,
                                   bool overflow, mp_stream_t s, uint32_t *sidx,
                                   mp__block_t **recs, mp__block_t **b) {
  mp_status_t st = mp__pool_paused(pool, "mp_pool_alloc_contiguous");
  if (st != MP_OK)
    return st;
  if (pool->nheld > 0)
    mp__export_reap(pool);
  /* The stream before the sizes, as mp_pool_alloc looks: a stream that is
   * none of the device's is bad input (MP_EINVAL), whatever is asked, not
   * an allocation that ran out (no oom_count, no handler). */
  if ((st = mp__stream_index(pool, s, sidx)) != MP_OK)
    return st;
  /* As mp_pool_alloc does for a size that cannot be rounded. */
  if (overflow)
    return mp__pool_oom(pool, pool->cap_is_max ? MP_ELIMIT : MP_ENOMEM,
                        SIZE_MAX, MP__HIST_STREAM(pool, *sidx));
  if (total > pool->cap)
    return mp__pool_oom(pool, pool->cap_is_max ? MP_ELIMIT : MP_ENOMEM, total,
                        MP__HIST_STREAM(pool, *sidx));
  /* Records for the pieces first, so that nothing can fail once the block
   * is cut. */
  if (count > 1 && *recs == NULL &&
      (*recs = mp__recs_new(pool, count - 1)) == NULL)
    return mp__fail(MP_ENOMEM, "out of host memory for block records");
  /* Room in the live map before the take, as mp_pool_alloc makes it: a
   * take without the ladder is made live at once, never put back
   * (mp__pool_take); one through the ladder (which may drop the lock) asks
   * again. */
  if (!mp__map_reserve(pool, count))
    return mp__fail(MP_ENOMEM, "out of host memory for the block map");
  bool laddered;
  st = mp__pool_take_unpaused(pool, total, *sidx, b, "mp_pool_alloc_contiguous",
                              &laddered);
  if (st == MP_OK && laddered && !mp__map_reserve(pool, count)) {
    mp__block_untake(pool, *b);
    st = mp__fail(MP_ENOMEM, "out of host memory for the block map");
  }
  return st;
}

mp_status_t mp__pool_alloc_pieces(mp_pool_t *pool, size_t count,
                                  const size_t *sizes, mp_stream_t s,
                                  void **out) {
  size_t total;
  bool overflow = !mp__pool_pieces_total(pool, count, sizes, &total);
  mp__pool_lock(pool);
  /* A stream that allocates to a graph pool gets the pieces there, as
   * mp_pool_alloc routes it: the parent would hand them to others after
   * their free while the graph's replays still use them. */
  if (MP__UNLIKELY(pool->nroutes > 0)) {
    mp_pool_t *g = mp__graph_route(pool, s);
    if (g != NULL) {
      mp__pool_unlock(pool);
      return mp__pool_alloc_pieces(g, count, sizes, s, out);
    }
  }
  uint32_t sidx = 0;
  mp__block_t *b = NULL;
  mp__block_t *recs = NULL;
  /* The take and the handler may drop the lock: as mp_pool_alloc, in a
   * graph pool. */
  bool graph = pool->graph;
  /* Released, as mp_pool_alloc: no new block for a graph that is gone. */
  if (MP__UNLIKELY(graph && pool->released))
    return mp__graph_refuse_released(pool, "mp_pool_alloc_contiguous");
  bool outer = graph && mp__graph_enter(pool);
  mp_status_t st =
      mp__pieces_take(pool, count, total, overflow, s, &sidx, &recs, &b);
  /* Out of memory: the handler, then once more, as mp_pool_alloc (an
   * arena has none: the arenas' path asks the pool's, arena.c). */
  if (mp__pool_oom_retry(pool, st, total))
    st = graph && pool->released
             ? mp__graph_refuse_retry(pool, "mp_pool_alloc_contiguous")
             : mp__pieces_take(pool, count, total, overflow, s, &sidx, &recs,
                               &b);
  if (st != MP_OK) {
    bool last = graph && mp__graph_leave(pool, outer);
    mp__recs_free(pool, recs);
    mp__pool_unlock(pool);
    mp__graph_finish_if(pool, last);
    return st;
  }
  /* b may exceed total when max_split kept it whole: the last piece gets the
   * slack. */
  mp__block_t *cur = b;
  for (size_t i = 0; i < count; i++) {
    size_t r = 0;
    mp__pool_round(pool, sizes[i], &r);
    out[i] = (void *)cur->addr;
    if (i + 1 < count) {
      mp__block_t *rest = mp__recs_pop(&recs);
      rest->addr = cur->addr + r;
      rest->size = cur->size - r;
      cur->size = r;
      mp__block_link(cur->seg, cur, rest);
      mp__block_make_live(pool, cur, sizes[i], sidx, false);
      cur = rest;
    } else {
      mp__block_make_live(pool, cur, sizes[i], sidx, false);
    }
  }
  if (graph)
    (void)mp__graph_leave(pool, outer); /* its blocks are live: not the last */
  mp__pool_unlock(pool);
  return MP_OK;
}
