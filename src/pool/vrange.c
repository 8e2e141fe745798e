/* vrange.c - the virtual range: one address range reserved once, holding
 * mapped chunks with unmapped holes between them (MP_POOL_VIRTUAL, on a
 * device with virtual memory).
 *
 * A chunk is exactly one vm_map call (CUDA cannot unmap part of a mapping,
 * and the host backend enforces the same). A hole is a block of its own
 * (MP__B_HOLE), so blocks never span one and free neighbours coalesce only
 * across mapped memory.
 *
 * Growth maps where the new memory best completes a fitting block
 * (mp__find_placement): for each hole, the free blocks on either side
 * (usable on the stream, and within max_split: pool_internal.h's
 * mp__merge_ok) plus the hole may hold the request, and then only what they
 * lack is mapped, at the hole's edge next to them; at the top, what the
 * free top block lacks, preferably max(segment_bytes, reserved/128 capped
 * at 16 MiB; no more than the need past the peak while the free memory is
 * scattered). The smallest need wins (the top on ties: its step saves later
 * calls). Rounded to the granule; near the cap, the exact need (and where
 * even that is more than is left but the request is not: a plain segment
 * of the request's size, mp__vrange_grow). What is mapped is one chunk, or
 * (map_piece) adjacent chunks of at most map_piece each, which can go back
 * one by one. A stray (a mapping the device would not take back:
 * mp__pool_vm_map) is never mapped over: growth unmaps the strays again
 * first, and places around those the device still keeps.
 *
 * Release: a free chunk (one lying wholly inside a free block whose work is
 * done) can be unmapped wherever it is: the block around it splits into a
 * free piece below, a hole and a free piece above; holes next to each other
 * merge, and a hole that reaches the top shrinks the span. Trim does this
 * for free chunks anywhere; growth does it first (reclaim) whenever the
 * mapping would lift reserved above its peak, so the peak follows live
 * memory instead of free chunks stranded in the middle of the range. The
 * growth rung runs in pools used from one stream (asking that stream once
 * whether it is idle when the free chunks still wait for its work), and in
 * multi-stream pools only under max_split once a quarter of the memory is
 * free (asking every stream whether it is idle; chunks of streams still
 * busy stay); otherwise what a multi-stream pool knows to be done depends
 * on stream timing (see mp__vrange_reclaim). Chunk sizes trade device calls
 * against precision: a chunk goes back only when wholly free.
 *
 * Locking: every device call here runs with the pool lock dropped and the
 * pool marked inflight (lock.c). Metadata changes before an unmap (the
 * memory becomes a hole, unusable) and after a map. Invariant: the
 * segment's chunks are ascending inside [base, base + span), the last one
 * ends at the top, and the gaps between them are exactly its hole blocks;
 * its size is the sum of its chunks. */
#include <stdlib.h>
#include <string.h>

#include "pool_internal.h"

/* The virtual range for a pool that may hold basis bytes: twice that,
 * at most 4 TiB, in whole granules. */
static size_t mp__vrange_size(const mp_pool_t *pool, size_t basis) {
  size_t va = basis > SIZE_MAX / 2 ? SIZE_MAX : 2 * basis;
  if (va > ((size_t)1 << 42))
    va = (size_t)1 << 42;
  return mp__round_up(va, pool->granule);
}

mp_status_t mp__vrange_ready(mp_pool_t *pool) {
  if (pool->vseg != NULL)
    return MP_OK;
  if (pool->vm_failed || pool->granule == 0)
    return MP_ENOTSUP;
  /* Twice the cap: growth maps at the top while the reclaim leaves holes
   * below, so a range of the cap's size ran out before the memory did (the
   * 10-stream llama trace then failed on a 7.19 GiB device it fits at 1.135
   * times its live bytes, 7.15 GiB). Address space costs no memory. The
   * cap of a capped pool may be raised later (mp_pool_set_max_fraction),
   * up to the device's size: the range is sized from that (va_basis).
   * From the cap of the moment, a raised cap let the pool outgrow its
   * range into plain segments, and every pause after was MP_ENOTSUP. */
  size_t basis = pool->va_basis > pool->cap ? pool->va_basis : pool->cap;
  size_t va = mp__vrange_size(pool, basis);
  mp__segment_t *s = mp__host_calloc(1, sizeof *s);
  if (s == NULL)
    return mp__fail(MP__EHOST, "out of host memory for the virtual range");
  void *base = NULL;
  mp__pool_device_begin(pool);
  mp_status_t st = mp__device_vm_reserve(pool->dev, va, &base);
  /* Address space can run short too (RLIMIT_AS, many pools or arenas on
   * a big device): then one sized from the cap of the moment (twice it,
   * as above), and a raised cap may outgrow it, rather than plain segments
   * at once. */
  size_t small = mp__vrange_size(pool, pool->cap);
  if (st != MP_OK && small < va &&
      (st = mp__device_vm_reserve(pool->dev, small, &base)) == MP_OK)
    va = small;
  mp__pool_device_end(pool);
  if (st != MP_OK) {
    free(s);
    /* A device that refuses this process (a forked child's: host.c refuses
     * it vm_reserve as it does vm_map) says so, rather than a pausable
     * pool's MP_ENOMEM; the range is not given up for good. */
    if (st == MP_ENODEV)
      return st;
    /* Final, but for a pool that must stay pausable: it takes no plain
     * segment instead (grow.c), and tries again at its next growth. */
    pool->vm_failed = !(pool->cfg.flags & MP_POOL_PAUSABLE);
    return MP_ENOTSUP;
  }
  s->base = (uintptr_t)base;
  s->va_size = va;
  s->kind = MP__SEG_VIRTUAL;
  mp__segment_push(pool, s);
  pool->vseg = s;
  return MP_OK;
}

/* Room for k more chunks and one more hole (one growth, however many
 * pieces, or one unmap adds at most one), so that the bookkeeping of a
 * growth or an unmap cannot fail halfway. */
static bool mp__vrange_room(mp__segment_t *v, size_t k) {
  while (v->chunk_cap < v->nchunks + k) {
    mp__chunk_t *c =
        mp__host_room(v->chunks, &v->chunk_cap, v->chunk_cap, sizeof *c);
    if (c == NULL)
      return false;
    v->chunks = c;
  }
  while (v->holes_cap < v->nholes + 1) {
    mp__block_t **h =
        mp__host_room(v->holes, &v->holes_cap, v->holes_cap, sizeof *h);
    if (h == NULL)
      return false;
    v->holes = h;
  }
  return true;
}

/* The hole holding address a; NULL: none (a is mapped, or at or above the
 * top). */
static mp__block_t *mp__hole_at(const mp__segment_t *v, uintptr_t a) {
  for (size_t k = 0; k < v->nholes; k++)
    if (a >= v->holes[k]->addr && a - v->holes[k]->addr < v->holes[k]->size)
      return v->holes[k];
  return NULL;
}

/* The first chunk at or above a. */
static size_t mp__chunk_at(const mp__segment_t *v, uintptr_t a) {
  return mp__chunks_at(v->chunks, v->nchunks, a);
}

bool mp__vrange_chunk_of(const mp__segment_t *v, uintptr_t a,
                         mp__chunk_t *out) {
  size_t i = mp__chunk_at(v, a + 1); /* the first chunk above a */
  if (i == 0 || a - v->chunks[i - 1].addr >= v->chunks[i - 1].size)
    return false;
  *out = v->chunks[i - 1];
  return true;
}

static void mp__hole_add(mp__segment_t *v, mp__block_t *h) {
  h->flags = MP__B_HOLE;
  h->ndeps = 0;
  h->requested = 0;
  h->sidx = (uint32_t)v->nholes;
  v->holes[v->nholes++] = h;
}

static void mp__hole_drop(mp_pool_t *pool, mp__segment_t *v, mp__block_t *h) {
  MP__ASSERT((h->flags & MP__B_HOLE) && h->sidx < v->nholes &&
             v->holes[h->sidx] == h);
  mp__block_t *last = v->holes[--v->nholes];
  v->holes[h->sidx] = last;
  last->sidx = h->sidx;
  mp__block_unlink(v, h);
  mp__rec_free(pool, h);
}

/* Merges the fresh free block r (not in the index) with the free neighbours
 * the placement chose (always: past MP__MAX_DEPS streams the merged block
 * waits for a device sync); a free neighbour left out is marked, so both
 * know they lie apart on purpose. Returns the merged block, not in the
 * index. */
static mp__block_t *mp__join_placed(mp_pool_t *pool, mp__block_t *r, bool jp,
                                    bool jn) {
  mp__block_t *n = r->next;
  if (n != NULL && (n->flags & MP__B_FREE)) {
    if (jn) {
      mp__index_remove(pool, n);
      (void)mp__block_absorb(pool, r, n, true);
    } else {
      r->flags |= MP__B_UNMERGED;
      n->flags |= MP__B_UNMERGED;
    }
  }
  mp__block_t *p = r->prev;
  if (p != NULL && (p->flags & MP__B_FREE)) {
    if (jp) {
      mp__index_remove(pool, p);
      (void)mp__block_absorb(pool, p, r, true);
      r = p;
    } else {
      r->flags |= MP__B_UNMERGED;
      p->flags |= MP__B_UNMERGED;
    }
  }
  return r;
}

/* Bookkeeping after [at, at + n) was mapped for stream handle made_for
 * (the chunk keeps it): inside hole h, or (h NULL) at or above the top, a
 * gap below it becoming a hole (spare's record; spare may be NULL when at
 * is the top or h's start, and no gap is left). The
 * new memory is a free block, merged with the neighbours jp/jn allow. The
 * device call (its count, its history event) is the caller's to record:
 * an unmap undone comes back through here without one. */
static mp__block_t *mp__after_map(mp_pool_t *pool, mp__segment_t *v,
                                  mp__block_t *h, uintptr_t at, size_t n,
                                  uintptr_t made_for, mp__block_t *r,
                                  mp__block_t *spare, bool jp, bool jn) {
  size_t i = mp__chunk_at(v, at);
  /* The new chunk lies between its neighbours, inside the range, and in
   * hole h (or at or above the top). */
  MP__ASSERT(v->nchunks < v->chunk_cap &&
             (spare == NULL || v->nholes < v->holes_cap));
  MP__ASSERT(i == 0 || v->chunks[i - 1].addr + v->chunks[i - 1].size <= at);
  MP__ASSERT(i == v->nchunks || at + n <= v->chunks[i].addr);
  MP__ASSERT(at + n <= v->base + v->va_size);
  MP__ASSERT(h == NULL ? at >= v->base + v->span
                       : at >= h->addr && at + n <= h->addr + h->size);
  memmove(&v->chunks[i + 1], &v->chunks[i],
          (v->nchunks - i) * sizeof *v->chunks);
  v->chunks[i].addr = at;
  v->chunks[i].size = n;
  v->chunks[i].made_for = made_for;
  v->nchunks++;
  v->size += n;
  pool->st.segment_count++;
  mp__reserved_add(pool, n);
  r->addr = at;
  r->size = n;
  r->flags = MP__B_FREE;
  if (h == NULL) {
    uintptr_t top = v->base + v->span;
    if (at > top) {
      MP__ASSERT(spare != NULL);
      spare->addr = top;
      spare->size = at - top;
      mp__block_link(v, v->last, spare);
      mp__hole_add(v, spare);
      spare = NULL;
    }
    mp__block_link(v, v->last, r);
    v->span = at + n - v->base;
  } else {
    uintptr_t hend = h->addr + h->size;
    if (at > h->addr) {
      h->size = at - h->addr;
      mp__block_link(v, h, r);
      if (at + n < hend) {
        MP__ASSERT(spare != NULL);
        spare->addr = at + n;
        spare->size = hend - (at + n);
        mp__block_link(v, r, spare);
        mp__hole_add(v, spare);
        spare = NULL;
      }
    } else {
      mp__block_link(v, h->prev, r);
      if (at + n < hend) {
        h->addr = at + n;
        h->size = hend - h->addr;
      } else {
        mp__hole_drop(pool, v, h);
      }
    }
  }
  if (spare != NULL)
    mp__rec_free(pool, spare);
  pool->st.free_blocks++;
  r = mp__join_placed(pool, r, jp, jn);
  mp__index_insert(pool, r);
  return r;
}

/* Bookkeeping before chunk i, lying wholly inside free block f (out of the
 * index), is unmapped: f splits into a free piece below, a hole, and a free
 * piece above (r2's record, with f's deps); holes next to each other merge
 * and a hole at the top goes, shrinking the span. Returns the hole that
 * holds the chunk now, NULL when it went with the top. */
static mp__block_t *mp__before_unmap(mp_pool_t *pool, mp__segment_t *v,
                                     mp__block_t *f, size_t i, mp__block_t *r1,
                                     mp__block_t *r2) {
  mp__chunk_t c = v->chunks[i];
  uintptr_t cend = c.addr + c.size, fend = f->addr + f->size;
  /* The chunk lies wholly inside free block f, taken out of the index. */
  MP__ASSERT(!(f->flags & (MP__B_FREE | MP__B_HOLE)));
  MP__ASSERT(c.addr >= f->addr && cend <= fend);
  if (cend < fend) {
    mp__block_split_into(pool, f, cend - f->addr, r2);
    r2 = NULL;
  }
  mp__block_t *h;
  if (c.addr > f->addr) {
    f->size = c.addr - f->addr;
    mp__index_insert(pool, f);
    h = r1;
    r1 = NULL;
    h->addr = c.addr;
    h->size = c.size;
    mp__block_link(v, f, h);
  } else {
    h = f;
    h->size = c.size;
    h->gen = 0;
    pool->st.free_blocks--;
  }
  mp__hole_add(v, h);
  mp__block_t *n = h->next;
  if (n != NULL && (n->flags & MP__B_HOLE)) {
    h->size += n->size;
    mp__hole_drop(pool, v, n);
  }
  mp__block_t *p = h->prev;
  if (p != NULL && (p->flags & MP__B_HOLE)) {
    p->size += h->size;
    mp__hole_drop(pool, v, h);
    h = p;
  }
  if (h->next == NULL) {
    v->span = h->addr - v->base;
    mp__hole_drop(pool, v, h);
    h = NULL;
  }
  memmove(&v->chunks[i], &v->chunks[i + 1],
          (v->nchunks - i - 1) * sizeof *v->chunks);
  v->nchunks--;
  v->size -= c.size;
  pool->st.segment_count--;
  mp__reserved_sub(pool, c.size);
  if (r1 != NULL)
    mp__rec_free(pool, r1);
  if (r2 != NULL)
    mp__rec_free(pool, r2);
  return h;
}

/* Unmaps chunk i of v, lying wholly inside releasable free block f. false
 * when it could not (the memory then stays the pool's, free). *hole (hole
 * may be NULL): the hole that holds the chunk after, NULL when it went with
 * the top; it stays as it is while the lock is dropped for the call (growth,
 * trim and pause wait for the release in flight); where the device refused
 * the unmap, the free block that holds the chunk again (NULL: it could not
 * be tried). */
static bool mp__unmap_chunk(mp_pool_t *pool, mp__segment_t *v, mp__block_t *f,
                            size_t i, mp__block_t **hole) {
  /* Four records: two for the unmap's split, two to put the chunk back
   * if the device refuses (taken now: with none to spare then, it stayed
   * mapped outside the tables, reserved_bytes short of what the device
   * held, a hole that growth would map over, never unmapped at release). */
  mp__block_t *recs;
  if (hole != NULL)
    *hole = NULL;
  if (!mp__vrange_room(v, 1) || (recs = mp__recs_new(pool, 4)) == NULL)
    return false;
  mp__block_t *r1 = mp__recs_pop(&recs), *r2 = mp__recs_pop(&recs);
  mp__chunk_t c = v->chunks[i];
  mp__index_remove(pool, f);
  mp__block_t *h = mp__before_unmap(pool, v, f, i, r1, r2);
  if (hole != NULL)
    *hole = h;
  mp__pool_device_begin(pool);
  mp_status_t st = mp__device_vm_unmap(pool->dev, (void *)c.addr, c.size);
  mp__pool_device_end(pool);
  if (st == MP_OK) {
    mp__recs_free(pool, recs);
    pool->st.device_free_count++;
    /* The stream it was mapped for, whoever's release unmaps it, as
     * PyTorch's segment_unmap entry says its expandable segment's
     * (CUDACachingAllocator.cpp, unmap_block: record_trace(SEGMENT_UNMAP,
     * ..., block->stream), every block of the segment that stream's). A
     * trim's said 0, a growth's the stream of the request that grew. */
    MP__HIST(pool, MP__H_SEGMENT_UNMAP, c.addr, c.size, c.made_for);
    return true;
  }
  /* Still mapped: take it back as free memory where it was (no map was
   * made: no device call counted, no event). The tables have room: the
   * unmap took out the chunk, and a gap left for a hole record (spare) is
   * a hole it merged away. */
  mp__block_t *back = mp__hole_at(v, c.addr);
  bool gap = back != NULL ? c.addr > back->addr &&
                                c.addr + c.size < back->addr + back->size
                          : c.addr > v->base + v->span;
  mp__block_t *r = mp__recs_pop(&recs), *spare = mp__recs_pop(&recs);
  if (!gap) {
    mp__rec_free(pool, spare);
    spare = NULL;
  }
  mp__block_t *kept = mp__after_map(pool, v, back, c.addr, c.size, c.made_for,
                                    r, spare, true, true);
  if (hole != NULL)
    *hole = kept;
  mp__recs_free(pool, recs);
  pool->give_back_refused++;
  pool->give_back_st = st;
  return false;
}

/* Chunks the device refused to unmap in this reclaim, by address: not
 * picked again until the next (a refusal is a transient driver error that
 * the next trim tries again). Before, the first refusal ended the pick
 * loop, so a trim keeping some bytes, or growth reclaiming, left every
 * other free chunk mapped and asked for the refused one again. */
typedef struct mp__refused {
  size_t n;
  uintptr_t addr[8];
} mp__refused_t;

static bool mp__refused_has(const mp__refused_t *no, uintptr_t a) {
  for (size_t j = 0; j < no->n; j++)
    if (no->addr[j] == a)
      return true;
  return false;
}

/* Picks a free chunk to unmap: one lying wholly inside a free block of v
 * other than k1/k2 and not in no, and releasable now; the smallest of at least
 * want bytes, else the largest, the lowest address among equals. pending: one
 * was passed over only for pending work. The candidates are the free blocks of
 * a granule or more, read from the free index (in size order, hence the
 * explicit tie on the address), not every block of the range in address
 * order: with 10 000 live blocks the walk read some 10 700 records for the
 * 750 free ones, about 80 000 instructions each time growth reclaimed
 * before passing its peak (bench_pool_pairs at 10 000 live: 3.4 a pair). */
static bool mp__pick_chunk(mp_pool_t *pool, mp__segment_t *v, size_t want,
                           const mp__block_t *k1, const mp__block_t *k2,
                           const mp__refused_t *no, mp__block_t **fo,
                           size_t *io, bool *pending) {
  bool found = false;
  size_t best = 0;
  for (mp__block_t *b = mp__index_best_fit(pool, pool->granule); b != NULL;
       b = mp__index_next(pool, b)) {
    if (b->seg != v || b == k1 || b == k2)
      continue;
    uintptr_t end = b->addr + b->size;
    size_t i = mp__chunk_at(v, b->addr);
    if (i == v->nchunks || v->chunks[i].addr + v->chunks[i].size > end)
      continue;
    if (!mp__deps_safe(pool, b, UINT32_MAX, false)) {
      *pending = true;
      continue;
    }
    for (; i < v->nchunks && v->chunks[i].addr + v->chunks[i].size <= end;
         i++) {
      size_t cs = v->chunks[i].size;
      if (mp__refused_has(no, v->chunks[i].addr))
        continue;
      bool better = !found ||
                    (cs >= want ? (best < want || cs < best)
                                : (best < want && cs > best)) ||
                    (cs == best && v->chunks[i].addr < v->chunks[*io].addr);
      if (better) {
        found = true;
        best = cs;
        *fo = b;
        *io = i;
      }
    }
  }
  return found;
}

/* The highest chunk lying wholly inside free block b and below ceil, in
 * *i; false: none. The chunks under a free block are adjacent, so at most
 * the top one reaches past its end. */
static bool mp__top_chunk_in(const mp__segment_t *v, const mp__block_t *b,
                             uintptr_t ceil, size_t *i) {
  uintptr_t end = b->addr + b->size < ceil ? b->addr + b->size : ceil;
  size_t j = mp__chunk_at(v, end);
  if (j > 0 && v->chunks[j - 1].addr + v->chunks[j - 1].size > end)
    j--;
  if (j == 0 || v->chunks[j - 1].addr < b->addr)
    return false;
  *i = j - 1;
  return true;
}

/* Trim's case, every releasable chunk: one walk down from the top. An
 * unmap changes only the blocks around its chunk, which the walk has
 * reached, so nothing below needs a second look, where picking chunk after
 * chunk would rescan the range for each (quadratic in a range of many
 * small chunks: map_piece). The lock is dropped for each device call, and
 * meanwhile other threads free, take and split blocks: the block below
 * the chunk may have been merged away and its record used again elsewhere
 * (a walk that went on from it stopped short, leaving free chunks mapped,
 * or strayed). So the walk goes on from what is below the hole the chunk
 * left (mp__unmap_chunk says which: no search), which stays while a release
 * is in flight, or from the new top when the hole reached it. Returns the
 * bytes released. */
static size_t mp__vrange_release_all(mp_pool_t *pool, mp__segment_t *v,
                                     const mp__block_t *k1,
                                     const mp__block_t *k2) {
  size_t done = 0, i = 0;
  uintptr_t ceil = UINTPTR_MAX; /* below a chunk the device refused */
  mp__block_t *b = v->last;
  while (b != NULL) {
    if (!(b->flags & MP__B_FREE) || b->size < pool->granule || b == k1 ||
        b == k2 || !mp__top_chunk_in(v, b, ceil, &i) ||
        !mp__deps_safe(pool, b, UINT32_MAX, false)) {
      b = b->prev;
      continue;
    }
    mp__chunk_t c = v->chunks[i];
    mp__block_t *h;
    if (!mp__unmap_chunk(pool, v, b, i, &h)) {
      /* Refused (a transient driver error): the chunks below are still
       * tried, from the free block that holds this one again, as plain
       * segments are (mp__plain_trim_one); it waits for the next trim. No
       * records (h NULL): nothing more can be unmapped now. */
      if (h == NULL)
        break;
      ceil = c.addr;
      b = h;
      continue;
    }
    done += c.size;
    b = h != NULL ? h->prev : v->last;
  }
  return done;
}

/* Unmaps free chunks of the virtual range until want bytes went back (or
 * none is left), never one inside k1 or k2. patient: the growth rung. A
 * pool used from one stream records no marker at frees; when free chunks
 * wait only for that stream, it is asked once whether it is idle
 * (mp_stream_query, never a wait: the stream may hold the application's
 * own work, even work waiting for this caller); if not, the pool grows. A pool
 * used from several streams does the same with every stream it knows: when
 * the only free chunks wait for streams' work, each stream owing work is
 * asked once whether it is idle (no marker waited for, so the answer is the
 * same in every run whenever the streams have caught up; a stream still busy
 * keeps its chunks, and its open epoch is closed so that a later look can
 * find them done), unless it has stream_waits=1 (below). Before 2026-11-29
 * every such pool skipped the rung unless it had a split limit, and the
 * 10-stream llama trace grew past free chunks at its peak (1.140 against
 * 1.135; 1.140 against 1.029 with map_piece=32M).
 * Trim and the out-of-memory ladder, after waiting for the streams, still
 * unmap free chunks anywhere. Never a device synchronize here. Returns the
 * bytes released. */
size_t mp__vrange_reclaim(mp_pool_t *pool, size_t want, const mp__block_t *k1,
                          const mp__block_t *k2, bool patient) {
  MP__ASSERT_LOCKED(pool);
  mp__segment_t *v = pool->vseg;
  size_t done = 0;
  if (!patient && v != NULL && want >= mp__free_bytes(pool))
    return mp__vrange_release_all(pool, v, k1, k2);
  /* stream_waits=1 promises figures that do not depend on how far behind
   * the streams run (test_replay_figures): which streams are idle when
   * asked does, so such a pool used from several streams skips the rung,
   * except under a split limit once a quarter of what is reserved is free
   * (free blocks above the limit cannot serve small requests). */
  if (patient && pool->nstreams > 1 &&
      (pool->cfg.flags & MP_POOL_STREAM_WAITS) &&
      (mp__vsplit_limit(pool) == 0 ||
       mp__free_bytes(pool) < pool->st.reserved_bytes / 4))
    return 0;
  mp__refused_t no = {0};
  while (v != NULL && done < want) {
    bool pending = false;
    mp__block_t *f = NULL;
    size_t i = 0;
    if (!mp__pick_chunk(pool, v, want - done, k1, k2, &no, &f, &i, &pending)) {
      if (!pending || !patient)
        break;
      patient = false;
      /* Never wait: a stream may hold the application's own work, even
       * work that waits for this very caller. Idle streams' frees are done
       * now; a busy one keeps its chunks. */
      if (pool->nstreams > 1)
        (void)mp__streams_all_idle_now(pool);
      else if (!mp__stream_idle_now(pool, 0))
        break;
      continue;
    }
    mp__chunk_t c = v->chunks[i];
    uint64_t refused = pool->give_back_refused;
    if (!mp__unmap_chunk(pool, v, f, i, NULL)) {
      /* Refused: the others are still tried, as the trim's walk does
       * (mp__vrange_release_all); no records left (room for none), or
       * refused too often for one call: the next trim tries again. */
      if (no.n == sizeof no.addr / sizeof no.addr[0] ||
          pool->give_back_refused == refused)
        break;
      no.addr[no.n++] = c.addr;
      continue;
    }
    done += c.size;
  }
  return done;
}

/* Where growth maps: inside hole (NULL: at the top) at `at`, `need` bytes
 * at least and `bytes` preferably; jp/jn: merge with the free neighbour
 * below/above; k1/k2: the free blocks it completes. */
typedef struct mp__placement {
  mp__block_t *hole;
  uintptr_t at;
  size_t need, bytes;
  bool jp, jn;
  mp__block_t *k1, *k2;
} mp__placement_t;

/* Bytes of free block b that growth on stream sidx may count on. */
static size_t mp__usable_bytes(mp_pool_t *pool, mp__block_t *b, uint32_t sidx) {
  return b != NULL && (b->flags & MP__B_FREE) && mp__deps_usable(pool, b, sidx)
             ? b->size
             : 0;
}

/* Bytes to map so that `have` free bytes next to them hold size. */
static size_t mp__bytes_to_map(const mp_pool_t *pool, size_t size,
                               size_t have) {
  size_t n = mp__round_up(size > have ? size - have : 0, pool->granule);
  return n ? n : pool->granule;
}

/* The lowest address at or above a where n bytes lie clear of the strays.
 * Each stray moves it at most once (past its end, it never meets that one
 * again); strays are whole granules where growth or resume mapped, so the
 * address stays on a granule. */
static uintptr_t mp__past_strays(const mp_pool_t *pool, uintptr_t a, size_t n) {
  for (bool moved = pool->nstrays > 0; moved;) {
    moved = false;
    for (size_t i = 0; i < pool->nstrays; i++) {
      mp__chunk_t c = pool->strays[i];
      if (mp__chunk_meets(c, a, n)) {
        a = c.addr + c.size;
        moved = true;
      }
    }
  }
  return a;
}

/* Whether [a, a + n) lies clear of the strays (pool->strays): a stray is
 * still mapped there, so a map over it would first have to unmap it, and
 * the device refused that. */
static bool mp__clear_of_strays(const mp_pool_t *pool, uintptr_t a, size_t n) {
  return mp__past_strays(pool, a, n) == a;
}

static void mp__placement_offer(mp__placement_t *best, bool *found,
                                mp__block_t *hole, uintptr_t at, size_t n,
                                bool jp, bool jn, mp__block_t *k1,
                                mp__block_t *k2) {
  if (*found && n >= best->need)
    return;
  *found = true;
  best->hole = hole;
  best->at = at;
  best->need = best->bytes = n;
  best->jp = jp;
  best->jn = jn;
  best->k1 = jp ? k1 : NULL;
  best->k2 = jn ? k2 : NULL;
}

/* The best place for size on sidx; false when neither the top nor a hole
 * has room. Never on a stray (mp__vrange_grow retried their unmap first):
 * a place that completes a free block but would cover one is passed over,
 * and fresh memory (joining no block) goes past it, the gap below a hole. */
static bool mp__find_placement(mp_pool_t *pool, mp__segment_t *v, size_t size,
                               uint32_t sidx, mp__placement_t *best) {
  size_t lim = mp__vsplit_limit(pool), g = pool->granule;
  size_t step = pool->st.reserved_bytes / 128;
  if (step > ((size_t)16 << 20))
    step = (size_t)16 << 20;
  if (step < pool->cfg.segment_bytes)
    step = pool->cfg.segment_bytes;
  step = mp__round_up(step, g);
  bool found = false;
  /* The top first, so that it wins ties. */
  mp__block_t *t = v->last;
  uintptr_t at = v->base + v->span;
  size_t f = mp__usable_bytes(pool, t, sidx);
  size_t n = mp__bytes_to_map(pool, size, f);
  bool jp = f > 0 && mp__merge_ok(lim, f + n, size) &&
            mp__clear_of_strays(pool, at, n);
  if (!jp) {
    n = mp__bytes_to_map(pool, size, 0);
    at = mp__past_strays(pool, at, n);
  }
  /* at - base + n could wrap near SIZE_MAX */
  if (at - v->base <= v->va_size && n <= v->va_size - (at - v->base))
    mp__placement_offer(best, &found, NULL, at, n, jp, false, t, NULL);
  for (size_t k = 0; k < v->nholes; k++) {
    mp__block_t *h = v->holes[k];
    mp__block_t *lo = h->prev, *up = h->next;
    size_t fl = mp__usable_bytes(pool, lo, sidx),
           fu = mp__usable_bytes(pool, up, sidx);
    uintptr_t hend = h->addr + h->size;
    if (fl + h->size + fu >= size &&
        mp__merge_ok(lim, fl + h->size + fu, size) && (fl || fu) &&
        mp__clear_of_strays(pool, h->addr, h->size))
      mp__placement_offer(best, &found, h, h->addr, h->size, fl > 0, fu > 0, lo,
                          up);
    if (fl > 0 && (n = mp__bytes_to_map(pool, size, fl)) <= h->size &&
        mp__merge_ok(lim, fl + n + (n == h->size ? fu : 0), size) &&
        mp__clear_of_strays(pool, h->addr, n))
      mp__placement_offer(best, &found, h, h->addr, n, true,
                          n == h->size && fu > 0, lo, up);
    if (fu > 0 && (n = mp__bytes_to_map(pool, size, fu)) <= h->size &&
        mp__merge_ok(lim, fu + n + (n == h->size ? fl : 0), size) &&
        mp__clear_of_strays(pool, hend - n, n))
      mp__placement_offer(best, &found, h, hend - n, n, n == h->size && fl > 0,
                          true, lo, up);
    if ((n = mp__bytes_to_map(pool, size, 0)) <= h->size &&
        (at = mp__past_strays(pool, h->addr, n)) <= hend - n)
      mp__placement_offer(best, &found, h, at, n, false, false, NULL, NULL);
  }
  if (!found)
    return false;
  /* Map a step at least where there is room, so that small requests do not
   * map one granule at a time; under a split limit, only as far as the
   * fresh block stays splittable (a big request gets what it asks). */
  size_t have =
      (best->jp ? best->k1->size : 0) + (best->jn ? best->k2->size : 0);
  if (lim != 0) {
    size_t room = size <= lim && lim > have ? lim - have : 0;
    room = room / g * g;
    step = step < room ? step : 0;
  } else {
    /* No step past the peak while the pool holds a step's worth of free
     * memory, but under an eighth of what it reserves: it grows then only
     * because what is free is scattered, and memory mapped past what the
     * request lacks lifts the peak by memory no request asked for (at most
     * up to the old peak is mapped). A pool with less free memory grows
     * for demand, and the step saves calls and gathers small requests
     * (without it, cs336_silmont_mem's small blocks fenced its 512 MiB
     * ones: 1.001 to 1.162); one with more is in a churn where the slack
     * serves the next round (adversarial 1.825 to 1.922 without the
     * bound). Under a split limit (above) the step stays as it was: the
     * rule worsened four max_split=64M rows. history.md, 2026-11-30
     * afternoon. */
    size_t res = pool->st.reserved_bytes, fb = mp__free_bytes(pool);
    size_t peak = pool->st.peak_reserved_bytes;
    if (fb >= step && fb < res / 8 && res + step > peak)
      step = peak > res ? (peak - res) / g * g : 0;
  }
  /* Up from at to the hole's end or the range's, or (joining only the
   * block above) down from the hole's end; not over a stray. */
  bool down = best->hole != NULL && best->jn && !best->jp;
  uintptr_t end = best->hole != NULL ? best->hole->addr + best->hole->size
                                     : v->base + v->va_size;
  size_t space = down ? best->hole->size : end - best->at;
  if (step > space)
    step = space;
  at = down ? end - step : best->at;
  if (step > best->need && mp__clear_of_strays(pool, at, step)) {
    best->bytes = step;
    best->at = at;
  }
  return true;
}

/* Whether b, next to memory just mapped, is still the free block the
 * placement joined it to before the lock was dropped for the map: at a, of
 * n bytes, usable on sidx. */
static bool mp__still_placed(mp_pool_t *pool, mp__block_t *b, uintptr_t a,
                             size_t n, uint32_t sidx) {
  return b != NULL && b->addr == a && b->size == n &&
         mp__usable_bytes(pool, b, sidx) == n;
}

mp_status_t mp__vrange_grow(mp_pool_t *pool, size_t size, uint32_t sidx,
                            mp__block_t **fresh) {
  MP__ASSERT_LOCKED(pool);
  mp__segment_t *v = pool->vseg;
  mp__placement_t p = {0};
  /* The strays first: the device may take them back now (their memory
   * counts against the cap), and the placement goes around those it
   * still refuses, where a map over one failed (its unmap refused again)
   * at every growth that chose the same place. */
  if (pool->nstrays > 0)
    (void)mp__vrange_strays_retry(pool);
  for (int round = 0;; round++) {
    if (!mp__find_placement(pool, v, size, sidx, &p))
      return MP_ENOTSUP; /* range exhausted: the caller goes plain */
    /* Rung: reclaim free chunks, then grow, so that reserved memory does
     * not rise above its peak while free chunks lie elsewhere. Then the
     * placement is made again, whatever the reclaim gave back: it drops the
     * lock for each unmap (other threads free, take, split and merge blocks
     * meanwhile), and an unmap that fails puts its chunk back in new
     * records, the hole above it (p.hole) given back to the pool. */
    size_t after = pool->st.reserved_bytes + p.bytes;
    if (round > 0 || after <= pool->st.peak_reserved_bytes)
      break;
    /* As much as the growth maps, not only what it lifts past the peak
     * (where reserved lies below its peak, a trim or an earlier reclaim
     * having given memory back): free chunks scattered among live blocks
     * served no request here, and the memory the growth maps takes their
     * place, so that later growths past the peak start from less
     * (`random` 1.2266 to 1.2149, seeds 8 and 9 1.2119 to 1.2022 and
     * 1.2207 to 1.1973, no row of the suite worse, seeds 1 to 12;
     * history.md, 2026-12-06 helper-251). Not under a split limit nor with
     * map_piece, where it made rows worse (llm 1.0160 to 1.0263 and llama
     * 1.1760 to 1.2358 under max_split=64M, random 1.1680 to 1.1817 under
     * map_piece=32M). */
    size_t want = after - pool->st.peak_reserved_bytes;
    if (mp__vsplit_limit(pool) == 0 && pool->cfg.map_piece == 0)
      want = p.bytes;
    (void)mp__vrange_reclaim(pool, want, p.k1, p.k2, true);
  }
  size_t room = mp__pool_room(pool);
  size_t grow = p.bytes;
  if (grow > room) {
    /* Only the exact need fits: it must still touch the blocks it
     * completes, so one placed against the hole's top edge moves up. */
    grow = p.need;
    if (p.hole != NULL && p.jn && !p.jp)
      p.at = p.hole->addr + p.hole->size - grow;
  }
  if (grow > room) {
    /* Whole granules do not fit what is left under the cap, but the
     * request does: a plain segment of its own size (mp__plain_grow takes
     * exactly size when its rounding does not fit), if the device gives
     * one. A range of the cap's size (before 2026-11-29) did so by running
     * out: staging completed on a 86.6 MiB host device, then needed 88.0
     * (its 6.56 MiB request found 7 MiB left, the granules asked 8). Not
     * for a pool that must stay pausable (MP_POOL_PAUSABLE): no pause can
     * keep a plain segment's blocks. The request fits under the cap: a
     * segment the device refuses is the device's answer (out of memory),
     * not the cap's; before, MP_ELIMIT named a cap the request was within.
     * Memory off the pool's align (MP_ENOTSUP) stays the cap's answer:
     * the caller would go plain again on it. */
    if (size <= room && !(pool->cfg.flags & MP_POOL_PAUSABLE)) {
      mp_status_t st = mp__plain_grow(pool, size, sidx, fresh);
      if (st != MP_ENOTSUP)
        return st;
    }
    return mp__segment_limit(pool);
  }
  /* One mapping, or (map_piece) pieces of at most map_piece, each its own
   * mapping: CUDA unmaps only whole mappings, so a piece can go back
   * (reclaim, trim) once it alone is free, where one big mapping waits
   * until all of it is. Room and records for every piece first, so that
   * the bookkeeping after the device calls cannot fail. */
  size_t piece = pool->cfg.map_piece != 0
                     ? mp__round_up(pool->cfg.map_piece, pool->granule)
                     : grow;
  size_t npieces = grow / piece + (grow % piece != 0);
  if (!mp__vrange_room(v, npieces))
    return mp__fail(MP__EHOST, "out of host memory for chunk records");
  mp__block_t *recs = mp__recs_new(pool, npieces + 1);
  if (recs == NULL)
    return mp__fail(MP__EHOST, "out of host memory for block records");
  /* The pieces are mapped in one go, the lock dropped once. A piece the
   * device refuses ends it: those mapped before it stay the pool's, as
   * free memory (the out-of-memory ladder may trim them), and the call
   * fails. But where the device is out of memory for a step past the need
   * (others hold the rest of it), the growth is the exact need instead, or
   * what it mapped where that holds the request already: before, the
   * request failed at every rung of the ladder, each growth asking the
   * same step again (a 2 MiB request with 10 MiB free and a 16 MiB step).
   * Down from a hole's end (joining only the block above) only when
   * nothing was mapped yet: its pieces go up from p.at. */
  size_t mapped = 0;
  uintptr_t a1 = p.jp ? p.k1->addr : 0, a2 = p.jn ? p.k2->addr : 0;
  size_t n1 = p.jp ? p.k1->size : 0, n2 = p.jn ? p.k2->size : 0;
  bool down = p.hole != NULL && p.jn && !p.jp;
  pool->grow_inflight = grow; /* a cap change meanwhile counts it */
  mp__pool_device_begin(pool);
  mp_status_t st = MP_OK;
  while (mapped < grow && st == MP_OK) {
    size_t n = grow - mapped < piece ? grow - mapped : piece;
    if ((st = mp__pool_vm_map(pool, (void *)(p.at + mapped), n)) == MP_OK) {
      mapped += n;
    } else if (st == MP_ENOMEM && grow > p.need && (mapped == 0 || !down)) {
      grow = mapped > p.need ? mapped : p.need;
      if (down)
        p.at = p.hole->addr + p.hole->size - grow;
      st = MP_OK;
    }
  }
  mp__pool_device_end(pool);
  mp__vrange_strays_count(pool);
  /* Meanwhile other threads freed, took, split and merged blocks: the new
   * memory joins a neighbour only if it is still the free block the
   * placement counted on (a block merged into a bigger one may be above
   * max_split, one taken and freed again may wait for another stream);
   * else they stay apart, marked so (mp__join_placed). The hole stays as
   * it was (growth and release wait for the map in flight). jp: the new
   * memory starts at the hole's start or at the top; jn: it ends at the
   * hole's end. */
  if (p.jp &&
      !mp__still_placed(pool, p.hole ? p.hole->prev : v->last, a1, n1, sidx))
    p.jp = false;
  if (p.jn && !mp__still_placed(pool, p.hole->next, a2, n2, sidx))
    p.jn = false;
  mp__block_t *h = p.hole;
  for (size_t off = 0; off < mapped; off += piece) {
    size_t n = mapped - off < piece ? mapped - off : piece;
    /* Each piece after the first starts where the one below it ended: at
     * the top (h NULL), or at the start of what is left of the hole, the
     * block right above the one the pieces so far made. So only the first
     * can leave a gap that needs a hole record (spare); each joins the one
     * below it, and only the last touches the free neighbour above. */
    mp__block_t *rec = mp__recs_pop(&recs);
    mp__block_t *spare = off == 0 ? mp__recs_pop(&recs) : NULL;
    pool->st.device_alloc_count++;
    /* The request's stream, as PyTorch's segment_map entry says the
     * stream the expandable segment grew for (map_block: record_trace(
     * SEGMENT_MAP, ..., p.stream())); 0 for a take for every stream. */
    MP__HIST(pool, MP__H_SEGMENT_MAP, p.at + off, n,
             MP__HIST_STREAM(pool, sidx));
    *fresh = mp__after_map(
        pool, v, h, p.at + off, n, MP__HIST_STREAM(pool, sidx), rec, spare,
        off == 0 ? p.jp : true, off + n == grow ? p.jn : false);
    h = h != NULL ? (*fresh)->next : NULL;
    MP__ASSERT(off + n == mapped || h == NULL ||
               ((h->flags & MP__B_HOLE) && h->addr == p.at + off + n));
  }
  mp__recs_free(pool, recs);
  return st;
}

/* Unmaps the strays (pool->strays) that overlap [a, a + bytes), every one
 * of them (one refused does not keep the others); the failure of the first
 * that stays mapped. */
static mp_status_t mp__strays_unmap(mp_pool_t *pool, uintptr_t a,
                                    size_t bytes) {
  mp_status_t first = MP_OK;
  mp__chunk_t left = {0};
  char why[MP__ERROR_MAX] = "";
  for (size_t i = 0; i < pool->nstrays;) {
    mp__chunk_t c = pool->strays[i];
    if (!mp__chunk_meets(c, a, bytes)) {
      i++;
      continue;
    }
    uint64_t since = mp__error_serial();
    mp_status_t st = mp__device_vm_unmap(pool->dev, (void *)c.addr, c.size);
    if (st == MP_OK) {
      pool->strays[i] = pool->strays[--pool->nstrays];
      continue;
    }
    if (first == MP_OK) {
      first = mp__device_said(st, since);
      left = c;
      snprintf(why, sizeof why, "%s", mp_last_error());
    }
    i++;
  }
  if (first == MP_OK)
    return MP_OK;
  return mp__fail(first,
                  "the mapping at %p (%zu bytes) a refused peer access left "
                  "is still mapped: %s",
                  (void *)left.addr, left.size, why);
}

mp_status_t mp__vrange_strays_retry(mp_pool_t *pool) {
  MP__ASSERT_LOCKED(pool);
  /* A call in flight may be changing the strays: not waited for (another
   * arena's reclaim trims this one while its growth may be held up, and
   * would wait for it), the next trim tries again. */
  if (pool->inflight || pool->nstrays == 0)
    return MP_OK;
  mp__pool_device_begin(pool);
  mp_status_t st =
      mp__strays_unmap(pool, pool->vseg->base, pool->vseg->va_size);
  mp__pool_device_end(pool);
  mp__vrange_strays_count(pool);
  return st;
}

void mp__vrange_strays_count(mp_pool_t *pool) {
  MP__ASSERT_LOCKED(pool);
  /* The strays change only with a device call in flight, one at a time:
   * the one that just ended (a map: mp__pool_vm_map, or a retry). They
   * are counted here, under the lock, where the stats are read, not where
   * they change (the lock dropped). A paused pool holds them too once
   * resumed (paused_reserved). */
  size_t held = 0;
  for (size_t i = 0; i < pool->nstrays; i++)
    held += pool->strays[i].size;
  if (held == pool->stray_bytes)
    return;
  pool->st.reserved_bytes = pool->st.reserved_bytes - pool->stray_bytes + held;
  if (pool->paused)
    pool->paused_reserved = pool->paused_reserved - pool->stray_bytes + held;
  pool->stray_bytes = held;
  mp__stats_peaks(pool);
}

mp_status_t mp__pool_vm_map(mp_pool_t *pool, void *addr, size_t bytes) {
  /* The peers cannot change while a map is in flight (mp_pool_set_access
   * waits for it). With one, a refused access may leave a stray: room for
   * its record first, so that it is never forgotten (a fixed table of
   * eight forgot the ninth, which the next growth there then mapped over;
   * its memory was held until the process ended). */
  unsigned n = atomic_load_explicit(&pool->npeers, memory_order_acquire);
  if (n > 0) {
    mp__chunk_t *s = mp__host_room(pool->strays, &pool->strays_cap,
                                   pool->nstrays, sizeof *s);
    if (s == NULL)
      return mp__fail(MP__EHOST, "out of host memory for the record of a "
                                 "mapping its peers may be refused");
    pool->strays = s;
  }
  mp_status_t st = pool->nstrays > 0
                       ? mp__strays_unmap(pool, (uintptr_t)addr, bytes)
                       : MP_OK;
  if (st == MP_OK)
    st = mp__device_vm_map(pool->dev, addr, bytes);
  for (unsigned i = 0; st == MP_OK && i < n; i++) {
    uint64_t since = mp__error_serial();
    st = mp__device_vm_access(pool->dev, addr, bytes, pool->peers[i]);
    if (st != MP_OK) {
      char why[MP__ERROR_MAX];
      st = mp__device_said(st, since);
      snprintf(why, sizeof why, "%s", mp_last_error());
      /* Refused too, the mapping stays on the device outside the chunks:
       * kept (a stray), never served (a peer cannot reach it), unmapped
       * before a map over it, tried again at trim and pause (pause.c) and
       * unmapped at release. Before, it was forgotten: its memory held
       * until the process ended, and the next growth at its address mapped
       * over it. */
      if (mp__device_vm_unmap(pool->dev, addr, bytes) != MP_OK)
        pool->strays[pool->nstrays++] =
            (mp__chunk_t){.addr = (uintptr_t)addr, .size = bytes};
      mp__fail(st, "%s", why);
    }
  }
  return st;
}

void mp__vrange_release(mp_pool_t *pool, mp__segment_t *s, mp__lost_t *lost) {
  /* The device's reason for each refusal only where it gave one
   * (mp__device_said): else the note took an older failure for it. */
  for (size_t i = mp__pool_chunks_mapped(pool, s); i-- > 0;) {
    mp__chunk_t c = s->chunks[i];
    uint64_t since = mp__error_serial();
    mp_status_t st = mp__device_vm_unmap(pool->dev, (void *)c.addr, c.size);
    if (st == MP_OK)
      pool->st.device_free_count++;
    else
      mp__lost_note(lost, mp__device_said(st, since), "unmap the chunk", c.addr,
                    c.size);
  }
  mp_status_t st = mp__strays_unmap(pool, s->base, s->va_size);
  if (st != MP_OK)
    mp__lost_note(lost, st, "unmap a stray mapping in the range", s->base,
                  s->va_size);
  free(pool->strays);
  pool->strays = NULL;
  pool->nstrays = pool->strays_cap = 0;
  /* Refused too where a mapping stays in it (cuMemAddressFree). */
  uint64_t since = mp__error_serial();
  st = mp__device_vm_release(pool->dev, (void *)s->base, s->va_size);
  if (st != MP_OK)
    mp__lost_note(lost, mp__device_said(st, since), "release the virtual range",
                  s->base, s->va_size);
  free(s->chunks);
  free(s->holes);
}
