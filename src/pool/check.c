/* check.c - mp_pool_check: walks every invariant of a pool.
 *
 * Segments do not overlap; each segment's blocks tile it in address order
 * with consistent prev/next/seg links and aligned non-zero sizes; a free
 * block is in the treap of its class and never next to another free block;
 * a live block is in the live map, whose room is no more than it holds;
 * class bitmaps are set exactly for the
 * non-empty classes and each treap is ordered and heap-ordered; the stats
 * equal what the blocks add up to. Cost O(blocks log blocks); for tests and
 * debugging, never on a hot path. */
#include <stdlib.h>

#include "pool_internal.h"

static int mp__cmp_seg(const void *a, const void *b) {
  const mp__segment_t *x = *(mp__segment_t *const *)a;
  const mp__segment_t *y = *(mp__segment_t *const *)b;
  return x->base < y->base ? -1 : x->base > y->base;
}

#define MP__CORRUPT(...)                                                       \
  return mp__fail(MP_ECORRUPT, "pool check: " __VA_ARGS__)

/* A virtual range's chunks are ascending and disjoint, the last ends at the
 * top, and every gap between them (or below the first) is one hole block:
 * so no block spans a hole and no hole hides mapped memory. */
static mp_status_t mp__check_chunks(const mp__segment_t *s) {
  uintptr_t c = s->base;
  size_t gaps = 0, mapped = 0;
  const mp__block_t *b = s->first;
  for (size_t i = 0; i < s->nchunks; i++) {
    uintptr_t a = s->chunks[i].addr;
    if (a < c || s->chunks[i].size == 0)
      MP__CORRUPT("virtual chunk %zu at %p overlaps the one below or is empty",
                  i, (void *)a);
    if (a > c) {
      while (b != NULL && b->addr < c)
        b = b->next;
      if (b == NULL || b->addr != c || !(b->flags & MP__B_HOLE) ||
          b->addr + b->size != a)
        MP__CORRUPT("unmapped gap %p..%p is not exactly one hole block",
                    (void *)c, (void *)a);
      gaps++;
    }
    mapped += s->chunks[i].size;
    c = a + s->chunks[i].size;
  }
  if (c != s->base + s->span || mapped != s->size || gaps != s->nholes)
    MP__CORRUPT("virtual chunks end at %p and map %zu bytes with %zu gaps; "
                "the range spans to %p, maps %zu with %zu holes",
                (void *)c, mapped, gaps, (void *)(s->base + s->span), s->size,
                s->nholes);
  return MP_OK;
}

/* The strays (vrange.c): inside the virtual range, on no chunk (a map
 * unmaps them first, growth maps around them), and counted in reserved
 * as stray_bytes. */
static mp_status_t mp__check_strays(const mp_pool_t *pool) {
  const mp__segment_t *v = pool->vseg;
  size_t held = 0;
  for (size_t i = 0; i < pool->nstrays; i++) {
    mp__chunk_t c = pool->strays[i];
    held += c.size;
    if (v == NULL || c.addr < v->base || c.size > v->va_size ||
        c.addr - v->base > v->va_size - c.size)
      MP__CORRUPT("stray mapping %p (%zu bytes) lies outside the range",
                  (void *)c.addr, c.size);
    for (size_t k = 0; k < v->nchunks; k++)
      if (mp__chunk_meets(v->chunks[k], c.addr, c.size))
        MP__CORRUPT("stray mapping %p (%zu bytes) overlaps chunk %p",
                    (void *)c.addr, c.size, (void *)v->chunks[k].addr);
  }
  if (held != pool->stray_bytes)
    MP__CORRUPT("the strays hold %zu bytes, reserved counts %zu", held,
                pool->stray_bytes);
  return MP_OK;
}

static mp_status_t mp__check_segment(mp_pool_t *pool, mp__segment_t *s,
                                     size_t *live_n, size_t *live_b,
                                     size_t *req_b, size_t *free_n,
                                     size_t *free_b) {
  uintptr_t at = s->base;
  mp__block_t *prev = NULL;
  size_t guard =
      mp__map_count(pool) + pool->st.free_blocks + s->nchunks + s->nholes + 1;
  size_t holes = 0, hole_bytes = 0;
  for (mp__block_t *b = s->first; b != NULL; b = b->next) {
    if (guard-- == 0)
      MP__CORRUPT("segment %p: block list longer than the block count",
                  (void *)s->base);
    if (b->seg != s || b->prev != prev)
      MP__CORRUPT("block %p: broken address list links", (void *)b->addr);
    if (b->addr != at)
      MP__CORRUPT("block %p: expected at %p (gap or overlap)", (void *)b->addr,
                  (void *)at);
    if (b->size == 0 || (b->size & (pool->cfg.align - 1)) ||
        (b->addr & (pool->cfg.align - 1)))
      MP__CORRUPT("block %p: size %zu or address not aligned to %zu",
                  (void *)b->addr, b->size, pool->cfg.align);
    if (b->flags & MP__B_HOLE) {
      if (s->kind != MP__SEG_VIRTUAL || (b->flags & ~(uint32_t)MP__B_HOLE))
        MP__CORRUPT("hole %p outside a virtual range or with other flags",
                    (void *)b->addr);
      if (prev != NULL && (prev->flags & MP__B_HOLE))
        MP__CORRUPT("holes %p and %p are adjacent, not merged",
                    (void *)prev->addr, (void *)b->addr);
      if (b->next == NULL)
        MP__CORRUPT("hole %p is the range's last block", (void *)b->addr);
      if (b->sidx >= s->nholes || s->holes[b->sidx] != b)
        MP__CORRUPT("hole %p is not in its segment's hole list",
                    (void *)b->addr);
      if (mp__map_find(pool, b->addr) == b)
        MP__CORRUPT("hole %p is in the live map", (void *)b->addr);
      holes++;
      hole_bytes += b->size;
    } else if (b->flags & MP__B_FREE) {
      if (prev != NULL && (prev->flags & MP__B_FREE) &&
          !((prev->flags | b->flags) & MP__B_UNMERGED))
        MP__CORRUPT("free blocks %p and %p are adjacent, not coalesced",
                    (void *)prev->addr, (void *)b->addr);
      if (!mp__index_contains(pool, b, mp__rec_owned))
        MP__CORRUPT("free block %p (%zu bytes) is not in its size class",
                    (void *)b->addr, b->size);
      if (mp__map_find(pool, b->addr) == b)
        MP__CORRUPT("free block %p is in the live map", (void *)b->addr);
      (*free_n)++;
      *free_b += b->size;
    } else {
      if (mp__map_find(pool, b->addr) != b)
        MP__CORRUPT("live block %p is not in the live map", (void *)b->addr);
      if (b->requested > b->size)
        MP__CORRUPT("live block %p: requested %zu above size %zu",
                    (void *)b->addr, b->requested, b->size);
      (*live_n)++;
      *live_b += b->size;
      *req_b += b->requested;
    }
    at += b->size;
    prev = b;
  }
  if (s->last != prev)
    MP__CORRUPT("segment %p: last block link is wrong", (void *)s->base);
  if (at != s->base + s->span)
    MP__CORRUPT("segment %p: blocks cover %zu of %zu bytes", (void *)s->base,
                (size_t)(at - s->base), s->span);
  if (holes != s->nholes || s->span - hole_bytes != s->size)
    MP__CORRUPT("segment %p: %zu holes of %zu bytes, expected %zu and %zu "
                "mapped of %zu",
                (void *)s->base, holes, hole_bytes, s->nholes, s->size,
                s->span);
  if (s->kind == MP__SEG_VIRTUAL)
    return mp__check_chunks(s);
  return MP_OK;
}

mp_status_t mp__pool_check_locked(mp_pool_t *pool) {
  MP__ASSERT_LOCKED(pool);
  if ((pool->rare != 0) != (mp__pool_rare_of(pool) != 0))
    MP__CORRUPT("the rare-state word is %u, its fields say %u", pool->rare,
                mp__pool_rare_of(pool));
  if (pool->cached_off !=
      (pool->paused || pool->hist.ev != NULL || pool->ncapturing > 0))
    MP__CORRUPT("the cache's off flag is %d, paused %d, history %d, "
                "%u streams capturing",
                pool->cached_off, pool->paused, pool->hist.ev != NULL,
                pool->ncapturing);
  /* The stream the plain path compares a call's with names its slot's. */
  if (pool->last_s != MP__STREAM_GONE &&
      (pool->last_sidx >= pool->nstreams ||
       pool->streams[pool->last_sidx].s != pool->last_s))
    MP__CORRUPT("the remembered stream %p is not stream slot %u's",
                (void *)pool->last_s, pool->last_sidx);
  /* A slot that only carries capture marks is marked, used by no block,
   * and never the remembered one (stream.c: its first use clears it). It
   * may be set aside (gone with its handle kept: mp__stream_hide, while
   * the shim's real cuStreamDestroy of its capturing stream runs), but
   * never forgotten (a forget clears the mark_only). */
  for (uint32_t k = 0; k < pool->nstreams; k++) {
    const mp__strm_t *t = &pool->streams[k];
    if (t->mark_only &&
        ((t->gone && t->s == MP__STREAM_GONE) || t->capturing == 0 ||
         t->refs > 0 ||
         (pool->last_s != MP__STREAM_GONE && pool->last_sidx == k)))
      MP__CORRUPT("stream slot %u carries only capture marks but is %s", k,
                  t->gone && t->s == MP__STREAM_GONE ? "forgotten"
                  : t->capturing == 0                ? "not marked"
                  : t->refs > 0                      ? "used by blocks"
                                                     : "the remembered one");
  }
  size_t nseg = 0, reserved = 0, chunks = 0;
  for (mp__segment_t *s = pool->segs; s != NULL; s = s->next) {
    nseg++;
    reserved += s->size;
    chunks += s->kind == MP__SEG_VIRTUAL ? s->nchunks : 1;
  }
  mp__segment_t **v = mp__host_alloc((nseg ? nseg : 1) * sizeof *v);
  if (v == NULL)
    return mp__fail(MP_ENOMEM, "pool check: out of host memory");
  size_t i = 0;
  for (mp__segment_t *s = pool->segs; s != NULL; s = s->next)
    v[i++] = s;
  qsort(v, nseg, sizeof *v, mp__cmp_seg);
  mp_status_t st = MP_OK;
  size_t live_n = 0, live_b = 0, req_b = 0, free_n = 0, free_b = 0;
  for (i = 0; i < nseg && st == MP_OK; i++) {
    if (i > 0 &&
        v[i - 1]->base + (v[i - 1]->kind == MP__SEG_VIRTUAL ? v[i - 1]->va_size
                                                            : v[i - 1]->size) >
            v[i]->base)
      st = mp__fail(MP_ECORRUPT, "pool check: segments %p and %p overlap",
                    (void *)v[i - 1]->base, (void *)v[i]->base);
    else
      st = mp__check_segment(pool, v[i], &live_n, &live_b, &req_b, &free_n,
                             &free_b);
  }
  free(v);
  /* Changed with a device call in flight: counted when it ends. */
  if (st == MP_OK && !pool->inflight)
    st = mp__check_strays(pool);
  if (st != MP_OK)
    return st;
  reserved += pool->stray_bytes;

  size_t idx_n = 0, idx_b = 0;
  for (unsigned fl = 0; fl < MP__FL_COUNT; fl++) {
    bool fl_bit = (pool->fl_bitmap >> fl) & 1;
    if (fl_bit != (pool->sl_bitmap[fl] != 0))
      MP__CORRUPT("first-level bit %u disagrees with its second level", fl);
    for (unsigned sl = 0; sl < MP__SL_COUNT; sl++) {
      bool bit = (pool->sl_bitmap[fl] >> sl) & 1;
      if (bit != (pool->bins[fl * MP__SL_COUNT + sl] != NULL))
        MP__CORRUPT("class (%u,%u): bitmap bit %d but list %s", fl, sl, bit,
                    pool->bins[fl * MP__SL_COUNT + sl] ? "non-empty" : "empty");
      size_t n, by;
      if (!mp__index_check_class(pool, fl, sl, mp__rec_owned, &n, &by))
        MP__CORRUPT("class (%u,%u): treap out of order or holds a block of "
                    "another class",
                    fl, sl);
      idx_n += n;
      idx_b += by;
    }
  }
  if (idx_n != free_n || idx_b != free_b)
    MP__CORRUPT("free index holds %zu blocks / %zu bytes, segments %zu / %zu",
                idx_n, idx_b, free_n, free_b);
  /* A room above the map's share (an entry put back where none was left:
   * the count wraps) would let it fill past its load and never grow. */
  if (pool->map_room > pool->map_cap / MP__MAP_LOAD)
    MP__CORRUPT("the live map's room is %zu entries, more than the %zu it "
                "holds at most",
                pool->map_room, pool->map_cap / MP__MAP_LOAD);
  if (mp__map_count(pool) != live_n)
    MP__CORRUPT("live map holds %zu blocks, segments %zu", mp__map_count(pool),
                live_n);
  mp_stats_t sc;
  mp__stats_copy(pool, &sc); /* as callers read them */
  const mp_stats_t *s = &sc;
  if (s->reserved_bytes != reserved || s->allocated_bytes != live_b ||
      s->requested_bytes != req_b || s->free_bytes != free_b ||
      s->live_blocks != live_n || s->free_blocks != free_n ||
      s->segment_count != chunks)
    MP__CORRUPT("stats disagree with the blocks: reserved %zu/%zu allocated "
                "%zu/%zu requested %zu/%zu free %zu/%zu live blocks %llu/%zu "
                "free blocks %llu/%zu segments %zu/%zu",
                s->reserved_bytes, reserved, s->allocated_bytes, live_b,
                s->requested_bytes, req_b, s->free_bytes, free_b,
                (unsigned long long)s->live_blocks, live_n,
                (unsigned long long)s->free_blocks, free_n, s->segment_count,
                chunks);
  if (s->peak_reserved_bytes < s->reserved_bytes ||
      s->peak_allocated_bytes < s->allocated_bytes ||
      s->peak_requested_bytes < s->requested_bytes)
    MP__CORRUPT("a peak is below its current value");
  return mp__export_check(pool);
}

mp_status_t mp_pool_check(mp_pool_t *pool) {
  if (pool == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_check: pool is NULL");
  mp__pool_lock(pool);
  mp_status_t st = mp__pool_wait_for(pool, "mp_pool_check", false);
  if (st == MP_OK)
    st = mp__pool_paused(pool, "mp_pool_check");
  if (st == MP_OK)
    st = mp__pool_check_locked(pool);
  mp__pool_unlock(pool);
  /* A pool with arenas (arena.c): each arena is a pool of its own. */
  if (st == MP_OK && pool->arenas != NULL)
    st = mp__arena_check(pool);
  for (size_t i = 0; st == MP_OK && pool->arenas && i < pool->cfg.arenas; i++)
    if (mp__arena_at(pool, i) != NULL)
      st = mp_pool_check(mp__arena_at(pool, i));
  return st;
}
