/* segment.c - the segment list and plain segments.
 *
 * Sources: a pool draws from its device, or (a child pool) from a range its
 * parent handed out; a child never grows. From the device, memory comes in
 * one of two shapes: the virtual range (vrange.c) or plain segments, one
 * mp_device_alloc each (or, for a graph pool, one range borrowed from its
 * parent through the pool's upstream). Trim frees wholly free plain
 * segments.
 *
 * Plain growth: segment_bytes for requests up to segment_bytes/2, else the
 * request rounded up to 2 MiB.
 *
 * Locking: every device call here runs with the pool lock dropped and the
 * pool marked inflight (lock.c); only one grow or release is in flight at a
 * time. Invariant: reserved_bytes equals the sum of segment sizes plus the
 * strays' bytes (stray_bytes, vrange.c), and the blocks of a segment tile
 * it. */
#include <stdlib.h>
#include <string.h>

#include "pool_internal.h"

mp__segment_t *mp__segment_containing(const mp_pool_t *pool, uintptr_t p) {
  for (mp__segment_t *s = pool->segs; s != NULL; s = s->next)
    if (p >= s->base && p < s->base + s->span)
      return s;
  return NULL;
}

void mp__segment_push(mp_pool_t *pool, mp__segment_t *s) {
  s->prev = NULL;
  s->next = pool->segs;
  if (pool->segs)
    pool->segs->prev = s;
  pool->segs = s;
}

static void mp__segment_unlink(mp_pool_t *pool, mp__segment_t *s) {
  if (s->prev)
    s->prev->next = s->next;
  else
    pool->segs = s->next;
  if (s->next)
    s->next->prev = s->prev;
}

void mp__reserved_add(mp_pool_t *pool, size_t bytes) {
  MP__ASSERT_LOCKED(pool);
  pool->st.reserved_bytes += bytes;
  mp__stats_peaks(pool);
}

void mp__reserved_sub(mp_pool_t *pool, size_t bytes) {
  MP__ASSERT_LOCKED(pool);
  /* Not mp__free_bytes, 0 while paused: a pause gives back its free plain
   * segments (pause.c). */
  MP__ASSERT(pool->st.reserved_bytes >= bytes &&
             pool->st.reserved_bytes - pool->st.allocated_bytes >= bytes);
  pool->st.reserved_bytes -= bytes;
}

/* Grows the free tail of seg (or adds a free block) by bytes at its top. A
 * free tail that stream sidx may not use yet is left apart, or the new
 * memory would inherit its wait (UINT32_MAX: merge regardless). */
static mp__block_t *mp__tail_extend(mp_pool_t *pool, mp__segment_t *seg,
                                    uintptr_t addr, size_t bytes,
                                    mp__block_t *rec, uint32_t sidx) {
  mp__block_t *t = seg->last;
  bool adjacent =
      t != NULL && (t->flags & MP__B_FREE) && t->addr + t->size == addr;
  if (adjacent && sidx != UINT32_MAX && !mp__deps_usable(pool, t, sidx)) {
    rec->flags |= MP__B_UNMERGED;
    adjacent = false;
  }
  if (adjacent) {
    mp__index_remove(pool, t);
    t->size += bytes;
    mp__index_insert(pool, t);
    mp__rec_free(pool, rec);
    return t;
  }
  rec->addr = addr;
  rec->size = bytes;
  mp__block_link(seg, seg->last, rec);
  mp__index_insert(pool, rec);
  pool->st.free_blocks++;
  return rec;
}

_Thread_local bool mp__segment_trying;

mp_status_t mp__segment_limit(mp_pool_t *pool) {
  return pool->cap_is_max ? MP_ELIMIT : MP_ENOMEM;
}

/* A new plain segment's memory: from the device, or from the pool's
 * upstream (a graph pool borrows a range of its parent; graph.c sets it),
 * which may lend more than *bytes (a block its parent hands out whole):
 * *bytes is then what the range holds, the segment's size. */
static mp_status_t mp__plain_source(mp_pool_t *pool, size_t *bytes,
                                    mp_stream_t s, void **p) {
  if (pool->upstream != NULL)
    return pool->upstream(pool, bytes, s, p);
  return mp_device_alloc(pool->dev, *bytes, p);
}

/* What request size needs of the device: whole units of its allocation
 * alignment (the page, for host memory: mapped or page-locked whole, so
 * counted whole, and the next small request shares it instead of making a
 * segment of its own); size itself where they would wrap. A graph pool's
 * parent lends a range of any size: size. */
static size_t mp__plain_need(const mp_pool_t *pool, size_t size) {
  if (pool->graph)
    return size;
  size_t whole = mp__round_up(size, mp__device_alloc_align(pool->dev));
  return whole >= size ? whole : size;
}

mp_status_t mp__plain_grow(mp_pool_t *pool, size_t size, uint32_t sidx,
                           mp__block_t **fresh) {
  MP__ASSERT_LOCKED(pool);
  size_t bytes = size <= pool->cfg.segment_bytes / 2
                     ? pool->cfg.segment_bytes
                     : mp__round_up(size, MP__LARGE_ROUND);
  if (bytes < size)
    bytes = size;
  size_t room = mp__pool_room(pool), need = mp__plain_need(pool, size);
  if (bytes > room) /* near the cap: what the request needs, where it fits */
    bytes = need <= room ? need : size;
  if (bytes > room)
    return mp__segment_limit(pool);
  mp__segment_t *s = mp__host_calloc(1, sizeof *s);
  mp__block_t *rec = mp__rec_new(pool);
  if (s == NULL || rec == NULL) {
    free(s);
    if (rec)
      mp__rec_free(pool, rec);
    return mp__fail(MP__EHOST, "out of host memory for a segment record");
  }
  void *p = NULL;
  /* UINT32_MAX: a take for every stream (a graph pool's borrowing, which
   * names no stream to a parent's device allocation). */
  mp_stream_t strm = sidx != UINT32_MAX ? pool->streams[sidx].s : NULL;
  pool->grow_inflight = bytes; /* a cap change meanwhile counts it */
  mp__pool_device_begin(pool);
  /* A whole segment refused, what the request needs is asked: the device
   * may be out of memory for the segment (others hold the rest of it) and
   * still hold the request, as the virtual range maps the exact need
   * (vrange.c). Before, the request failed at every rung of the ladder,
   * each growth asking the same segment again. A graph pool has no cap of
   * its own (bytes > room never holds): its parent may refuse a whole
   * segment and still hold a range of the request's size (a free block,
   * or room under its cap). */
  bool smaller = bytes > need, trying = smaller && pool->graph;
  if (trying) /* set and cleared only here: the parent's growth meanwhile
                 (its own plain growth, in this thread) leaves it */
    mp__segment_trying = true;
  mp_status_t st = mp__plain_source(pool, &bytes, strm, &p);
  if (trying)
    mp__segment_trying = false;
  if (smaller && (st == MP_ENOMEM || (pool->graph && st == MP_ELIMIT))) {
    bytes = need;
    /* The lock is dropped: an arena's grow_inflight, which other arenas
     * read under its lock (arena.c), keeps the segment's bytes, as the
     * range's exact-need retry keeps its step's (no arena is a graph
     * pool). */
    if (pool->graph)
      pool->grow_inflight = bytes;
    st = mp__plain_source(pool, &bytes, strm, &p);
  }
  mp__pool_device_end(pool);
  if (st == MP_OK && (uintptr_t)p % pool->cfg.align != 0) {
    /* A virtual pool's align may exceed what plain memory promises; it
     * gets no plain segment that would break it. Both device calls are
     * counted (stats.h: calls into the driver), so that the counters still
     * differ by the allocations the pool holds. */
    pool->st.device_alloc_count++;
    mp__pool_device_begin(pool);
    mp_status_t fst = mp__device_free(pool->dev, p);
    mp__pool_device_end(pool);
    if (fst == MP_OK) {
      pool->st.device_free_count++;
      st = mp__fail(MP_ENOTSUP,
                    "the device returned memory at %p, not aligned to the "
                    "pool's align %zu",
                    p, pool->cfg.align);
    } else {
      st = mp__fail(MP_ENOTSUP,
                    "the device returned memory at %p, not aligned to the "
                    "pool's align %zu, and refused to take it back (%s), so "
                    "its %zu bytes are lost to the pool",
                    p, pool->cfg.align, mp_status_name(fst), bytes);
    }
  }
  if (st != MP_OK) {
    free(s);
    mp__rec_free(pool, rec);
    return st;
  }
  s->base = (uintptr_t)p;
  s->size = s->span = bytes;
  s->kind = pool->graph ? MP__SEG_RANGE : MP__SEG_PLAIN;
  s->small = size <= pool->cfg.segment_bytes / 2;
  s->made_for = MP__HIST_STREAM(pool, sidx);
  mp__segment_push(pool, s);
  pool->st.device_alloc_count++;
  pool->st.segment_count++;
  mp__reserved_add(pool, bytes);
  /* The stream of the request it was made for, as PyTorch's segment_alloc
   * entry says its segment's (CUDACachingAllocator.cpp, alloc_block:
   * record_trace(SEGMENT_ALLOC, ..., p.stream())); 0 for a graph pool's
   * take for every stream. */
  MP__HIST(pool, MP__H_SEGMENT_ALLOC, s->base, bytes, s->made_for);
  *fresh = mp__tail_extend(pool, s, s->base, bytes, rec, UINT32_MAX);
  return MP_OK;
}

bool mp__plain_trim_one(mp_pool_t *pool) {
  MP__ASSERT_LOCKED(pool);
  for (mp__segment_t *s = pool->segs, *next; s != NULL; s = next) {
    next = s->next;
    if (s->kind != MP__SEG_PLAIN || s->first != s->last ||
        !mp__releasable(pool, s->first))
      continue;
    mp__block_t *b = s->first;
    mp__index_remove(pool, b);
    mp__segment_unlink(pool, s);
    mp__pool_device_begin(pool);
    mp_status_t st = mp__device_free(pool->dev, (void *)s->base);
    mp__pool_device_end(pool);
    if (st != MP_OK) {
      /* Keep it: the pool still owns the memory. The segments after it
       * are still tried: one refusal (a transient driver error) must not
       * keep every other free segment reserved. next is still in the
       * list: only one grow or release is in flight at a time, and this
       * one was (lock.c), so no other thread unlinked a segment. s goes
       * to the head, behind the scan, and is tried again on the next
       * call. */
      mp__segment_push(pool, s);
      mp__index_insert(pool, b);
      pool->give_back_refused++;
      pool->give_back_st = st;
      continue;
    }
    pool->st.free_blocks--;
    mp__rec_free(pool, b);
    pool->st.device_free_count++;
    pool->st.segment_count--;
    mp__reserved_sub(pool, s->size);
    /* The stream it was made for, as PyTorch's segment_free entry says its
     * segment's (CUDACachingAllocator.cpp, release_block: record_trace(
     * SEGMENT_FREE, ..., block->stream), the stream of every block of a
     * segment there); it said 0. Kept with the segment: looked up in the
     * ring, it walked every event under the lock, and said 0 once the
     * ring had dropped the segment_alloc. */
    MP__HIST(pool, MP__H_SEGMENT_FREE, s->base, s->size, s->made_for);
    free(s);
    return true;
  }
  return false;
}

mp_status_t mp__plain_release_first(mp_pool_t *pool) {
  /* Under the lock, and the device free marked in flight with it dropped
   * (as mp__plain_trim_one frees), though destroy owns the pool: this free
   * may still be refused, and then the pool stays as it was, for the
   * calls of other threads that ran meanwhile (a pool destroy refuses is
   * the caller's again). Those reach the segment list: a trim (mp_pool_trim,
   * another arena's reclaim, release_threshold) unlinks and frees a free
   * plain segment, this one too; unlocked, both freed it (a double free on
   * the device) and both unlinked it. They wait for a release in flight
   * (mp__pool_wait_idle) before they touch a segment. The stream watchers
   * (mp__stream_gone) and the device's count of pools touch no segment.
   * The lock is not held over the free: cuMemFree "may perform implicit
   * synchronization" (cuda.h), which waits for host functions queued on
   * the streams, and one may be waiting for this lock (pause.c,
   * mp__arenas_reap, says the same). */
  mp__pool_lock(pool);
  mp__pool_wait_idle(pool);
  mp__segment_t *s = pool->segs;
  while (s != NULL && s->kind != MP__SEG_PLAIN)
    s = s->next;
  if (s == NULL) {
    mp__pool_unlock(pool);
    return MP_OK;
  }
  uintptr_t base = s->base;
  size_t size = s->size;
  uint64_t since = mp__error_serial();
  mp__pool_device_begin(pool);
  mp_status_t st = mp__device_free(pool->dev, (void *)base);
  mp__pool_device_end(pool);
  if (st == MP_OK) {
    mp__segment_unlink(pool, s);
    pool->st.device_free_count++;
  }
  mp__pool_unlock(pool);
  if (st != MP_OK) {
    /* The device's reason, where the refusing call gave one: else the
     * thread's last error is an older failure, not why it refused. */
    (void)mp__device_said(st, since);
    return mp__fail(st,
                    "mp_pool_destroy: the device refused to free the plain "
                    "segment at %p (%zu bytes), so nothing was released and "
                    "the pool is as it was: %s",
                    (void *)base, size, mp_last_error());
  }
  free(s);
  return MP_OK;
}
