/* stats.c - the pool's counters: reading them, peaks.
 *
 * Every counter but largest_free_bytes is kept current by the operation that
 * changes it (core.c, block.c, segment.c, vrange.c, grow.c, defrag.c, pause.c);
 * largest_free_bytes is read from the free index at the time of the call (the
 * top class's largest block), so no operation pays for it. Invariant:
 * free_bytes = reserved - allocated. */
#include "../structs.h"
#include "pool_internal.h"

void mp__stats_peaks(mp_pool_t *pool) {
  mp_stats_t *s = &pool->st;
  if (s->reserved_bytes > s->peak_reserved_bytes)
    s->peak_reserved_bytes = s->reserved_bytes;
  if (s->allocated_bytes > s->peak_allocated_bytes)
    s->peak_allocated_bytes = s->allocated_bytes;
  if (s->requested_bytes > s->peak_requested_bytes)
    s->peak_requested_bytes = s->requested_bytes;
}

size_t mp__stats_largest_free(const mp_pool_t *pool) {
  const mp__block_t *b = mp__index_largest(pool);
  return b ? b->size : 0;
}

mp_status_t mp_pool_get_stats_sized(mp_pool_t *pool, mp_stats_t *out,
                                    size_t size) {
  if (pool == NULL || out == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_get_stats: %s is NULL",
                    pool == NULL ? "pool" : "out");
  mp__pool_lock(pool);
  mp_stats_t s = pool->st;
  /* A paused pool has no memory to serve from. */
  s.largest_free_bytes = pool->paused ? 0 : mp__stats_largest_free(pool);
  mp__pool_unlock(pool);
  return mp__stats_put("mp_pool_get_stats", &s, out, size);
}

/* The symbol itself, for callers that do not see the header's macro. */
mp_status_t(mp_pool_get_stats)(mp_pool_t *pool, mp_stats_t *out) {
  return mp_pool_get_stats_sized(pool, out, MP_STATS_SIZE_V1);
}

mp_status_t mp_pool_reset_peaks(mp_pool_t *pool) {
  if (pool == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_reset_peaks: pool is NULL");
  mp__pool_lock(pool);
  pool->st.peak_reserved_bytes = pool->st.reserved_bytes;
  pool->st.peak_allocated_bytes = pool->st.allocated_bytes;
  pool->st.peak_requested_bytes = pool->st.requested_bytes;
  mp__pool_unlock(pool);
  return MP_OK;
}
