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
  mp_status_t pst = mp__pool_paused(pool, "mp_pool_alloc_contiguous");
  if (pst != MP_OK) {
    mp__pool_unlock(pool);
    return pst;
  }
  if (overflow) {
    /* As mp_pool_alloc does for a size that cannot be rounded. */
    mp_status_t st =
        mp__pool_oom(pool, pool->cap_is_max ? MP_ELIMIT : MP_ENOMEM, SIZE_MAX);
    mp__pool_unlock(pool);
    return st;
  }
  uint32_t sidx;
  mp__block_t *b = NULL;
  mp__block_t *recs = NULL;
  bool laddered; /* set by the take: the map's room is asked for again */
  mp_status_t st = mp__stream_index(pool, s, &sidx);
  if (st == MP_OK && total > pool->cap)
    st = mp__pool_oom(pool, pool->cap_is_max ? MP_ELIMIT : MP_ENOMEM, total);
  /* Records for the pieces first, so that nothing can fail once the block
   * is cut. */
  if (st == MP_OK && count > 1 &&
      (recs = mp__recs_new(pool, count - 1)) == NULL)
    st = mp__fail(MP_ENOMEM, "out of host memory for block records");
  /* The take may drop the lock: as mp_pool_alloc, in a graph pool. */
  bool graph = st == MP_OK && pool->graph;
  if (graph)
    mp__graph_enter(pool);
  /* Room in the live map before the take, as mp_pool_alloc makes it: a
   * take without the ladder is made live at once, never put back
   * (mp__pool_take); one through the ladder (which may drop the lock) asks
   * again. */
  if (st == MP_OK && !mp__map_reserve(pool, count))
    st = mp__fail(MP_ENOMEM, "out of host memory for the block map");
  if (st == MP_OK)
    st = mp__pool_take_unpaused(pool, total, sidx, &b,
                                "mp_pool_alloc_contiguous", &laddered);
  if (st == MP_OK && laddered && !mp__map_reserve(pool, count)) {
    mp__block_untake(pool, b);
    st = mp__fail(MP_ENOMEM, "out of host memory for the block map");
  }
  if (st != MP_OK) {
    bool last = graph && mp__graph_leave(pool);
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
    (void)mp__graph_leave(pool); /* its blocks are live: not the last */
  mp__pool_unlock(pool);
  return MP_OK;
}
