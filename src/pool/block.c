/* block.c - block records and the live-block map, and the two operations
 * that change a segment's tiling: split and coalesce.
 *
 * Records come from slabs of the pool's own (host memory, never device
 * memory) and go back to a free list, so the steady state makes no host
 * allocation. The live map is an open-addressing hash table keyed by the
 * block's address (linear probing, load <= 1/8, backward-shift deletion, so
 * no tombstones build up): pointer -> block is O(1) expected. Slots hold
 * the address next to the record pointer, so a probe reads only the table,
 * never a record (which would be a cache miss per probe). An eighth more
 * slots past the last home slot take the runs that would wrap
 * (mp__map_slots), so no probe step masks its index.
 *
 * Why not src/ptrmap.c (issue 15): the same algorithm, but generic: entries
 * of any size (a multiply per slot address), the murmur3 finalizer as hash
 * (here one multiply of the address shifted by the pool's alignment, whose
 * low bits are always 0) and a call per operation. Measured with
 * bench/micro/count_pairs.sh (Release, callgrind, 200 000 free+alloc pairs,
 * in one session): this map 1245 / 1114 instructions per pair at 100 /
 * 10 000 live blocks, the pool on ptrmap.c 1450 / 1311 (+16% / +18%).
 *
 * Invariant: the blocks of a segment tile [base, base + size) in address
 * order; a free block never has a free neighbour once coalesce returned. */
#include <stdlib.h>
#include <string.h>

#include "pool_internal.h"

#define MP__SLAB_RECORDS 256

/* A slab's first record: raw rounded up to a cache line. */
static const mp__block_t *mp__slab_first(const void *raw) {
  return (const mp__block_t *)(((uintptr_t)raw + 63) & ~(uintptr_t)63);
}

bool mp__rec_refill(mp_pool_t *pool) {
  void **s =
      mp__host_room(pool->slabs, &pool->slabs_cap, pool->nslabs, sizeof *s);
  if (s == NULL)
    return false;
  pool->slabs = s;
  /* Cache-line aligned, so each record's hot fields share one line: 63
   * bytes more than the records, aligned by hand (mp__host_alloc, through
   * which a test can make it fail, has no aligned form); slabs[] keeps
   * what free() takes. */
  void *raw = mp__host_alloc(MP__SLAB_RECORDS * sizeof(mp__block_t) + 63);
  if (raw == NULL)
    return false;
  mp__block_t *slab = (mp__block_t *)mp__slab_first(raw);
  /* slabs[] stays in address order, for mp__rec_owned's binary search. */
  size_t at = pool->nslabs;
  while (at > 0 && (uintptr_t)pool->slabs[at - 1] > (uintptr_t)raw) {
    pool->slabs[at] = pool->slabs[at - 1];
    at--;
  }
  pool->slabs[at] = raw;
  pool->nslabs++;
  for (size_t i = MP__SLAB_RECORDS; i-- > 0;) {
    slab[i].flags = 0; /* as mp__rec_free leaves a record */
    slab[i].next_rec = pool->rec_free;
    pool->rec_free = &slab[i];
  }
  return true;
}

bool mp__rec_owned(const mp_pool_t *pool, const void *p) {
  /* The last slab that starts at or below p, then p's place in it. */
  size_t lo = 0, hi = pool->nslabs;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if ((uintptr_t)pool->slabs[mid] <= (uintptr_t)p)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0)
    return false;
  uintptr_t first = (uintptr_t)mp__slab_first(pool->slabs[lo - 1]);
  uintptr_t off = (uintptr_t)p - first;
  return (uintptr_t)p >= first &&
         off < MP__SLAB_RECORDS * sizeof(mp__block_t) &&
         off % sizeof(mp__block_t) == 0;
}

void mp__rec_free(mp_pool_t *pool, mp__block_t *b) {
  b->flags = 0;
  b->next_rec = pool->rec_free;
  pool->rec_free = b;
}

mp__block_t *mp__recs_new(mp_pool_t *pool, size_t n) {
  mp__block_t *chain = NULL;
  for (size_t i = 0; i < n; i++) {
    mp__block_t *r = mp__rec_new(pool);
    if (r == NULL) {
      mp__recs_free(pool, chain);
      return NULL;
    }
    r->next_rec = chain;
    chain = r;
  }
  return chain;
}

void mp__recs_free(mp_pool_t *pool, mp__block_t *chain) {
  while (chain != NULL) {
    mp__block_t *n = chain->next_rec;
    mp__rec_free(pool, chain);
    chain = n;
  }
}

void mp__rec_release_all(mp_pool_t *pool) {
  for (size_t i = 0; i < pool->nslabs; i++)
    free(pool->slabs[i]);
  free(pool->slabs);
  pool->slabs = NULL;
  pool->nslabs = pool->slabs_cap = 0;
  pool->rec_free = NULL;
}

/* ---- live map ----------------------------------------------------------- */

mp__block_t *mp__map_find(const mp_pool_t *pool, uintptr_t addr) {
  mp__slot_t *slot;
  return mp__map_lookup(pool, addr, &slot);
}

static void mp__map_put(mp__slot_t *map, size_t slot, mp__block_t *b) {
  size_t i = slot;
  while (map[i].addr != 0)
    i++; /* past the last home slot: mp__map_slots */
  map[i].addr = b->addr;
  map[i].blk = b;
}

static const mp__slot_t mp__map_none[2];

void mp__map_init(mp_pool_t *pool) {
  pool->map = (mp__slot_t *)mp__map_none; /* read, never written */
  pool->map_cap = 0;
  pool->map_room = 0;
  pool->map_shift = 63;
}

bool mp__map_reserve(mp_pool_t *pool, size_t n) {
  if (mp__map_has_room(pool, n))
    return true;
  size_t count = mp__map_count(pool);
  /* The first table takes 64 entries. */
  size_t cap = pool->map_cap ? pool->map_cap : 64 * MP__MAP_LOAD;
  while ((count + n) * MP__MAP_LOAD > cap)
    cap *= 2;
  mp__slot_t *m = mp__host_calloc(mp__map_slots(cap), sizeof *m);
  if (m == NULL)
    return false;
  mp__slot_t *old = pool->map;
  size_t old_cap = pool->map_cap;
  pool->map = m;
  pool->map_cap = cap; /* mp__map_slot depends on both */
  pool->map_room = cap / MP__MAP_LOAD - count;
  pool->map_shift = 64u - (unsigned)__builtin_ctzll((unsigned long long)cap);
  for (size_t i = 0; i < mp__map_slots(old_cap); i++)
    if (old[i].addr != 0)
      mp__map_put(m, mp__map_slot(pool, old[i].addr), old[i].blk);
  if (old_cap > 0)
    free(old); /* else mp__map_init's table (or none) */
  return true;
}

MP__HOT void mp__map_add(mp_pool_t *pool, mp__block_t *b) {
  MP__ASSERT(mp__map_has_room(pool, 1));
  mp__map_put(pool->map, mp__map_slot(pool, b->addr), b);
  pool->map_room--;
}

bool mp__map_insert(mp_pool_t *pool, mp__block_t *b) {
  if (MP__UNLIKELY(!mp__map_has_room(pool, 1)) && !mp__map_reserve(pool, 1))
    return false;
  mp__map_add(pool, b);
  return true;
}

MP__HOT void mp__map_remove_slot(mp_pool_t *pool, mp__slot_t *slot) {
  /* Backward shift: pull later entries of the probe run into the hole when
   * their home slot does not lie strictly between the hole and them. Runs
   * never wrap (mp__map_slots): a home is at or below its entry's slot. */
  mp__slot_t *map = pool->map, *hole = slot;
  for (mp__slot_t *j = slot + 1; j->addr != 0; j++) {
    /* Movable unless its home lies in (hole, j]: then it is nearer j than
     * the hole is. */
    if (map + mp__map_slot(pool, j->addr) <= hole) {
      *hole = *j;
      hole = j;
    }
  }
  hole->addr = 0; /* an empty slot's blk is never read */
  pool->map_room++;
}

void mp__map_remove(mp_pool_t *pool, mp__block_t *b) {
  mp__slot_t *slot;
  if (mp__map_lookup(pool, b->addr, &slot) == b)
    mp__map_remove_slot(pool, slot);
}

/* ---- tiling ------------------------------------------------------------- */

void mp__block_link(mp__segment_t *seg, mp__block_t *after, mp__block_t *b) {
  mp__block_t *next = after ? after->next : seg->first;
  b->seg = seg;
  b->prev = after;
  if (next)
    next->prev = b;
  else
    seg->last = b;
  /* After the branch, not beside b->prev: GCC 12 packed the two stores
   * into a vector (four instructions for two) on the split's path. */
  b->next = next;
  if (after)
    after->next = b;
  else
    seg->first = b;
}

void mp__block_unlink(mp__segment_t *seg, mp__block_t *b) {
  if (b->prev)
    b->prev->next = b->next;
  else
    seg->first = b->next;
  if (b->next)
    b->next->prev = b->prev;
  else
    seg->last = b->prev;
}

MP__HOT mp__block_t *mp__block_split(mp_pool_t *pool, mp__block_t *b,
                                     size_t size) {
  MP__ASSERT(!(b->flags & MP__B_FREE) && size % pool->cfg.align == 0);
  if (b->size <= size)
    return NULL;
  mp__block_t *r = mp__rec_pop(pool); /* split_into sets every field */
  if (r == NULL)
    return NULL; /* b stays whole: correct, just less economical */
  mp__block_split_into(pool, b, size, r);
  return r;
}

MP__HOT void mp__block_split_rest(mp_pool_t *pool, mp__block_t *b, size_t size,
                                  mp__block_t *r) {
  MP__ASSERT(size < b->size); /* b: taken (MP__B_FREE may stay) or live */
  uintptr_t raddr = b->addr + size;
  size_t rsize = b->size - size;
  r->addr = raddr;
  r->size = rsize;
  r->flags = (b->flags & (MP__B_SYNC | MP__B_UNMERGED)) | MP__B_FREE;
  /* Not sidx nor requested: read only while live (or sidx, unmapped), and
   * set by whatever makes the block so; nor handle / child, read only under
   * MP__B_MOVABLE / MP__B_CHILD, which r does not have. */
  r->ndeps = b->ndeps;
  r->gen = b->gen;
  memcpy(r->deps, b->deps, sizeof r->deps);
  b->size = size;
  mp__block_link(b->seg, b, r);
  mp__index_link_hot(pool, r, rsize, raddr);
}

MP__HOT mp__block_t *mp__block_split_low(mp_pool_t *pool, mp__block_t *b,
                                         size_t size, mp__block_t *r) {
  MP__ASSERT((b->flags & MP__B_FREE) && size < b->size && r->flags == 0);
  uintptr_t addr = b->addr;
  size_t rsize = b->size - size;
  /* b first, into the index as the rest; then r goes in just below it:
   * its neighbours are known, no search. */
  b->addr = addr + size;
  b->size = rsize;
  mp__index_link_hot(pool, b, rsize, addr + size);
  mp__block_t *p = b->prev;
  r->addr = addr;
  r->seg = b->seg;
  r->prev = p;
  if (p != NULL)
    p->next = r;
  else
    b->seg->first = r;
  /* After the branch, not beside addr and prev: GCC 12 packed each pair
   * into a vector store (four instructions for two), as in
   * mp__block_link. */
  r->size = size;
  r->next = b;
  b->prev = r;
  return r;
}

MP__HOT void mp__block_split_into(mp_pool_t *pool, mp__block_t *b, size_t size,
                                  mp__block_t *r) {
  mp__block_split_rest(pool, b, size, r);
  pool->st.free_blocks++;
}

/* mp__block_absorb's body, inline in coalesce (on every free). */
static MP__HOT bool mp__absorb(mp_pool_t *pool, mp__block_t *into,
                               mp__block_t *gone, bool force) {
  MP__ASSERT(into->next == gone && gone->prev == into);
  MP__ASSERT(into->addr + into->size == gone->addr && into->seg == gone->seg);
  if (force) {
    (void)mp__deps_merge(pool, into, gone);
  } else if (!mp__deps_try_merge(pool, into, gone)) {
    into->flags |= MP__B_UNMERGED;
    gone->flags |= MP__B_UNMERGED;
    return false;
  }
  into->flags |= gone->flags & MP__B_UNMERGED;
  into->size += gone->size;
  mp__block_unlink(into->seg, gone);
  mp__rec_free(pool, gone);
  pool->st.free_blocks--;
  return true;
}

bool mp__block_absorb(mp_pool_t *pool, mp__block_t *into, mp__block_t *gone,
                      bool force) {
  return mp__absorb(pool, into, gone, force);
}

/* Whether merging free neighbour nb into b would hold b back. b, freed on
 * one stream, is reusable there at once (stream order); merged with a
 * neighbour that another stream's work still uses, it would wait for that
 * work too, and a request on b's stream would grow the pool instead. With
 * streams that really run behind the host (`mpbench --stream-work 20`,
 * three runs) that made the llama trace hold 2.49x to 2.68x its live bytes
 * and `graph` 1.074x to 1.171x; with such pairs kept apart, 1.64x to
 * 1.77x and 1.107x. nb's streams are asked (poll), so a neighbour
 * whose work is done joins as before: with the device caught up nothing
 * changes. The pair is marked MP__B_UNMERGED and joins once that work is
 * done: at trim or a sync, or in an allocation that finds no block, which
 * counts the pairs kept apart as pending and waits for them as for a block
 * another stream holds (core.c, merge_later). A pool used
 * from one stream never asks: every free block is reusable on it; nor does
 * one with stream_waits=1, which makes b's stream wait for the neighbour's
 * work instead (the merged block is usable at once). */
static bool mp__holds_back(mp_pool_t *pool, mp__block_t *b, mp__block_t *nb) {
  if ((pool->cfg.flags & MP_POOL_STREAM_WAITS) || b->ndeps != 1 ||
      (b->flags & MP__B_SYNC) ||
      mp__deps_safe(pool, nb, mp__dep_sidx(b->deps[0]), true))
    return false;
  b->flags |= MP__B_UNMERGED;
  nb->flags |= MP__B_UNMERGED;
  pool->merge_later = true;
  return true;
}

/* Whether merging free neighbour nb into b, freed with uses on streams it
 * never ran on (mp__block_release_apart), would hold nb back: b waits for
 * their work, and nb, merged, would wait for it too. A graph pool's range
 * given back to the arena that lent it waits so for every stream the
 * arena's pool knows (graph.c); merged into what the arena cached, it made
 * all of that wait for the other threads' streams, anew at each capture.
 * While those streams ran behind, the arena, which cannot wait for them
 * during a capture, grew at every capture until the device was full: a
 * captured 3 MiB request failed beside some 200 MiB the arena had free.
 * own: b's stream (its first dep at the free: the ask below drops done
 * deps). Once b waits for its own stream at most, the rule of any free. */
static bool mp__holds_back_uses(mp_pool_t *pool, mp__block_t *b,
                                mp__block_t *nb, uint32_t own) {
  if ((b->flags & MP__B_SYNC) || b->ndeps == 0 ||
      mp__deps_safe(pool, b, own, true))
    return mp__holds_back(pool, b, nb);
  b->flags |= MP__B_UNMERGED;
  nb->flags |= MP__B_UNMERGED;
  pool->merge_later = true;
  return true;
}

/* The merges of a free; streams: the pool knows several (mp__holds_back is
 * asked); apart: mp__holds_back_uses is (mp__block_coalesce_apart). One
 * body, three copies: a pool used from one stream runs the copy without the
 * question. A neighbour waiting for a device sync that b does not wait
 * for (mp__sync_apart) stays apart in every copy: its MP__B_SYNC takes the
 * merge off mp__deps_try_merge's fast path, and mp__deps_try_union refuses
 * it, so the plain path pays nothing for the question. */
static MP__HOT mp__block_t *mp__coalesce(mp_pool_t *pool, mp__block_t *b,
                                         bool streams, bool apart) {
  b->flags &= ~(uint32_t)MP__B_UNMERGED;
  uint32_t own = apart && b->ndeps > 0 ? mp__dep_sidx(b->deps[0]) : 0;
  mp__block_t *n = b->next;
  if (n != NULL && (n->flags & MP__B_FREE) &&
      !(streams && (apart ? mp__holds_back_uses(pool, b, n, own)
                          : mp__holds_back(pool, b, n)))) {
    mp__index_remove_hot(pool, n);
    if (!mp__absorb(pool, b, n, false))
      mp__index_insert(pool, n);
  }
  mp__block_t *p = b->prev;
  if (p != NULL && (p->flags & MP__B_FREE) &&
      !(streams && (apart ? mp__holds_back_uses(pool, b, p, own)
                          : mp__holds_back(pool, b, p)))) {
    mp__index_remove_hot(pool, p);
    if (mp__absorb(pool, p, b, false))
      b = p;
    else
      mp__index_insert(pool, p);
  }
  return b;
}

__attribute__((noinline)) static mp__block_t *
mp__coalesce_streams(mp_pool_t *pool, mp__block_t *b) {
  return mp__coalesce(pool, b, true, false);
}

mp__block_t *mp__block_coalesce_apart(mp_pool_t *pool, mp__block_t *b) {
  MP__ASSERT_LOCKED(pool);
  return mp__coalesce(pool, b, pool->nstreams != 1, true);
}

MP__HOT mp__block_t *mp__block_coalesce(mp_pool_t *pool, mp__block_t *b) {
  MP__ASSERT_LOCKED(pool);
  if (MP__UNLIKELY(pool->nstreams != 1))
    return mp__coalesce_streams(pool, b);
  return mp__coalesce(pool, b, false, false);
}

/* Whether free neighbours b and n, left apart, may join now: joined, each
 * stays usable at once wherever it is now. That holds when, once what is
 * done is dropped (their streams asked), both wait for nothing or for the
 * same one stream. A pair one of whose halves still waits for another
 * stream stays apart (merge_later): joining it would hand that wait to the
 * other half, which a free keeps apart from just that (mp__holds_back).
 * With stream_waits=1, under MP__B_SYNC, or in a pool of one stream, any
 * pair may join (as before). */
static bool mp__joinable(mp_pool_t *pool, mp__block_t *b, mp__block_t *n) {
  if (pool->nstreams == 1 || (pool->cfg.flags & MP_POOL_STREAM_WAITS) ||
      ((b->flags | n->flags) & MP__B_SYNC))
    return true;
  (void)mp__deps_check(pool, b, UINT32_MAX, true);
  (void)mp__deps_check(pool, n, UINT32_MAX, true);
  if ((b->ndeps == 0 && n->ndeps == 0) ||
      (b->ndeps == 1 && n->ndeps == 1 &&
       mp__dep_same_stream(b->deps[0], n->deps[0])))
    return true;
  /* Marked again: the walk may have cleared b's mark joining it with the
   * block before (a run of four: the two joined halves stay apart). */
  b->flags |= MP__B_UNMERGED;
  n->flags |= MP__B_UNMERGED;
  pool->merge_later = true;
  return false;
}

void mp__block_merge_deferred(mp_pool_t *pool) {
  MP__ASSERT_LOCKED(pool);
  pool->merge_later = false; /* set again by a pair that must still wait */
  pool->apart_bytes = 0;
  pool->apart_sync = 0;
  for (mp__segment_t *s = pool->segs; s != NULL; s = s->next) {
    size_t run = 0; /* the free blocks just below b, left apart */
    for (mp__block_t *b = s->first; b != NULL;) {
      mp__block_t *n = b->next;
      if (!(b->flags & MP__B_FREE) || n == NULL || !(n->flags & MP__B_FREE)) {
        run = 0;
        b = n;
        continue;
      }
      if (mp__sync_apart(pool, b, n)) {
        /* Until the device sync, which no stream's work brings nearer:
         * not counted as pending (apart_bytes), which would make an
         * allocation wait for it before growing, and owing no walk before
         * that sync (apart_sync). */
        b->flags |= MP__B_UNMERGED;
        n->flags |= MP__B_UNMERGED;
        mp__sync_apart_note(pool, b, n);
        run = 0;
        b = n;
        continue;
      }
      if (!mp__joinable(pool, b, n)) {
        run += b->size;
        if (run + n->size > pool->apart_bytes)
          pool->apart_bytes = run + n->size;
        b = n;
        continue;
      }
      mp__index_remove(pool, b);
      mp__index_remove(pool, n);
      b->flags &= ~(uint32_t)MP__B_UNMERGED;
      n->flags &= ~(uint32_t)MP__B_UNMERGED;
      if (mp__absorb(pool, b, n, false)) {
        /* b may now border the next one of a run kept apart: looked at
         * again (moving on left that pair apart, and trim could not give
         * back what it spans). */
        mp__index_insert(pool, b);
      } else {
        mp__index_insert(pool, b);
        mp__index_insert(pool, n);
        run = 0; /* apart until a device sync, not a wait */
        b = n;
      }
    }
  }
}

_Static_assert(sizeof(mp__block_t) == 128,
               "a block record is two cache lines: hot fields, then the rest");
