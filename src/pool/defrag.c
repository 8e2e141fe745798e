/* defrag.c - movable blocks, defragmentation and freeze.
 *
 * A movable block is an ordinary live block with MP__B_MOVABLE set; its
 * handle names a slot that points at the block's host record (handle.c),
 * so a move updates the handle by updating the record.
 *
 * Defragmentation is a sliding compaction inside each segment: walking the
 * blocks in address order, a movable block whose lower neighbour is free
 * slides down onto it, so the free space bubbles up, coalescing with what
 * it meets, until a block that may not move (a raw-pointer block, a child
 * pool's range) stops it; above the last frozen block only, so frozen
 * blocks and the holes below them stay as they are. Plain segments are then
 * evacuated when every block in them is movable and fits in free space
 * elsewhere, so trim can give them back.
 *
 * Copies are queued on the caller's stream after one device synchronize
 * (so work queued before on any stream, on the blocks or on the space they
 * move into, is done). A slide by a gap smaller than the block overlaps
 * itself, so it is copied low to high in chunks no larger than the gap: a
 * chunk's destination then only covers source bytes already copied. When
 * the gap is tiny compared with the block, a staging buffer (one device
 * allocation per defragmentation, only where the pool's cap leaves room
 * for it, and counted against the cap while it lives) makes the chunks as
 * large as the buffer instead. The space a block leaves gets a dep on the
 * copy stream, and the block gets the copy stream as a use, so no other
 * stream reuses either before the copies are done. A slide the device
 * refuses part-way copies back the bytes it overwrote: the block keeps its
 * data where it was.
 *
 * Invariant: the copies for a move are queued before the pool lock is
 * released, so whoever reuses the space it vacated orders after them; the
 * blocks still tile each segment and the free index and live map match. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pool_internal.h"

/* Use a staging buffer when a block is more than this many times its gap. */
#define MP__STAGE_RATIO 64
#define MP__STAGE_MAX   ((size_t)64 << 20)

typedef struct mp__mover {
  mp_pool_t *pool;
  mp_stream_t s;
  uint32_t sidx;
  uintptr_t stage; /* staging buffer or 0 */
  size_t stage_size;
  size_t need;  /* stop once a free block of this size exists; 0: never */
  size_t moved; /* bytes copied to new homes */
} mp__mover_t;

static bool mp__is_mover(const mp__block_t *b) {
  return (b->flags & (MP__B_FREE | MP__B_MOVABLE | MP__B_FROZEN)) ==
         MP__B_MOVABLE;
}

/* The last block of seg that starts below its fence; NULL when none does
 * (or seg has no fence). */
static mp__block_t *mp__below_fence(const mp__segment_t *seg) {
  mp__block_t *x = seg->fence != 0 ? seg->last : NULL;
  while (x != NULL && x->addr >= seg->fence)
    x = x->prev;
  return x;
}

/* The first block defragmentation may touch: the first that starts at or
 * above the segment's fence (the top of what was live at the last freeze),
 * or the segment's first. The fence stays where freeze put it when frozen
 * blocks are freed, so nothing is ever moved into the space below it. */
static mp__block_t *mp__above_fence(const mp__segment_t *seg) {
  mp__block_t *x = mp__below_fence(seg);
  return x != NULL ? x->next : seg->first;
}

/* The bytes of free block f above its segment's fence when f starts below
 * it (the top frozen block freed, joined with free space above the
 * fence); else 0. That part is space defragmentation closes. */
static size_t mp__straddle(const mp__block_t *f) {
  uintptr_t fence = f->seg->fence;
  return (f->flags & MP__B_FREE) && f->addr < fence && f->addr + f->size > fence
             ? f->addr + f->size - fence
             : 0;
}

/* Whether free block f may receive a moved block: not below its
 * segment's fence (a free block straddling it counts as below). */
static bool mp__above_fence_free(const mp__block_t *f) {
  return f->addr >= f->seg->fence;
}

/* ---- copies ----------------------------------------------------------- */

/* One chunk of a slide: c bytes from src to dst on the mover's stream,
 * through the staging buffer when staged. */
static mp_status_t mp__copy_chunk(mp__mover_t *m, uintptr_t dst, uintptr_t src,
                                  size_t c, bool staged) {
  mp_device_t *dev = m->pool->dev;
  if (!staged)
    return mp_memcpy_async(dev, (void *)dst, (const void *)src, c, m->s);
  mp_status_t st =
      mp_memcpy_async(dev, (void *)m->stage, (const void *)src, c, m->s);
  if (st == MP_OK)
    st = mp_memcpy_async(dev, (void *)dst, (const void *)m->stage, c, m->s);
  return st;
}

/* Whether a slide by gap goes through the staging buffer, and its chunk. */
static size_t mp__slide_chunk(const mp__mover_t *m, size_t gap, bool *staged) {
  *staged = m->stage != 0 && gap < m->stage_size;
  return *staged ? m->stage_size : gap;
}

/* Moves n bytes from src up to dst > src, high to low: the undo of a
 * slide refused part-way, correct when the ranges overlap (a chunk's
 * destination covers only source bytes already copied). */
static mp_status_t mp__copy_up(mp__mover_t *m, uintptr_t dst, uintptr_t src,
                               size_t n) {
  bool staged;
  size_t chunk = mp__slide_chunk(m, dst - src, &staged);
  for (size_t end = n; end > 0;) {
    size_t c = end < chunk ? end : chunk;
    end -= c;
    mp_status_t st = mp__copy_chunk(m, dst + end, src + end, c, staged);
    if (st != MP_OK)
      return st;
  }
  return MP_OK;
}

/* Moves n bytes from src down to dst < src on the mover's stream, correct
 * when the ranges overlap. Refused part-way, the bytes it overwrote at src
 * are copied back first, so that the block still holds its data where it
 * was (*queued: copies were queued, which still use both ranges). */
static mp_status_t mp__copy_down(mp__mover_t *m, uintptr_t dst, uintptr_t src,
                                 size_t n, bool *queued) {
  size_t gap = src - dst;
  *queued = false;
  if (gap >= n)
    return mp_memcpy_async(m->pool->dev, (void *)dst, (const void *)src, n,
                           m->s);
  bool staged;
  size_t chunk = mp__slide_chunk(m, gap, &staged);
  for (size_t off = 0; off < n; off += chunk) {
    size_t c = n - off < chunk ? n - off : chunk;
    mp_status_t st = mp__copy_chunk(m, dst + off, src + off, c, staged);
    if (st == MP_OK)
      continue;
    *queued = off > 0;
    /* Copied so far: [0, off) to dst, over the source's first off - gap
     * bytes: those go back. */
    char why[MP__ERROR_MAX];
    snprintf(why, sizeof why, "%s", mp_last_error());
    if (off > gap && mp__copy_up(m, src, dst, off - gap) != MP_OK)
      return mp__fail(st,
                      "%s; and undoing the slide failed: the block at %p "
                      "lost its first %zu bytes",
                      why, (void *)src, off - gap);
    return mp__fail(st, "%s", why);
  }
  return MP_OK;
}

/* ---- metadata of one move --------------------------------------------- */

/* The space a moved block left is read by copies on the mover's stream:
 * other streams may reuse it only once that stream's epoch is done. */
static void mp__vacated(mp__mover_t *m, mp__block_t *f) {
  mp_pool_t *pool = m->pool;
  mp__block_t dep;
  memset(&dep, 0, sizeof dep);
  dep.ndeps = 1;
  dep.deps[0] = mp__dep(m->sidx, pool->streams[m->sidx].epoch);
  pool->streams[m->sidx].dirty = true;
  f->flags |= MP__B_FREE;
  mp__deps_merge(pool, f, &dep);
  f = mp__block_coalesce(pool, f);
  mp__index_insert(pool, f);
}

/* Exchanges the places of live b and free f (out of the index; the same
 * size as b, or b's lower neighbour) in their segments' address lists and
 * gives b the address new_addr; f then covers b's old bytes. The live map
 * never grows here: b leaves it and comes back. */
static void mp__swap_places(mp__mover_t *m, mp__block_t *b, mp__block_t *f,
                            uintptr_t new_addr) {
  mp_pool_t *pool = m->pool;
  /* In the history as PyTorch sees a copy: the old block freed, a new one
   * allocated at new_addr. Without it, a snapshot's trace kept the block
   * live at its old address forever and freed the new one twice, and a
   * replay of it peaked above the pool. */
  if (MP__UNLIKELY(pool->hist.ev != NULL)) {
    uintptr_t hs = MP__HIST_STREAM(pool, b->sidx);
    mp__history_free(pool, b->addr, b->requested, b->size, hs, false);
    mp__history_record(pool, MP__H_ALLOC, new_addr, b->requested, hs);
  }
  mp__map_remove(pool, b);
  mp__segment_t *bs = b->seg, *fs = f->seg;
  uintptr_t free_addr;
  if (f->next == b) {
    free_addr = new_addr + b->size;
    mp__block_unlink(fs, f);
    mp__block_link(bs, b, f);
  } else {
    free_addr = b->addr;
    mp__block_t *fprev = f->prev, *bprev = b->prev;
    mp__block_unlink(fs, f);
    mp__block_unlink(bs, b);
    mp__block_link(fs, fprev, b);
    mp__block_link(bs, bprev, f);
  }
  b->addr = new_addr;
  f->addr = free_addr;
  mp__map_insert(pool, b);
  /* The moved block was written on the mover's stream: after its free no
   * other stream may reuse it before the copy. */
  mp__stream_add_copy_use(m->pool, b, m->sidx);
  mp__vacated(m, f);
  m->moved += b->size;
}

/* A slide refused part-way, its bytes put back: the copies queued on the
 * mover's stream still write f and read and write b, so f waits for that
 * stream as vacated space does, and b counts it as a use. */
static void mp__slide_refused(mp__mover_t *m, mp__block_t *b, mp__block_t *f) {
  mp__index_remove(m->pool, f);
  mp__stream_add_copy_use(m->pool, b, m->sidx);
  mp__vacated(m, f);
}

/* Cuts free block f, which straddles its segment's fence, at the fence:
 * the part below stays free in the index; the part above, returned (also
 * in the index), is what a slide or an evacuated block may fill. NULL (f
 * whole) without a record for the cut. */
static mp__block_t *mp__cut_at_fence(mp_pool_t *pool, mp__block_t *f) {
  mp__index_remove(pool, f);
  mp__block_t *above = mp__block_split(pool, f, f->seg->fence - f->addr);
  mp__index_insert(pool, f);
  return above;
}

/* ---- new homes ---------------------------------------------------------- */

static bool mp__avoided(const mp__block_t *f, mp__segment_t *const *avoid,
                        size_t navoid) {
  for (size_t i = 0; i < navoid; i++)
    if (f->seg == avoid[i])
      return true;
  return false;
}

/* Free f, out of the index, back into it merged with its neighbours. */
static void mp__rejoin(mp_pool_t *pool, mp__block_t *f) {
  f = mp__block_coalesce(pool, f);
  mp__index_insert(pool, f);
}

static void mp__untake_home(mp_pool_t *pool, mp__block_t *f) {
  pool->st.free_blocks++;
  mp__rejoin(pool, f);
}

/* Takes a free block of exactly `size` bytes out of the index, outside the
 * segments of avoid[], that the mover's stream may write now; NULL if none.
 * The search follows the index's best-fit order and is bounded, so it
 * never scans the pool. A free block straddling its segment's fence
 * serves from its part above the fence, cut off first. */
static mp__block_t *mp__take_home(mp__mover_t *m, size_t size,
                                  mp__segment_t *const *avoid, size_t navoid) {
  mp_pool_t *pool = m->pool;
  mp__block_t *f = mp__index_best_fit(pool, size);
  for (unsigned k = 0; f != NULL; k++, f = mp__index_next(pool, f)) {
    if (k == 64)
      return NULL;
    if (!mp__avoided(f, avoid, navoid) &&
        (mp__above_fence_free(f) || mp__straddle(f) >= size) &&
        mp__deps_safe(pool, f, m->sidx, false))
      break;
  }
  if (f == NULL ||
      (!mp__above_fence_free(f) && (f = mp__cut_at_fence(pool, f)) == NULL))
    return NULL;
  mp__index_remove(pool, f);
  pool->st.free_blocks--;
  mp__block_split(pool, f, size);
  if (f->size != size) { /* no record for the rest: cannot cut it */
    mp__untake_home(pool, f);
    return NULL;
  }
  return f;
}

/* Copies b into a home taken for it in another segment and swaps their
 * places. */
static mp_status_t mp__move_home(mp__mover_t *m, mp__block_t *b,
                                 mp__block_t *home) {
  mp_status_t st = mp_memcpy_async(m->pool->dev, (void *)home->addr,
                                   (const void *)b->addr, b->size, m->s);
  if (st != MP_OK) {
    mp__untake_home(m->pool, home);
    return st;
  }
  m->pool->st.free_blocks++; /* the home comes back as b's old place */
  mp__swap_places(m, b, home, home->addr);
  return MP_OK;
}

/* ---- compaction inside a segment --------------------------------------- */

static bool mp__need_met(const mp__mover_t *m) {
  return m->need != 0 && mp__stats_largest_free(m->pool) >= m->need;
}

/* Slides every movable block above the fence onto the free block below
 * it, so no free space is left between them. (Filling holes low down with
 * blocks from the top first was tried: on bench_defrag_kv it moved as many
 * bytes or more, since the slide still has to close what the fills leave.)
 */
static mp_status_t mp__compact_segment(mp__mover_t *m, mp__segment_t *seg) {
  for (mp__block_t *b = mp__above_fence(seg); b != NULL; b = b->next) {
    mp__block_t *f = b->prev;
    if (!mp__is_mover(b) || f == NULL || !(f->flags & MP__B_FREE) ||
        (!mp__above_fence_free(f) && mp__straddle(f) == 0) ||
        !mp__deps_safe(m->pool, f, m->sidx, false))
      continue;
    bool cut = !mp__above_fence_free(f);
    if (cut && (f = mp__cut_at_fence(m->pool, f)) == NULL)
      continue;
    uintptr_t dst = f->addr;
    bool queued;
    mp_status_t st = mp__copy_down(m, dst, b->addr, b->size, &queued);
    if (st != MP_OK) {
      if (queued) {
        mp__slide_refused(m, b, f);
      } else if (cut) { /* nothing copied: the halves join again */
        mp__index_remove(m->pool, f);
        mp__rejoin(m->pool, f);
      }
      return st;
    }
    mp__index_remove(m->pool, f);
    mp__swap_places(m, b, f, dst);
  }
  return MP_OK;
}

/* ---- evacuation of plain segments -------------------------------------- */

/* Bytes of live blocks in seg, or 0 when seg is not a plain segment made
 * only of blocks that may move (nothing to evacuate). A live block below
 * the fence stays where it is (pool.h, mp_pool_freeze: defragmentation
 * works only above the fence), so its segment is not evacuated. */
static size_t mp__evacuable(const mp__segment_t *seg) {
  if (seg->kind != MP__SEG_PLAIN)
    return 0;
  size_t live = 0;
  for (const mp__block_t *b = seg->first; b != NULL; b = b->next) {
    if (b->flags & MP__B_FREE)
      continue;
    if (!mp__is_mover(b) || b->addr < seg->fence)
      return 0;
    live += b->size;
  }
  return live;
}

/* Moves every block of seg into free space of other segments (not those
 * in done[]), or none when they do not all fit. */
static mp_status_t mp__evacuate(mp__mover_t *m, mp__segment_t *seg,
                                mp__segment_t **done, size_t ndone) {
  mp_pool_t *pool = m->pool;
  size_t n = 0;
  for (mp__block_t *b = seg->first; b != NULL; b = b->next)
    n += !(b->flags & MP__B_FREE);
  /* The live blocks first: coalescing around a vacated place frees the
   * records of free neighbours, never those of live blocks. */
  done[ndone] = seg; /* tried, whatever comes of it (the caller counts it) */
  mp__block_t **live = mp__host_alloc(2 * n * sizeof *live);
  if (live == NULL)
    return MP_OK; /* no host memory: simply do not evacuate */
  mp__block_t **home = live + n;
  size_t k = 0;
  for (mp__block_t *b = seg->first; b != NULL; b = b->next)
    if (!(b->flags & MP__B_FREE))
      live[k++] = b;
  for (k = 0; k < n; k++)
    if ((home[k] = mp__take_home(m, live[k]->size, done, ndone + 1)) == NULL)
      break;
  mp_status_t st = MP_OK;
  size_t i = 0;
  if (k == n)
    for (; i < n && st == MP_OK; i++)
      st = mp__move_home(m, live[i], home[i]);
  while (k > i)
    mp__untake_home(pool, home[--k]);
  free(live);
  return st;
}

/* Evacuates plain segments, least live bytes first, each at most once. */
static mp_status_t mp__evacuate_all(mp__mover_t *m) {
  size_t nseg = 0;
  for (mp__segment_t *s = m->pool->segs; s != NULL; s = s->next)
    nseg++;
  if (nseg < 2)
    return MP_OK;
  mp__segment_t **done = mp__host_alloc(nseg * sizeof *done);
  if (done == NULL)
    return MP_OK;
  size_t ndone = 0;
  mp_status_t st = MP_OK;
  while (st == MP_OK && !mp__need_met(m)) {
    mp__segment_t *best = NULL;
    size_t best_live = SIZE_MAX;
    for (mp__segment_t *s = m->pool->segs; s != NULL; s = s->next) {
      bool seen = false;
      for (size_t i = 0; i < ndone; i++)
        seen |= done[i] == s;
      size_t live = seen ? 0 : mp__evacuable(s);
      if (live > 0 && live < best_live) {
        best = s;
        best_live = live;
      }
    }
    if (best == NULL)
      break;
    st = mp__evacuate(m, best, done, ndone);
    ndone++;
  }
  free(done);
  return st;
}

/* ---- one defragmentation ----------------------------------------------- */

/* Looks, without changing anything, whether some block would move and how
 * big a staging buffer the slides want (0: none). */
static bool mp__plan(mp_pool_t *pool, size_t *stage_bytes) {
  bool any = false;
  size_t stage = 0;
  for (mp__segment_t *seg = pool->segs; seg != NULL; seg = seg->next) {
    const mp__block_t *below = mp__below_fence(seg);
    size_t gap = below != NULL ? mp__straddle(below) : 0;
    for (mp__block_t *b = mp__above_fence(seg); b != NULL; b = b->next) {
      if (b->flags & MP__B_FREE) {
        gap += b->size;
      } else if (!mp__is_mover(b)) {
        gap = 0;
      } else if (gap > 0) {
        any = true;
        if (b->size / MP__STAGE_RATIO > gap && b->size > stage)
          stage = b->size;
      }
    }
    any |= mp__evacuable(seg) > 0 && pool->segs->next != NULL;
  }
  if (stage > MP__STAGE_MAX)
    stage = MP__STAGE_MAX;
  /* The buffer counts against the pool's cap while it lives (booked in
   * pool->staged): none where the cap leaves no room for it (the
   * out-of-memory rung), nor in a child or graph pool, whose memory is its
   * parent's (a child's cap is its range): gap-sized chunks then. */
  if (pool->parent != NULL || stage > mp__pool_room(pool) ||
      pool->stage_slots == MP__STAGE_SLOTS)
    stage = 0;
  *stage_bytes = stage;
  return any;
}

/* Under the lock: staging buffer p (n bytes) after its free, st: given
 * back (its room under the cap the pool's again), or kept for the next try
 * (its slot was taken when it was allocated). */
static void mp__stage_freed(mp_pool_t *pool, void *p, size_t n,
                            mp_status_t st) {
  if (st != MP_OK) {
    pool->stage_kept[pool->nstage_kept] = p;
    pool->stage_kept_bytes[pool->nstage_kept++] = n;
    return;
  }
  pool->staged -= n;
  pool->stage_slots--;
  pool->st.device_free_count++;
}

/* Under the lock, once a defragmentation on s has blocks to move: the
 * index of s in the pool's stream table, where the copies go (sidx NULL:
 * only the check, s not learnt). A stream
 * being captured into a graph is refused, the pool's own captures
 * (mp_pool_graph_begin) and the application's alike, before it is learnt:
 * copies queued there would go into the graph, not run (cuda.h,
 * cuStreamBeginCapture_v2); the device's answer is a query allowed during
 * a capture (backend.h, stream_capturing), not a wait. */
static mp_status_t mp__defrag_stream(mp_pool_t *pool, mp_stream_t s,
                                     const char *fn, uint32_t *sidx) {
  int cap = mp__stream_captured(pool, s)
                ? 1
                : mp__device_stream_capturing(pool->dev, s);
  if (cap == 0)
    return sidx != NULL ? mp__stream_index(pool, s, sidx) : MP_OK;
  /* -2: the driver's own failure, not a capture. */
  return cap == -2 ? mp__fail(MP_EDRIVER, "%s: %s", fn, mp_last_error())
                   : mp__fail(MP_EBUSY,
                              "%s: stream %p is being captured into a graph "
                              "(or is the legacy stream while a blocking "
                              "stream captures): its copies would go into "
                              "the graph; use another stream, or call it "
                              "after the capture ends",
                              fn, (void *)s);
}

/* Defragments pool on s; with freeze, then fences every live block. Takes
 * and releases the lock. need: see mp__mover_t. checked: the caller found
 * s a live stream already (mp__defrag_checked), so it is not asked again. */
static mp_status_t mp__defragment(mp_pool_t *pool, mp_stream_t s, size_t need,
                                  bool freeze, bool checked, size_t *moved) {
  mp__mover_t m = {.pool = pool, .s = s, .need = need};
  void *stage = NULL;
  /* A call that succeeds leaves the caller's last error as it was
   * (status.h): the failures it goes on without (a kept buffer's retry
   * refused again, no device room for the staging buffer: gap-sized
   * chunks then) are not its answer. */
  mp__error_kept_t was;
  mp__error_keep(&was);
  (void)mp__defrag_stage_retry(pool); /* a buffer a refused free kept */
  mp__pool_lock(pool);
  mp__pool_wait_idle(pool);
  const char *fn = freeze ? "mp_pool_freeze" : "mp_pool_defragment";
  mp_status_t st = mp__pool_paused(pool, fn);
  size_t stage_bytes = 0;
  /* The stream is checked, not learnt: it joins the pool's table
   * (mp__stream_index) only where copies go on it (mp__defrag_stream).
   * Every later synchronization of the pool waits for a stream there, and
   * refuses while it is captured: a call that moved nothing, or was
   * refused, left trim and the out-of-memory ladder refused until the end
   * of a capture the pool was never told of. A stream the table holds
   * is one the device said was live when it was learnt (mp__stream_add),
   * and is forgotten when it is destroyed: not asked again (the check is
   * up to three driver calls, cuStreamIsCapturing, cuStreamGetFlags and
   * cuStreamGetCtx, on every call that named a stream the pool uses). */
  if (st == MP_OK && !checked && !mp__stream_known(pool, s))
    st = mp__stream_check(pool->dev, s);
  bool any = st == MP_OK && mp__plan(pool, &stage_bytes);
  /* Checked before the wait, learnt only after it (below): a wait that is
   * refused (another stream of the pool captured) or fails leaves s out
   * of the table, which every later synchronization would wait for. */
  if (any && (st = mp__defrag_stream(pool, s, fn, NULL)) != MP_OK)
    any = false;
  bool learnt = false; /* copies may be queued on s */
  if (any) {
    /* Booked before the synchronization drops the lock, so that growth
     * meanwhile, or while the copies still read the buffer, leaves room
     * for it under the cap; given back once it is freed (or not had). */
    pool->staged += stage_bytes;
    pool->stage_slots += stage_bytes > 0;
    st = mp__pool_sync_alloc(pool, stage_bytes, &stage);
    if (stage == NULL) {
      pool->staged -= stage_bytes;
      pool->stage_slots -= stage_bytes > 0;
      stage_bytes = 0;
    } else {
      pool->st.device_alloc_count++; /* stats.h: calls into the driver */
    }
    /* The synchronization drops the lock: a pause may have run. */
    if (st == MP_OK)
      st = mp__pool_paused(pool, fn);
    /* Asked again under the lock the copies are queued with: a capture of
     * s may have begun during the wait. */
    if (st == MP_OK)
      learnt = (st = mp__defrag_stream(pool, s, fn, &m.sidx)) == MP_OK;
    m.stage = (uintptr_t)stage;
    m.stage_size = stage_bytes;
    for (mp__segment_t *seg = pool->segs; st == MP_OK && seg != NULL;
         seg = seg->next) {
      if (mp__need_met(&m))
        break;
      st = mp__compact_segment(&m, seg);
    }
    if (st == MP_OK)
      st = mp__evacuate_all(&m);
  }
  /* Not the block the out-of-memory ladder holds while it waits for the
   * streams (the lock dropped, a freeze may run): the ladder may give it
   * back, and a fence above it would keep free memory that was never live
   * from defragmentation for good. */
  if (st == MP_OK && freeze)
    for (mp__segment_t *seg = pool->segs; seg != NULL; seg = seg->next)
      for (mp__block_t *b = seg->first; b != NULL; b = b->next)
        if (mp__block_owned(b)) {
          b->flags |= MP__B_FROZEN;
          if (b->addr + b->size > seg->fence)
            seg->fence = b->addr + b->size;
        }
  /* The OOM rung counts the runs that planned a move; a call of the API
   * counts itself once, on the pool it names (mp__defrag_counted). */
  if (st == MP_OK && any && need > 0)
    pool->st.defrag_count++;
  /* Also what moved before a failure: those blocks are in their new
   * places, and the caller is told so (*moved). */
  pool->st.moved_bytes += m.moved;
  mp__pool_unlock(pool);
  if (stage != NULL) {
    /* The queued copies read it: wait for them before giving it back.
     * Given back even when that wait fails: mp_device_free synchronizes
     * the device first (device.h, as cuMemFree), and a buffer kept would
     * be held by nobody. A refused free keeps it, booked against the cap,
     * for the next try (mp__defrag_stage_retry). */
    mp_status_t sst = learnt ? mp_stream_synchronize(pool->dev, s) : MP_OK;
    mp_status_t fst = mp__device_free(pool->dev, stage);
    if (st == MP_OK)
      st = sst != MP_OK ? sst : fst;
    mp__pool_lock(pool);
    mp__stage_freed(pool, stage, stage_bytes, fst);
    mp__pool_unlock(pool);
  }
  *moved = m.moved;
  if (st == MP_OK)
    mp__error_give_back(&was);
  return st;
}

mp_status_t mp__defrag_stage_retry(mp_pool_t *pool) {
  MP__ASSERT(!mp__pool_held(pool));
  mp_status_t st = MP_OK;
  mp__pool_lock(pool);
  /* Not while a stream of the pool is captured (a graph pool's): no
   * device free then, as PyTorch's allocator frees nothing during a
   * capture; a later call tries. */
  while (st == MP_OK && pool->nstage_kept > 0 && pool->ncapturing == 0) {
    unsigned i = --pool->nstage_kept;
    void *p = pool->stage_kept[i];
    size_t n = pool->stage_kept_bytes[i];
    mp__pool_unlock(pool);
    st = mp__device_free(pool->dev, p);
    mp__pool_lock(pool);
    mp__stage_freed(pool, p, n, st);
  }
  mp__pool_unlock(pool);
  return st;
}

void mp__defrag_stage_retry_quiet(mp_pool_t *pool) {
  mp__error_kept_t was;
  mp__error_keep(&was);
  (void)mp__defrag_stage_retry(pool);
  mp__error_give_back(&was);
}

/* ---- public API -------------------------------------------------------- */

/* A call that defragmented pool (freeze too) counts one run, with or
 * without arenas (each arena's part is not a run of its own). */
static mp_status_t mp__defrag_counted(mp_pool_t *pool, mp_status_t st) {
  if (st == MP_OK) {
    mp__pool_lock(pool);
    pool->st.defrag_count++;
    mp__pool_unlock(pool);
  }
  return st;
}

/* Whether pool, or one of the arenas it made, holds s in its
 * stream table: a stream the device said was live (mp__defragment), so
 * that the arenas' defragmentations need not ask the device about it.
 * Each lock in turn, none held across another. */
static bool mp__defrag_known(mp_pool_t *pool, mp_stream_t s) {
  mp__pool_lock(pool);
  bool known = mp__stream_known(pool, s);
  mp__pool_unlock(pool);
  for (size_t i = 0; !known && pool->arenas != NULL && i < pool->cfg.arenas;
       i++) {
    mp_pool_t *a = mp__arena_at(pool, i);
    if (a == NULL)
      continue;
    mp__pool_lock(a);
    known = mp__stream_known(a, s);
    mp__pool_unlock(a);
  }
  return known;
}

mp_status_t mp_pool_defragment(mp_pool_t *pool, mp_stream_t s,
                               size_t *moved_bytes) {
  if (pool == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_defragment: pool is NULL");
  size_t moved = 0;
  /* From a host function (its copies are device calls, and no wait can be
   * made there, nor in a graph pool's own growth: pool_internal.h,
   * mp__pool_may_wait), refused before
   * anything changes. */
  mp_status_t st = mp__pool_may_wait(pool, "mp_pool_defragment");
  if (st != MP_OK)
    return st;
  /* A move's events start their stacks at this call's caller. */
  MP__HIST_ENTRY(pool);
  /* Paused (MP_EBUSY) or no live stream (MP_EINVAL): refused before
   * anything changes, also before mp__defragment's retry of a staging
   * buffer a refused free kept, which frees it (a pool without arenas made
   * that retry first). With arenas, the stream is checked here even when
   * no arena is made, where none would. */
  st = mp__pool_paused_now(pool, "mp_pool_defragment");
  if (st == MP_OK && !mp__defrag_known(pool, s))
    st = mp__stream_check(pool->dev, s);
  if (st == MP_OK && pool->arenas == NULL)
    st = mp__defragment(pool, s, 0, false, true, &moved);
  /* Each arena made in turn, as a pool of its own (its movable blocks move
   * inside its segments). The pool's lock is not held across an arena's,
   * which waits for work. */
  for (size_t i = 0;
       st == MP_OK && pool->arenas != NULL && i < pool->cfg.arenas; i++) {
    mp_pool_t *a = mp__arena_at(pool, i);
    size_t m = 0;
    if (a != NULL)
      st = mp__defragment(a, s, 0, false, true, &m);
    moved += m;
  }
  if (moved_bytes != NULL)
    *moved_bytes = moved;
  return mp__defrag_counted(pool, st);
}

/* A pool with arenas (arena.c): each arena made freezes what it holds
 * live, as a pool of its own (its movable blocks move first, then every
 * block live is fenced). Paused: MP_EBUSY with nothing done. An arena
 * failing leaves those before it frozen; a freeze again fences them
 * again. The pool's lock is not held across an arena's freeze, which
 * waits for its copies. */
static mp_status_t mp__pool_freeze(mp_pool_t *pool);

static mp_status_t mp__arenas_freeze(mp_pool_t *pool) {
  mp_status_t st = mp__pool_paused_now(pool, "mp_pool_freeze");
  for (size_t i = 0; st == MP_OK && i < pool->cfg.arenas; i++)
    if (mp__arena_at(pool, i) != NULL)
      st = mp__pool_freeze(mp__arena_at(pool, i));
  return st;
}

mp_status_t mp_pool_freeze(mp_pool_t *pool) {
  if (pool == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_freeze: pool is NULL");
  /* Refused where mp_pool_defragment is (mp__pool_may_wait). */
  mp_status_t st = mp__pool_may_wait(pool, "mp_pool_freeze");
  if (st != MP_OK)
    return st;
  MP__HIST_ENTRY(pool); /* a move's events, as mp_pool_defragment's */
  return mp__defrag_counted(pool, pool->arenas != NULL ? mp__arenas_freeze(pool)
                                                       : mp__pool_freeze(pool));
}

/* The copies queued on stream s are done (waited for): the blocks they
 * moved name s as a use no more, so that its slot in the stream table goes
 * once s is destroyed. (Each block a freeze moved kept its destroyed
 * stream's slot for as long as it lived.) */
static void mp__moves_done(mp_pool_t *pool, mp_stream_t s) {
  mp__pool_lock(pool);
  uint32_t sidx;
  if (mp__stream_known(pool, s) && mp__stream_lookup(pool, s, &sidx) == MP_OK)
    for (mp__segment_t *seg = pool->segs; seg != NULL; seg = seg->next)
      for (mp__block_t *b = seg->first; b != NULL; b = b->next)
        if (mp__block_owned(b))
          mp__stream_use_done(pool, b, sidx);
  mp__pool_unlock(pool);
}

/* mp_pool_freeze of a pool without arenas (one of them, maybe), its
 * caller marked. */
static mp_status_t mp__pool_freeze(mp_pool_t *pool) {
  /* The copies go on a stream of freeze's own, waited for and destroyed
   * (which makes the pool forget it): the legacy stream would order them
   * with the application's blocking streams, and waiting on it is a call
   * CUDA refuses while another thread captures a graph in global mode. */
  mp_stream_t s = NULL;
  mp_status_t st = mp_stream_create(pool->dev, &s);
  if (st != MP_OK)
    return st;
  size_t moved = 0;
  /* Made just now: live, nothing to ask the device (checked). */
  st = mp__defragment(pool, s, 0, true, true, &moved);
  mp_status_t sy = mp_stream_synchronize(pool->dev, s);
  if (sy == MP_OK)
    mp__moves_done(pool, s);
  mp_status_t de = mp_stream_destroy(pool->dev, s);
  return st != MP_OK ? st : sy != MP_OK ? sy : de;
}

size_t mp__defrag_on_oom(mp_pool_t *pool, size_t need, mp_stream_t s) {
  MP__ASSERT(!mp__pool_held(pool)); /* the ladder drops it for this rung */
  size_t moved = 0;
  (void)mp__defragment(pool, s, need, false, false, &moved);
  return moved;
}
