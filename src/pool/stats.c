/* stats.c - the pool's counters: reading them, peaks.
 *
 * Every counter but largest_free_bytes is kept current by the operation that
 * changes it (core.c, block.c, segment.c, vrange.c, grow.c, defrag.c, pause.c);
 * largest_free_bytes is read from the free index at the time of the call (the
 * top class's largest block), and live_blocks is the live map's count
 * (mp__stats_copy), alloc_count the frees plus that count (less the blocks
 * the ladder holds there: nladder), free_bytes reserved less allocated (0
 * while paused, mp__free_bytes, and so is free_blocks): no operation pays for
 * these. Reserved counts the strays too (vrange.c: mappings the device would
 * not take back), as the device does, though they serve nothing (not free). A
 * pool with arenas reads as the sum of its arenas (arena.c). */
#include "../structs.h"
#include "pool_internal.h"

void mp__stats_peaks(mp_pool_t *pool) {
  mp_stats_t *s = &pool->st;
  if (s->reserved_bytes > s->peak_reserved_bytes)
    s->peak_reserved_bytes = s->reserved_bytes;
  mp__stats_live_peaks(pool);
}

void mp__stats_live_peaks(mp_pool_t *pool) {
  mp_stats_t *s = &pool->st;
  if (s->allocated_bytes > s->peak_allocated_bytes)
    s->peak_allocated_bytes = s->allocated_bytes;
  if (s->requested_bytes > s->peak_requested_bytes)
    s->peak_requested_bytes = s->requested_bytes;
}

size_t mp__stats_largest_free(const mp_pool_t *pool) {
  const mp__block_t *b = mp__index_largest(pool);
  return b ? b->size : 0;
}

void mp__stats_copy(const mp_pool_t *pool, mp_stats_t *out) {
  *out = pool->st;
  out->live_blocks = mp__map_count(pool);
  /* Every block made live entered the map (mp__block_make_live) and left
   * it again only when it was freed (free_count), or stays there, the
   * blocks freed while imported too (MP__B_HELD): the ladder's held blocks
   * are the map's only entries that were not allocations. */
  out->alloc_count = pool->st.free_count + mp__map_count(pool) - pool->nladder;
  out->free_bytes = mp__free_bytes(pool);
  /* Nor a free block to serve while paused (the resume maps them again). */
  out->free_blocks = pool->paused ? 0 : pool->st.free_blocks;
}

/* One pool's counters now, under its lock. */
static void mp__stats_one(mp_pool_t *pool, mp_stats_t *out) {
  mp__pool_lock(pool);
  mp__stats_copy(pool, out);
  /* A paused pool has no memory to serve from. */
  out->largest_free_bytes = pool->paused ? 0 : mp__stats_largest_free(pool);
  mp__pool_unlock(pool);
}

void mp__stats_add(mp_stats_t *a, const mp_stats_t *b) {
  a->reserved_bytes += b->reserved_bytes;
  a->peak_reserved_bytes += b->peak_reserved_bytes;
  a->allocated_bytes += b->allocated_bytes;
  a->peak_allocated_bytes += b->peak_allocated_bytes;
  a->requested_bytes += b->requested_bytes;
  a->peak_requested_bytes += b->peak_requested_bytes;
  if (b->largest_free_bytes > a->largest_free_bytes)
    a->largest_free_bytes = b->largest_free_bytes;
  a->alloc_count += b->alloc_count;
  a->free_count += b->free_count;
  a->device_alloc_count += b->device_alloc_count;
  a->device_free_count += b->device_free_count;
  a->oom_count += b->oom_count;
  a->free_bytes += b->free_bytes;
  a->segment_count += b->segment_count;
  a->live_blocks += b->live_blocks;
  a->free_blocks += b->free_blocks;
  a->defrag_count += b->defrag_count;
  a->moved_bytes += b->moved_bytes;
  a->alloc_retry_count += b->alloc_retry_count;
}

/* The arenas' counters summed once; false when the cap's shares moved
 * meanwhile (share_seq). */
static bool mp__stats_sum_arenas(mp_pool_t *pool, mp_stats_t *out) {
  uint64_t seq = atomic_load_explicit(&pool->share_seq, memory_order_acquire);
  for (size_t i = 0; i < pool->cfg.arenas; i++) {
    mp_pool_t *a = mp__arena_at(pool, i);
    mp_stats_t s;
    if (a == NULL)
      continue;
    mp__stats_one(a, &s);
    mp__stats_add(out, &s);
  }
  return (seq & 1) == 0 &&
         atomic_load_explicit(&pool->share_seq, memory_order_acquire) == seq;
}

void mp__stats_read(mp_pool_t *pool, mp_stats_t *out) {
  mp__stats_one(pool, out);
  if (pool->arenas == NULL)
    return;
  /* The arenas one after another. Each holds at most its share of the cap
   * when read, and the shares add up to at most the cap; but a share moved
   * from an arena already read to one read later would count twice (the
   * reserved bytes read above max_bytes). So a read that saw the shares
   * move reads again; after a few tries, under the pool's lock, under
   * which they move (not at first: the lock is for rare work). */
  mp_stats_t own = *out;
  for (int tries = 0; tries < 4; tries++) {
    *out = own;
    if (mp__stats_sum_arenas(pool, out))
      return;
  }
  mp__pool_lock(pool);
  *out = own;
  (void)mp__stats_sum_arenas(pool, out);
  mp__pool_unlock(pool);
}

mp_status_t mp_pool_get_stats_sized(mp_pool_t *pool, mp_stats_t *out,
                                    size_t size) {
  if (pool == NULL || out == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_get_stats: %s is NULL",
                    pool == NULL ? "pool" : "out");
  mp_stats_t s;
  mp__stats_read(pool, &s);
  return mp__stats_put("mp_pool_get_stats", &s, out, size);
}

/* MP_STATS_SIZE_V1 bytes (stats.h, "Growing"). */
mp_status_t mp_pool_get_stats(mp_pool_t *pool, mp_stats_t *out) {
  return mp_pool_get_stats_sized(pool, out, MP_STATS_SIZE_V1);
}

mp_status_t mp_pool_reset_peaks(mp_pool_t *pool) {
  if (pool == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_reset_peaks: pool is NULL");
  /* The arenas (if any), then the pool. */
  size_t n = pool->arenas != NULL ? pool->cfg.arenas : 0;
  for (size_t i = 0; i <= n; i++) {
    mp_pool_t *p = i < n ? mp__arena_at(pool, i) : pool;
    if (p == NULL)
      continue;
    mp__pool_lock(p);
    p->st.peak_reserved_bytes = p->st.reserved_bytes;
    p->st.peak_allocated_bytes = p->st.allocated_bytes;
    p->st.peak_requested_bytes = p->st.requested_bytes;
    mp__pool_unlock(p);
  }
  return MP_OK;
}
