/* pause.c - mp_pool_pause / mp_pool_resume: give a pool's physical memory
 * back to the device while keeping every virtual address, then map it again
 * at the same addresses (RLHF engines take turns on one GPU this way).
 *
 * Only the virtual range can do it (plain segments have no address without
 * their memory): a pool without one, or with live child pools, is refused;
 * a pool on its range gives back the plain segments it took near its cap
 * if they hold only free memory, and is refused if one holds a block in
 * use (mp__pause_plain_check). Pausing keeps every block record as it is and
 * unmaps each mapped chunk (the exact (addr, size) of one vm_map, as CUDA
 * requires); with MP_PAUSE_KEEP_CONTENT the live blocks are first copied, in
 * address order, into one page-locked host buffer, and resume copies them back.
 * While paused, reserved and free bytes read 0 and every call on the pool but
 * resume, stats, dump, snapshot and destroy is MP_EBUSY (mp__pool_paused).
 * The history records each chunk unmapped (segment_unmap) and mapped
 * again (segment_map), those a failed undo left mapped included, the
 * live blocks there freed before and allocated again after (as memory_viz
 * needs: mp__chunks_history), and a snapshot of a paused pool lists only what
 * it still maps (snapshot.c), as its dump's segment says (dump.c): what
 * reserved_bytes counts.
 *
 * A pause first unmaps the mappings a refused peer access left (strays,
 * vrange.c), and is refused, nothing changed, if the device keeps one.
 *
 * Failure halfway leaves nothing lost: a pause that cannot unmap maps back
 * what it had unmapped (and copies the content back; without
 * MP_PAUSE_KEEP_CONTENT there is no copy, and what was mapped back reads
 * as fresh memory, the content the caller gave up), a resume that cannot
 * map unmaps what it had mapped and stays paused with the host copy kept.
 * Should such an undo fail too, the pool stays paused knowing which chunks
 * are still mapped (pause_mapped: chunks are mapped upwards and unmapped
 * downwards, so those mapped are always the first ones), and the next
 * resume maps the others; destroy unmaps exactly those mapped.
 * Device calls run with the lock dropped and the pool marked in flight. */
#include <stdlib.h>
#include <string.h>

#include "pool_internal.h"

/* The live blocks, in address order: what the copies move. */
typedef struct mp__spans {
  mp__chunk_t *v; /* (addr, size) of each */
  size_t n;
  size_t bytes; /* their sum: the host copy's size */
} mp__spans_t;

/* Lists the blocks whose content a pause keeps, the program's
 * (mp__block_owned). The ladder's block is left out: the ladder may give
 * it back while the pool is paused, and a resume listing it no more would
 * copy every block above it from the wrong place in the host copy; left
 * out at both ends, the pause and the resume list the same blocks. Under
 * the lock: the copies run with it dropped, and a thread whose allocation
 * dropped the lock before the pause may then take free blocks and put them
 * back (alloc.c), so the block lists are not walked meanwhile. MP_ENOMEM
 * without host memory. */
static mp_status_t mp__live_spans(const mp_pool_t *pool, mp__spans_t *out) {
  size_t n = 0;
  for (const mp__segment_t *g = pool->segs; g != NULL; g = g->next)
    for (const mp__block_t *b = g->first; b != NULL; b = b->next)
      n += mp__block_owned(b);
  out->n = 0;
  out->bytes = 0;
  out->v = mp__host_alloc((n ? n : 1) * sizeof *out->v);
  if (out->v == NULL)
    return mp__fail(MP_ENOMEM, "out of host memory listing the live blocks "
                               "to copy");
  for (const mp__segment_t *g = pool->segs; g != NULL; g = g->next)
    for (const mp__block_t *b = g->first; b != NULL; b = b->next)
      if (mp__block_owned(b)) {
        out->v[out->n++] = (mp__chunk_t){.addr = b->addr, .size = b->size};
        out->bytes += b->size;
      }
  return MP_OK;
}

/* Copies every live block of sp between the device and the host buffer
 * (to_host: device to host), in order, then waits for the copies. They run
 * on a stream of their own: a wait on the legacy stream is a call CUDA
 * refuses while another thread captures a graph in global mode. Lock
 * dropped (the caller marked the pool in flight). */
static mp_status_t mp__copy_live(mp_pool_t *pool, const mp__spans_t *sp,
                                 bool to_host) {
  uintptr_t off = (uintptr_t)pool->pause_copy;
  mp_stream_t s = NULL;
  mp_status_t st = mp_stream_create(pool->dev, &s);
  if (st != MP_OK)
    return st;
  for (size_t i = 0; i < sp->n && st == MP_OK; i++) {
    void *dev_at = (void *)sp->v[i].addr, *host_at = (void *)off;
    st = to_host
             ? mp_memcpy_async(pool->dev, host_at, dev_at, sp->v[i].size, s)
             : mp_memcpy_async(pool->dev, dev_at, host_at, sp->v[i].size, s);
    off += sp->v[i].size;
  }
  mp_status_t sy = mp_stream_synchronize(pool->dev, s);
  mp_status_t de = mp_stream_destroy(pool->dev, s);
  return st != MP_OK ? st : sy != MP_OK ? sy : de;
}

/* Moves the boundary *m between v's mapped chunks [0, *m) and its
 * unmapped ones to target, one chunk at a time: mapping upwards, unmapping
 * downwards. MP_OK, or the failing call's status with *m where it stopped.
 * Lock dropped. */
static mp_status_t mp__chunks_step(mp_pool_t *pool, mp__segment_t *v, size_t *m,
                                   size_t target) {
  while (*m != target) {
    bool map = *m < target;
    mp__chunk_t c = v->chunks[map ? *m : *m - 1];
    /* A map with no host memory for a stray's record (MP__EHOST, internal:
     * growth tells it from the device's) is a public call's MP_ENOMEM. */
    mp_status_t st =
        map ? mp__status_out(mp__pool_vm_map(pool, (void *)c.addr, c.size))
            : mp__device_vm_unmap(pool->dev, (void *)c.addr, c.size);
    if (st != MP_OK)
      return st;
    *m = map ? *m + 1 : *m - 1;
  }
  return MP_OK;
}

/* Moves the boundary *m (chunks [0, *m) of v mapped, the rest unmapped) to
 * target; on a failure moves it back where it was, and stops at that
 * undo's first failure too. So *m always says which chunks are mapped,
 * whatever failed (a map or unmap either happened or did not): a pause or
 * resume whose undo fails leaves a pool that knows its state. The first
 * failure's status and message. Lock dropped. */
static mp_status_t mp__chunks_to(mp_pool_t *pool, mp__segment_t *v, size_t *m,
                                 size_t target) {
  size_t from = *m;
  mp_status_t st = mp__chunks_step(pool, v, m, target);
  if (st != MP_OK) {
    char why[MP__ERROR_MAX];
    snprintf(why, sizeof why, "%s", mp_last_error());
    (void)mp__chunks_step(pool, v, m, from);
    mp__fail(st, "%s", why);
  }
  return st;
}

/* Under the lock, paused: chunks [0, m) of the pool's virtual segment stay
 * mapped (m > 0 after an undo that failed). The stats say so: reserved is
 * their bytes and the strays' (device memory held, stats.h; a resume's map
 * refused to a peer may leave one) and segment_count their number
 * (the chunks held now: a pool with plain segments is never paused, but
 * for an arena's until every arena is: mp__arenas_plain_release), free
 * stays 0 (a paused pool serves nothing). */
static void mp__pause_mapped_set(mp_pool_t *pool, size_t m) {
  size_t held = 0;
  for (size_t i = 0; i < m; i++)
    held += pool->vseg->chunks[i].size;
  pool->pause_mapped = m;
  pool->st.reserved_bytes = held + pool->stray_bytes;
  pool->st.segment_count = m;
}

/* The pool's plain segments: none in a paused pool but an arena's while
 * the other arenas pause, or those a refused pause of its pool with arenas
 * could not give back (mp__arenas_plain_release). */
static size_t mp__plain_count(const mp_pool_t *pool) {
  size_t n = 0;
  for (const mp__segment_t *g = pool->segs; g != NULL; g = g->next)
    n += g->kind != MP__SEG_VIRTUAL;
  return n;
}

/* For mp__chunks_history: a free (freed: free_requested and
 * free_completed) or a restored alloc of each live block of v (neither
 * free nor a hole) whose address lies in [lo, hi), all at one time and
 * stack (at). */
static void mp__blocks_history(mp_pool_t *pool, const mp__segment_t *v,
                               uintptr_t lo, uintptr_t hi, bool freed,
                               const mp__hstamp_t *at) {
  for (const mp__block_t *b = v->first; b != NULL && b->addr < hi;
       b = b->next) {
    if (b->addr < lo || (b->flags & (MP__B_FREE | MP__B_HOLE)))
      continue;
    uintptr_t hs = MP__HIST_STREAM(pool, b->sidx);
    if (freed) {
      mp__history_put(pool, at, MP__H_FREE_REQUESTED, b->addr, b->requested, hs,
                      false);
      mp__history_put(pool, at, MP__H_FREE_COMPLETED, b->addr, b->requested, hs,
                      false);
    } else {
      mp__history_put(pool, at, MP__H_ALLOC, b->addr, b->requested, hs, true);
    }
  }
}

/* Records what a pause unmapped or a resume mapped (action: segment_unmap
 * or segment_map), chunks [from, to), so that a snapshot's trace leads to
 * its segments; and, around them, the blocks held there: a free of each
 * before an unmap, an alloc of each after a map.
 *
 * Why the blocks: PyTorch's memory_viz ("Allocator State History",
 * MemoryViz.js simulate_memory) replays the trace backwards from the
 * snapshot and, as PyTorch's allocator only unmaps memory no block uses,
 * cuts an undone segment_map out of its segment and then finds the
 * segment of every live block; a block left live over unmapped memory has
 * none, and the page throws. Two truthful ways out were weighed:
 *  - no segment events for a pause (a tenancy event, told some other way
 *    the viewer skips): the trace would keep the memory reserved through
 *    the pause, while stats say 0 reserved and a paused pool's snapshot
 *    lists no segment (what the device holds); a snapshot taken while
 *    paused would then not replay either (the growth's segment_map undone
 *    finds no segment);
 *  - the blocks leave the device with their memory, and come back with
 *    it: a free at the pause and an alloc at the resume, at the same
 *    address and size, as a defragmentation's move is recorded (defrag.c).
 * The second is what the device saw (the content is on the host, or given
 * up without MP_PAUSE_KEEP_CONTENT), agrees with a paused snapshot's empty
 * segments, and replays both ways; the price is two events per live block
 * in the ring. The resume's alloc is marked restored, so that a snapshot
 * still gives the block the frames of its own alloc while the ring holds
 * it (snapshot.c), not the resume's. A block is the snapshot's live one
 * (neither free nor a hole) whose address lies in the chunks: a block that
 * begins below chunk from and runs into it stays live, as a part-mapped pool's
 * snapshot shows it, cut (snapshot.c). */
static void mp__chunks_history(mp_pool_t *pool, const mp__segment_t *v,
                               size_t from, size_t to, int action) {
  if (v == NULL || from >= to || pool->hist.ev == NULL)
    return;
  uintptr_t lo = v->chunks[from].addr,
            hi = v->chunks[to - 1].addr + v->chunks[to - 1].size;
  bool unmap = action == MP__H_SEGMENT_UNMAP;
  /* One clock read and one stack for every event of the call: a backtrace
   * per live block cost about 2.6 us each under the pool's lock. */
  mp__hstamp_t at;
  mp__history_stamp(pool, &at);
  if (unmap)
    mp__blocks_history(pool, v, lo, hi, true, &at);
  /* Each chunk's stream: the request's it was mapped for, as PyTorch's
   * segment_map and segment_unmap entries name the expandable segment's
   * stream (CUDACachingAllocator.cpp, map_block/unmap_block: record_trace(
   * ..., stream)); it said 0. */
  for (size_t i = from; i < to; i++)
    mp__history_put(pool, &at, (unsigned)action, v->chunks[i].addr,
                    v->chunks[i].size, v->chunks[i].made_for, false);
  if (!unmap)
    mp__blocks_history(pool, v, lo, hi, false, &at);
}

/* Under the lock, paused: a resume (or the undo of one) that could not
 * unmap again every chunk it had mapped leaves chunks [0, m) mapped, m
 * above pause_mapped: those it mapped are counted and recorded (the next
 * resume records only the chunks it maps itself, from m on), then m is
 * the pool's. Before, they were neither: the trace had their
 * segment_unmap at the pause and no segment_map, while the pool held
 * them again. */
static void mp__resume_left_mapped(mp_pool_t *pool, size_t m) {
  size_t from = pool->pause_mapped;
  if (m > from) {
    pool->st.device_alloc_count += m - from;
    mp__chunks_history(pool, pool->vseg, from, m, MP__H_SEGMENT_MAP);
  }
  mp__pause_mapped_set(pool, m);
}

/* Plain segments: a pool without a virtual range (virtual=0, or no
 * virtual memory) holds nothing else, and none can be paused. A pool on
 * its range holds them only where growth took one (vrange.c,
 * mp__vrange_grow): near a cap that is no whole number of granules, where
 * whole granules no longer fit but the request does (or where the range
 * ran full). Those holding only free memory go back at the pause
 * (mp__pause_plain_release); a block in use in one (live, or the ladder's)
 * cannot keep its address: MP_ENOTSUP, naming the cause and the ways out.
 * It was "no virtual memory, or virtual=0" for any of them, even free.
 * reaping: the answer the check will give once mp__export_reap has let go
 * the held blocks (no lease of the pool is open any more: the caller
 * refused first while one was, mp__pause_check_held), which count as free
 * here, nothing changed; a refused pause lets none go (status.h). The
 * segments themselves are counted as they stand: a reap that frees one
 * (release_threshold) can only turn a refusal for a pool without its
 * range into none, never the other way. */
static mp_status_t mp__pause_plain_check(const mp_pool_t *pool, bool reaping) {
  size_t n = 0, bytes = 0, segs = 0;
  uint32_t free_now = MP__B_FREE | (reaping ? MP__B_HELD : 0);
  for (const mp__segment_t *g = pool->segs; g != NULL; g = g->next) {
    if (g->kind == MP__SEG_VIRTUAL)
      continue;
    segs++;
    for (const mp__block_t *b = g->first; b != NULL; b = b->next)
      if (!(b->flags & free_now)) {
        n++;
        bytes += b->size;
      }
  }
  /* Without a range, also while empty when none can come (virtual=0, no
   * virtual memory, no address space for one): whatever it grows into
   * next is plain. An empty virtual pool reserves its range lazily. */
  bool rangeless = pool->granule == 0 || pool->vm_failed;
  if ((segs > 0 || rangeless) && pool->vseg == NULL)
    return mp__fail(MP_ENOTSUP,
                    "mp_pool_pause: the pool has no virtual range (no "
                    "virtual memory, or virtual=0): the addresses of its "
                    "plain segments cannot be kept");
  if (n == 0)
    return MP_OK;
  char b[32], g[32];
  return mp__fail(
      MP_ENOTSUP,
      "mp_pool_pause: %zu block%s in use (%s) lie%s in plain segments, which "
      "the pool takes near its cap (max_bytes, max_fraction) where whole "
      "granules (%s) no longer fit: a plain segment's address cannot be "
      "kept. Free %s before pausing (free plain segments go back with the "
      "pause), or give the pool a cap that is a whole number of granules, "
      "or create it with pausable=1",
      n, n == 1 ? "" : "s", mp__fmt_bytes(b, sizeof b, bytes),
      n == 1 ? "s" : "", mp__fmt_bytes(g, sizeof g, pool->granule),
      n == 1 ? "it" : "them");
}

/* Under the lock, marked paused, once the streams' work is done (their
 * free blocks releasable): gives back the plain segments, which
 * mp__pause_plain_check found free, so that the range is all the pool
 * holds (each a segment_free in the history, as trim records it). One
 * left (the device refused the free; or a block of it taken meanwhile by
 * an allocation that had dropped the lock before the pause): the error,
 * those given back staying given back, as a trim's would. A free the
 * device refused once and took at the next try (mp__plain_trim_one tries
 * again while another goes) is no failure of a pause that goes on: the
 * caller's last error stays as it was (status.h), as mp__segment_trim
 * keeps it; it was the device's refusal. */
static mp_status_t mp__pause_plain_release(mp_pool_t *pool) {
  mp__error_kept_t was;
  mp__error_keep(&was);
  mp__block_merge_deferred(pool);
  while (mp__plain_trim_one(pool))
    ;
  bool left = false;
  for (const mp__segment_t *g = pool->segs; g != NULL && !left; g = g->next)
    left = g->kind != MP__SEG_VIRTUAL;
  if (!left)
    mp__error_give_back(&was);
  for (const mp__segment_t *g = pool->segs; g != NULL; g = g->next)
    if (g->kind != MP__SEG_VIRTUAL) {
      mp_status_t st = mp__pause_plain_check(pool, false);
      return st != MP_OK
                 ? st
                 : mp__fail(MP_EBUSY,
                            "mp_pool_pause: the free plain segment at %p "
                            "(%zu bytes) could not be given back (the "
                            "device refused, or a stream uses it again): "
                            "the pool is not paused",
                            (void *)g->base, g->size);
    }
  return MP_OK;
}

/* Pushes host copy p on list, linked through p's first bytes (host memory,
 * page-aligned, larger than a pointer, its content no longer read): the
 * new head. */
static void *mp__pause_stale_push(void *list, void *p) {
  memcpy(p, &list, sizeof list);
  return p;
}

/* Under the lock: frees host copy copy (NULL: none) and, with stale,
 * those whose free the device refused before (pause_stale), the lock
 * dropped meanwhile (the pool in flight). One refused again is kept on
 * pause_stale for the next pause, resume or destroy: dropped, it leaked (it
 * was, at a resume, its pointer cleared whatever the free said). The caller's
 * last error stays as it was (status.h): a refusal is not the answer of a call
 * that succeeds. */
static void mp__pause_copies_free(mp_pool_t *pool, void *copy, bool stale_too) {
  void *stale = stale_too ? pool->pause_stale : NULL, *left = NULL;
  if (copy == NULL && stale == NULL)
    return;
  if (stale_too)
    pool->pause_stale = NULL;
  mp__error_kept_t was;
  mp__error_keep(&was);
  mp__pool_device_begin(pool);
  if (copy != NULL)
    stale = mp__pause_stale_push(stale, copy);
  while (stale != NULL) {
    void *p = stale;
    memcpy(&stale, p, sizeof stale);
    if (mp__device_host_free(pool->dev, p) != MP_OK)
      left = mp__pause_stale_push(left, p);
  }
  mp__pool_device_end(pool);
  mp__error_give_back(&was);
  while (left != NULL) {
    void *p = left;
    memcpy(&left, p, sizeof left);
    pool->pause_stale = mp__pause_stale_push(pool->pause_stale, p);
  }
}

/* What pause may not handle in the pool's own state, which no housekeeping
 * changes (mp__pause_enter): EBUSY/ENOTSUP with a message, or MP_OK. */
static mp_status_t mp__pause_check_state(const mp_pool_t *pool) {
  if (pool->paused)
    return mp__fail(MP_EBUSY, "mp_pool_pause: the pool is paused already");
  /* A graph pool has a parent too, and the parent pauses only once the
   * graph pool is released (MP_EBUSY while it lives). */
  if (pool->parent != NULL && pool->graph)
    return mp__fail(MP_ENOTSUP,
                    "mp_pool_pause: a graph pool's ranges are borrowed from "
                    "its parent: release it (mp_pool_graph_release), then "
                    "pause the parent");
  if (pool->parent != NULL)
    return mp__fail(MP_ENOTSUP, "mp_pool_pause: a child pool's range belongs "
                                "to its parent: pause the parent");
  if (pool->children > 0)
    return mp__fail(MP_EBUSY,
                    "mp_pool_pause: %zu child or graph pool%s live (destroy "
                    "or release %s first)",
                    pool->children, pool->children == 1 ? "" : "s",
                    pool->children == 1 ? "it" : "them");
  if (pool->ncapturing > 0) /* waiting for a capturing stream is refused */
    return mp__fail(MP_EBUSY, "mp_pool_pause: a stream of the pool is being "
                              "captured (graph pool): pause after "
                              "mp_pool_graph_end");
  return mp__streams_unwaitable(pool, "mp_pool_pause");
}

/* What pause may not handle in the blocks the pool holds: exports still
 * imported, blocks in use in plain segments. These answers depend on the
 * leases closed since (mp_ipc_handle_close), whose blocks the pause lets
 * go (mp__export_reap). reaped false: the answer the check will give
 * after that reap, read without it (the leases still open polled, the
 * blocks held for the closed ones counted free), so that a pause refused
 * here lets nothing go (status.h: a refused call changes nothing); it
 * did, as the reap came first. reaped true: the pool as it stands. */
static mp_status_t mp__pause_check_held(const mp_pool_t *pool, bool reaped) {
  size_t open = reaped ? pool->nexports : mp__export_open(pool);
  if (open > 0)
    return mp__fail(MP_EBUSY,
                    "mp_pool_pause: %zu exported block%s still imported by "
                    "another process (or handles not closed): its memory "
                    "would not go back to the device",
                    open, open == 1 ? " is" : "s are");
  return mp__pause_plain_check(pool, !reaped);
}

/* What pause may not handle: EBUSY/ENOTSUP with a message, or MP_OK;
 * reaped as mp__pause_check_held's. */
static mp_status_t mp__pause_check(const mp_pool_t *pool, bool reaped) {
  mp_status_t st = mp__pause_check_state(pool);
  return st != MP_OK ? st : mp__pause_check_held(pool, reaped);
}

/* Takes the lock, waits for what is in flight and checks the pause: MP_OK
 * with the lock held, or the refusal with it dropped. A refusal changes
 * nothing (status.h): the whole check is made first, as it will stand once
 * the leases closed since (mp_ipc_handle_close) have let their blocks go
 * (mp__pause_check_held); only a pause it does not refuse lets them go
 * (a closed lease's block, held in use until then, would refuse the pause;
 * the next allocation lets it go the same way, alloc.c), and is checked
 * again: letting a block go may free a plain segment (release_threshold)
 * with the lock dropped, and a pause refused by what another thread did
 * meanwhile refuses as a pause made a moment later would. */
static mp_status_t mp__pause_enter(mp_pool_t *pool) {
  mp__pool_lock(pool);
  mp__pool_wait_sync(pool);
  mp_status_t st = mp__pause_check(pool, false);
  if (st == MP_OK && pool->nexports > 0) {
    mp__export_reap(pool);
    st = mp__pause_check(pool, true);
  }
  if (st != MP_OK)
    mp__pool_unlock(pool);
  return st;
}

/* Pauses pool, a pool without arenas or one arena (flags checked). No lock
 * held on entry or return. keep_plain: an arena of a pool with arenas, whose
 * free plain segments go back only once every arena is paused
 * (mp__arenas_plain_release). */
static mp_status_t mp__pause_one(mp_pool_t *pool, unsigned flags,
                                 bool keep_plain) {
  mp_status_t st = mp__pause_enter(pool);
  if (st != MP_OK)
    return st;
  /* From here every other call is MP_EBUSY, so nothing changes under us.
   * What it held, for the other arenas' shares of a cap while its lock is
   * dropped (arena.c: a paused arena reads 0 reserved). */
  pool->paused = true;
  pool->paused_reserved = pool->st.reserved_bytes;
  mp__pool_rare_update(pool);
  mp__segment_t *v = pool->vseg;
  bool keep = (flags & MP_PAUSE_KEEP_CONTENT) && pool->st.allocated_bytes > 0;
  mp__spans_t sp = {0};
  if (keep && (st = mp__live_spans(pool, &sp)) != MP_OK) {
    pool->paused = false;
    mp__pool_rare_update(pool);
    mp__pool_unlock(pool);
    return st;
  }
  /* Nothing to keep but a block the ladder holds: no host copy. */
  keep = keep && sp.bytes > 0;
  /* The streams that used the pool must be done with its memory: an event
   * on each, not a device synchronize (another thread may be capturing). */
  mp__sync_set_t set;
  if (!mp__streams_sync_events(pool, &set) && !mp__streams_owe_device(pool)) {
    /* No events (host memory, or the device refused one): the fallback
     * would be a device synchronize, which pool.h promises a pause never
     * makes (it invalidates another thread's capture in global mode).
     * Refused, nothing given back. The events may have taken a destroyed
     * stream's markers: its frees are then owed a device synchronize, as
     * after any failed wait (mp__streams_sync_failed), not taken as done. */
    (void)mp__streams_sync_begin(pool);
    mp__streams_sync_failed(pool);
    free(sp.v);
    pool->paused = false;
    mp__pool_rare_update(pool);
    mp__pool_unlock(pool);
    return mp__fail(MP_ENOMEM,
                    "mp_pool_pause: no event to wait for the pool's streams "
                    "with (out of host memory, or the device gave none), "
                    "and a pause makes no device synchronize: the pool is "
                    "not paused");
  }
  /* After the events: the snapshot clears the dirty marks that tell a
   * destroyed stream needing a device synchronize. Once the wait is done,
   * every epoch before it is (mp__pool_sync's rule): the markers of
   * destroyed streams the set took are gone, and only this marks their
   * frees done. */
  uint64_t snap = mp__streams_sync_begin(pool);
  /* A wait for the streams, under the syncing flag (lock.c): a host
   * function on one of them may call what a paused pool answers (dump,
   * snapshot, check), which waits for a device call in flight; under that
   * flag the pause and the host function waited for each other. */
  mp__pool_sync_begin(pool);
  st = mp__sync_set_wait(pool->dev, &set);
  mp__pool_sync_end(pool);
  mp__sync_set_done(pool, &set, snap, st);
  /* A mapping a refused peer access left (vrange.c) holds device memory
   * no chunk accounts for: unmapped first, or the pause would claim to
   * give back what it still holds; one the device refuses again leaves the
   * pool running, nothing unmapped or given back (so before the plain
   * segments below). */
  if (st == MP_OK && (st = mp__vrange_strays_retry(pool)) != MP_OK) {
    char why[MP__ERROR_MAX];
    snprintf(why, sizeof why, "%s", mp_last_error());
    mp__fail(st, "mp_pool_pause: %s: the pool is not paused", why);
  }
  /* The streams are done with the memory: free plain segments go back. */
  if (st == MP_OK && !keep_plain)
    st = mp__pause_plain_release(pool);
  mp__pool_device_begin(pool);
  if (st == MP_OK && keep) {
    st = mp_device_host_alloc(pool->dev, sp.bytes, &pool->pause_copy);
    if (st == MP_OK && (st = mp__copy_live(pool, &sp, true)) != MP_OK) {
      mp__device_host_free(pool->dev, pool->pause_copy);
      pool->pause_copy = NULL;
    }
    if (st != MP_OK) {
      char why[MP__ERROR_MAX];
      snprintf(why, sizeof why, "%s", mp_last_error());
      mp__fail(st,
               "mp_pool_pause: keeping the content (%zu live bytes) in "
               "page-locked host memory: %s: the pool is not paused",
               sp.bytes, why);
    }
  }
  size_t n = v != NULL ? v->nchunks : 0, m = n;
  bool kept = false; /* the undo could not copy the content back */
  if (st == MP_OK && (st = mp__chunks_to(pool, v, &m, 0)) != MP_OK && m == n &&
      keep) {
    /* The chunks unmapped before the failure are mapped again, empty: the
     * content goes back. A copy that fails too leaves the pool paused with
     * its host copy (every chunk mapped), which a resume copies back:
     * running, the pool had lost the content without a word. */
    char why[MP__ERROR_MAX];
    snprintf(why, sizeof why, "%s", mp_last_error());
    kept = mp__copy_live(pool, &sp, false) != MP_OK;
    if (kept) {
      mp__fail(st,
               "%s; copying the kept content back failed too (%s): the pool "
               "stays paused, every chunk mapped and its content kept, until "
               "mp_pool_resume",
               why, mp_last_error());
    } else {
      mp__fail(st, "%s", why); /* the copy's success left the message */
      mp__device_host_free(pool->dev, pool->pause_copy);
      pool->pause_copy = NULL;
    }
  }
  mp__pool_device_end(pool);
  mp__vrange_strays_count(pool); /* an undo's map may leave one */
  free(sp.v);
  if (st != MP_OK && m == n && !kept) {
    pool->paused = false;
    mp__pool_rare_update(pool);
    mp__pool_unlock(pool);
    return st;
  }
  /* Paused, or (an undo that could not map every chunk back, or copy the
   * content back) left paused with chunks [0, m) mapped: the pool cannot
   * run with a hole under its blocks, and a resume maps back exactly the
   * others (and copies the content back). */
  if (st != MP_OK && !kept)
    mp__fail(st,
             "%s; mapping back what it had unmapped failed too: the pool "
             "stays paused (%zu of %zu chunks unmapped%s) until "
             "mp_pool_resume",
             mp_last_error(), n - m, n, keep ? ", its content kept" : "");
  pool->st.device_free_count += n - m;
  mp__chunks_history(pool, v, m, n, MP__H_SEGMENT_UNMAP);
  pool->paused_reserved = pool->st.reserved_bytes;
  mp__pause_mapped_set(pool, m);
  mp__pool_unlock(pool);
  return st;
}

/* After a pause of pool (or of every arena of it) that went through: what
 * refused frees kept goes, the host copies of earlier resumes
 * (pause_stale) and the defragmentation's staging buffers (defrag.c,
 * mp__defrag_stage_retry, with no lock held), each free's refusal kept
 * for a later try and not the caller's last error. Only then, as status.h
 * has a refused call change nothing: before, mp__pause_one freed them
 * first (the staging buffers before its checks' second round, the copies
 * right after the pool was marked paused), and a pause refused later (no
 * host memory, no events, a stray, a plain segment left, or another
 * arena's refusal) had freed them. */
static void mp__pause_tidy_one(mp_pool_t *pool) {
  mp__pool_lock(pool);
  mp__pause_copies_free(pool, NULL, true);
  bool staged = pool->nstage_kept > 0;
  mp__pool_unlock(pool);
  if (staged)
    mp__defrag_stage_retry_quiet(pool);
}

static void mp__pause_tidy(mp_pool_t *pool) {
  if (pool->arenas == NULL) {
    mp__pause_tidy_one(pool);
    return;
  }
  for (size_t i = 0; i < pool->cfg.arenas; i++)
    if (mp__arena_at(pool, i) != NULL)
      mp__pause_tidy_one(mp__arena_at(pool, i));
}

/* Under the lock, pool paused and nothing in flight: maps its chunks again
 * and copies the kept content back (the lock dropped meanwhile, the pool
 * in flight). On MP_OK it is still marked paused, with its host copy, until
 * mp__resume_finish (or mp__resume_unmap undoes it); on a failure nothing
 * stays mapped. */
static mp_status_t mp__resume_map(mp_pool_t *pool) {
  /* No cap check: resume maps back the chunks the pool held before the
   * pause, not growth. A cap lowered below them before the pause
   * (mp_pool_set_max_fraction: memory above it "stays until trimmed")
   * would otherwise refuse every resume, and trim and free are MP_EBUSY
   * while paused: the pool, and a kept content, could never come back. */
  mp__segment_t *v = pool->vseg;
  mp__spans_t sp = {0};
  mp_status_t st = MP_OK;
  /* These spans add up to the host copy's size (the pause's sp.bytes) by
   * construction, so no size is kept to check them against: the pause
   * lists them in the same locked section that marks the pool paused, and
   * from then on nothing makes a block owned or frees one (mp__block_owned)
   * until the resume: allocations, frees, record_stream, defragment and
   * trim are MP_EBUSY (mp__pool_paused; a torch free is kept for after,
   * torch.c), leases are reaped only while running, borrowing finds no
   * free bytes in a paused arena (mp__free_bytes), a ladder's take that
   * ends in a paused pool is undone under the same lock (alloc.c), and the
   * ladder's own block is left out at both ends (mp__live_spans). */
  if (pool->pause_copy != NULL && (st = mp__live_spans(pool, &sp)) != MP_OK)
    return st;
  mp__pool_device_begin(pool);
  size_t n = v != NULL ? v->nchunks : 0, m = pool->pause_mapped;
  st = mp__chunks_to(pool, v, &m, n);
  if (st == MP_OK && pool->pause_copy != NULL &&
      (st = mp__copy_live(pool, &sp, false)) != MP_OK)
    (void)mp__chunks_to(pool, v, &m, pool->pause_mapped);
  mp__pool_device_end(pool);
  mp__vrange_strays_count(pool); /* a map may leave one, or unmap one */
  free(sp.v);
  if (st != MP_OK && m != pool->pause_mapped) {
    /* The undo stopped part-way: still paused, with what it mapped. */
    mp__fail(st,
             "%s; unmapping again what it had mapped failed too: the pool "
             "stays paused (%zu of %zu chunks mapped) until mp_pool_resume "
             "maps the rest",
             mp_last_error(), m, n);
    mp__resume_left_mapped(pool, m);
  }
  return st;
}

/* Under the lock, after mp__resume_map: unmaps what it mapped (another
 * arena's resume failed). The pool stays paused, its host copy kept. On a
 * failure *runs tells whether the undo mapped every chunk back (the pool
 * can run: mp__resume_refill, mp__resume_finish); else it stays paused
 * with the chunks it could not unmap again. */
static mp_status_t mp__resume_unmap(mp_pool_t *pool, bool *runs) {
  mp__segment_t *v = pool->vseg;
  size_t n = v != NULL ? v->nchunks : 0, m = n;
  mp__pool_device_begin(pool);
  mp_status_t st = mp__chunks_to(pool, v, &m, pool->pause_mapped);
  mp__pool_device_end(pool);
  mp__vrange_strays_count(pool); /* an undo's map may leave one */
  *runs = st != MP_OK && m == n;
  if (st != MP_OK && m != n)
    mp__resume_left_mapped(pool, m);
  return st;
}

/* Under the lock, after a failed mp__resume_unmap that mapped every chunk
 * back: the chunks it had unmapped came back empty, so the kept content
 * goes back in (from the host copy, still held) before the pool runs. */
static mp_status_t mp__resume_refill(mp_pool_t *pool) {
  if (pool->pause_copy == NULL)
    return MP_OK;
  mp__spans_t sp = {0};
  mp_status_t st = mp__live_spans(pool, &sp);
  if (st == MP_OK) {
    mp__pool_device_begin(pool);
    st = mp__copy_live(pool, &sp, false);
    mp__pool_device_end(pool);
  }
  free(sp.v);
  return st;
}

/* Under the lock, after mp__resume_map: the host copy goes (the resume
 * succeeds whatever its free says: the pool runs, its content back), and
 * the pool runs again with its figures from before the pause. stale: a
 * resume of its own, which frees the copies earlier refused frees kept
 * too; not the undo of a refused arenas' pause (mp__arenas_pause), which
 * changes nothing (status.h): it had freed an arena's kept copies. */
static void mp__resume_finish(mp_pool_t *pool, bool stale) {
  mp__segment_t *v = pool->vseg;
  void *copy = pool->pause_copy;
  pool->pause_copy = NULL;
  mp__pause_copies_free(pool, copy, stale);
  pool->paused = false;
  mp__pool_rare_update(pool);
  size_t from = pool->pause_mapped; /* mapped before this resume */
  pool->pause_mapped = 0;
  pool->st.device_alloc_count += v ? v->nchunks - from : 0;
  mp__chunks_history(pool, v, from, v ? v->nchunks : 0, MP__H_SEGMENT_MAP);
  pool->st.reserved_bytes = pool->paused_reserved;
  pool->st.segment_count = (v ? v->nchunks : 0) + mp__plain_count(pool);
  /* mp_pool_reset_peaks while paused set the peak to 0. */
  mp__stats_peaks(pool);
}

/* Resumes pool, a pool without arenas or one arena (stale as
 * mp__resume_finish's). No lock held on entry or return. */
static mp_status_t mp__resume_one(mp_pool_t *pool, bool stale) {
  mp__pool_lock(pool);
  mp__pool_wait_sync(pool);
  mp_status_t st =
      pool->paused
          ? mp__resume_map(pool)
          : mp__fail(MP_EINVAL, "mp_pool_resume: the pool is not paused");
  /* The lock held from the map on: no other resume maps it again. */
  if (st == MP_OK)
    mp__resume_finish(pool, stale);
  mp__pool_unlock(pool);
  return st;
}

/* ---- a pool with arenas (arena.c) ----------------------------------------
 * Each arena made pauses and resumes as a pool of its own, one after
 * another, with only its lock held (its waits for its streams run with no
 * lock at all: a host function on one of them may call into the pool).
 * The pool's own paused flag covers the whole pool: set before the first
 * arena pauses and cleared after the last resumes, it keeps arenas from
 * being made meanwhile (mp__arena_make) and refuses trim and add_stream;
 * pause_turn keeps a second pause or resume out while one runs. The cross-
 * arena paths (borrowing, the reclaim's trims) leave a paused arena alone;
 * the cap's shares count it at what it maps back (paused_reserved), as the
 * arenas resumed before it run while the resume finishes it. All or nothing: a
 * pause failing in arena k resumes the arenas it paused; a resume failing in
 * arena k unmaps the arenas it mapped (their host copies are kept until every
 * arena is mapped), so the pool stays paused with nothing lost. The free
 * plain segments go back once every arena is paused
 * (mp__arenas_plain_release): an arena's undo cannot bring them back. Should
 * such an undo fail too (a second device failure), the arena is left as it
 * stands, paused or running, and the message says so; a later resume resumes
 * every arena still paused. */

/* Under the pool's lock: what pause refuses in the pool or any arena (as
 * a pool without arenas refuses it: plain segments, a captured stream), so
 * that such a refusal changes nothing. reaped false: before
 * mp__arenas_reap lets the closed leases' blocks go, the answer as it will
 * stand after it (mp__pause_check_held), nothing let go; reaped true,
 * after it: the arenas as they stand (the reap dropped their locks). A
 * lease closed in between still counts, and that pause is MP_EBUSY, as
 * one a moment earlier would have been. */
static mp_status_t mp__arenas_pause_check(mp_pool_t *pool, bool reaped) {
  if (pool->pause_turn)
    return mp__fail(MP_EBUSY, "mp_pool_pause: a pause or resume of the pool "
                              "is under way");
  if (pool->paused)
    return mp__fail(MP_EBUSY, "mp_pool_pause: the pool is paused already");
  if (pool->children_making > 0)
    return mp__fail(MP_EBUSY, "mp_pool_pause: a child pool is being made");
  /* Graph pools count in the pool itself (their ranges in the arenas):
   * a graph's replays use its memory at its addresses. */
  if (pool->children > 0)
    return mp__fail(MP_EBUSY, "mp_pool_pause: %zu graph pool%s live",
                    pool->children, pool->children == 1 ? "" : "s");
  /* Arenas of plain segments only (virtual=0, no virtual memory): refused
   * before any arena is made too, as a pool without arenas is. */
  mp_status_t st = mp__pause_plain_check(pool, !reaped);
  for (size_t i = 0; i < pool->cfg.arenas && st == MP_OK; i++) {
    mp_pool_t *a = mp__arena_at(pool, i);
    if (a == NULL)
      continue;
    mp__pool_lock(a);
    if (!a->paused)
      st = mp__pause_check(a, reaped);
    mp__pool_unlock(a);
  }
  return st;
}

/* With no lock but each arena's own: leases closed since
 * (mp_ipc_handle_close) let their blocks go, as mp__pause_one does
 * (counted, they refused the pause). Not under the pool's lock: a block
 * let go may free a plain segment (release_threshold), and cuMemFree "may
 * perform implicit synchronization" (cuda.h), which waits for the host
 * functions queued on the streams (cuLaunchHostFunc), as the host device's
 * free does; one of them may be waiting for the pool's lock
 * (mp_pool_add_stream, a new arena's first allocation: arena.c's
 * mp__arena_share says the same). The arena's lock is dropped around the
 * device call (mp__pool_device_begin). A paused arena is left alone, as
 * in mp__pause_one. */
static void mp__arenas_reap(mp_pool_t *pool) {
  for (size_t i = 0; i < pool->cfg.arenas; i++) {
    mp_pool_t *a = mp__arena_at(pool, i);
    if (a == NULL)
      continue;
    mp__pool_lock(a);
    if (!a->paused && a->nexports > 0)
      mp__export_reap(a);
    mp__pool_unlock(a);
  }
}

/* Sets every arena's grow_held to hold, each under its lock. */
static void mp__arenas_hold_growth(mp_pool_t *pool, bool hold) {
  for (size_t i = 0; i < pool->cfg.arenas; i++) {
    mp_pool_t *a = mp__arena_at(pool, i);
    if (a == NULL)
      continue;
    mp__pool_lock(a);
    a->grow_held = hold;
    mp__pool_unlock(a);
  }
}

/* Once every arena is paused, each one's free plain segments go back
 * (mp__pause_plain_release), so that a pause refused in a later arena (no host
 * memory for its content, no events, a device failure, what another thread did
 * meanwhile) has given none back: the undo (mp__resume_one) maps an arena's
 * chunks back, but a segment the device took cannot come back, and a refused
 * call changes nothing (status.h). It did: each arena gave its own back as it
 * paused. Only a free the device refuses is left, as for a pool without arenas:
 * those given back stay given back, as a trim's would. Meanwhile the arena
 * shows its figures from before its pause, its plain segments in them (as a
 * pool without arenas does while it gives them back), then its paused ones
 * again, and what it maps back at the resume less what went. */
static mp_status_t mp__arenas_plain_release(mp_pool_t *pool) {
  mp_status_t st = MP_OK;
  for (size_t i = 0; i < pool->cfg.arenas && st == MP_OK; i++) {
    mp_pool_t *a = mp__arena_at(pool, i);
    if (a == NULL)
      continue;
    mp__pool_lock(a);
    if (mp__plain_count(a) > 0) {
      size_t was = a->st.reserved_bytes, count = a->st.segment_count;
      a->st.reserved_bytes = a->paused_reserved;
      a->st.segment_count = a->vseg->nchunks + mp__plain_count(a);
      st = mp__pause_plain_release(a);
      a->paused_reserved = a->st.reserved_bytes;
      a->st.reserved_bytes = was;
      a->st.segment_count = count;
    }
    mp__pool_unlock(a);
  }
  return st;
}

/* The arenas' pause; the pool's lock is not held. */
static mp_status_t mp__arenas_pause(mp_pool_t *pool, unsigned flags) {
  size_t n = pool->cfg.arenas;
  mp__pool_lock(pool);
  mp_status_t st = mp__arenas_pause_check(pool, false);
  mp__pool_unlock(pool);
  if (st != MP_OK)
    return st;
  mp__arenas_reap(pool);
  mp__pool_lock(pool);
  st = mp__arenas_pause_check(pool, true);
  if (st != MP_OK) {
    mp__pool_unlock(pool);
    return st;
  }
  pool->paused = pool->pause_turn = true;
  mp__pool_rare_update(pool);
  mp__pool_unlock(pool);
  /* No arena grows from here on: one not paused yet would grow into what
   * those paused before it gave back, and the pool would hold more than
   * the device can map again at the resume. A growth in flight began
   * before any arena was paused. */
  mp__arenas_hold_growth(pool, true);
  bool mine[MP_POOL_MAX_ARENAS] = {false}; /* paused by this call */
  for (size_t i = 0; i < n && st == MP_OK; i++) {
    mp_pool_t *a = mp__arena_at(pool, i);
    /* One left paused by a failed undo (above) is paused already. */
    if (a != NULL && !mp__pool_is_paused(a))
      mine[i] = (st = mp__pause_one(a, flags, true)) == MP_OK;
  }
  if (st == MP_OK)
    st = mp__arenas_plain_release(pool);
  if (st != MP_OK) {
    char why[MP__ERROR_MAX];
    bool stuck = false;
    snprintf(why, sizeof why, "%s", mp_last_error());
    for (size_t i = 0; i < n; i++)
      if (mine[i] && mp__resume_one(mp__arena_at(pool, i), false) != MP_OK)
        stuck = true;
    st = mp__fail(st, "%s%s", why,
                  stuck ? "; an arena it had paused could not be resumed: "
                          "it stays paused (its content kept) until "
                          "mp_pool_resume"
                        : "");
  }
  mp__arenas_hold_growth(pool, false);
  mp__pool_lock(pool);
  pool->pause_turn = false;
  pool->paused = st == MP_OK;
  mp__pool_rare_update(pool);
  mp__pool_unlock(pool);
  return st;
}

/* Under the pool's lock: whether one of its arenas answers yes to ask
 * (which takes the arena's lock). */
static bool mp__arena_any_locked(mp_pool_t *pool, bool (*ask)(mp_pool_t *)) {
  for (size_t i = 0; pool->arenas != NULL && i < pool->cfg.arenas; i++)
    if (mp__arena_at(pool, i) != NULL && ask(mp__arena_at(pool, i)))
      return true;
  return false;
}

/* Under the pool's lock: whether it, or one of its arenas, is paused: an
 * arena a failed pause could not resume stays paused while the pool runs
 * (mp__arenas_pause), and a resume resumes it. */
static bool mp__paused_any_locked(mp_pool_t *pool) {
  return pool->paused || mp__arena_any_locked(pool, mp__pool_is_paused);
}

/* The arenas' resume; the pool's lock is not held. */
static mp_status_t mp__arenas_resume(mp_pool_t *pool) {
  size_t n = pool->cfg.arenas;
  mp__pool_lock(pool);
  bool any = mp__paused_any_locked(pool);
  mp_status_t st =
      pool->pause_turn
          ? mp__fail(MP_EBUSY, "mp_pool_resume: a pause or resume of the "
                               "pool is under way")
      : !any ? mp__fail(MP_EINVAL, "mp_pool_resume: the pool is not paused")
             : MP_OK;
  if (st != MP_OK) {
    mp__pool_unlock(pool);
    return st;
  }
  pool->pause_turn = true;
  mp__pool_unlock(pool);
  bool mapped[MP_POOL_MAX_ARENAS] = {false};
  for (size_t i = 0; i < n && st == MP_OK; i++) {
    mp_pool_t *a = mp__arena_at(pool, i);
    if (a == NULL)
      continue;
    mp__pool_lock(a);
    mp__pool_wait_sync(a);
    if (a->paused)
      mapped[i] = (st = mp__resume_map(a)) == MP_OK;
    mp__pool_unlock(a);
  }
  char why[MP__ERROR_MAX];
  bool stuck = false, lost = false;
  snprintf(why, sizeof why, "%s", st != MP_OK ? mp_last_error() : "");
  for (size_t i = 0; i < n; i++) {
    mp_pool_t *a = mp__arena_at(pool, i);
    if (!mapped[i])
      continue;
    mp__pool_lock(a);
    mp__pool_wait_sync(a);
    /* Mapped again in full by the unmap's own undo if it failed: that
     * arena runs (one the undo left part-mapped stays paused). */
    bool runs = st == MP_OK;
    if (!runs)
      (void)mp__resume_unmap(a, &runs);
    stuck |= st != MP_OK && runs;
    if (st != MP_OK && runs)
      lost |= mp__resume_refill(a) != MP_OK;
    if (runs)
      mp__resume_finish(a, true);
    mp__pool_unlock(a);
  }
  if (st != MP_OK)
    st = mp__fail(st, "%s%s", why,
                  !stuck  ? ""
                  : !lost ? "; an arena it had mapped could not be unmapped "
                            "again: that arena runs, the rest stay paused "
                            "until mp_pool_resume"
                          : "; an arena it had mapped could not be unmapped "
                            "again and its kept content could not be copied "
                            "back: that arena runs without it, the rest stay "
                            "paused until mp_pool_resume");
  mp__pool_lock(pool);
  pool->pause_turn = false;
  if (st == MP_OK)
    pool->paused = false;
  mp__pool_rare_update(pool);
  mp__pool_unlock(pool);
  return st;
}

mp_status_t mp_pool_pause(mp_pool_t *pool, unsigned flags) {
  if (pool == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_pause: pool is NULL");
  if (flags & ~MP_PAUSE_KEEP_CONTENT)
    return mp__fail(MP_EINVAL, "mp_pool_pause: unknown flags 0x%x",
                    flags & ~MP_PAUSE_KEEP_CONTENT);
  /* From a host function (no device call, no wait there: pool_internal.h,
   * mp__pool_may_wait; nor in a graph pool's own growth), refused before
   * anything changes. */
  mp_status_t st = mp__pool_may_wait(pool, "mp_pool_pause");
  if (st != MP_OK)
    return st;
  /* Its segment_unmap events start their stacks at this call's caller. */
  MP__HIST_ENTRY(pool);
  st = pool->arenas != NULL ? mp__arenas_pause(pool, flags)
                            : mp__pause_one(pool, flags, false);
  if (st == MP_OK)
    mp__pause_tidy(pool);
  return st;
}

mp_status_t mp_pool_resume(mp_pool_t *pool) {
  if (pool == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_resume: pool is NULL");
  mp_status_t st = mp__pool_may_wait(pool, "mp_pool_resume"); /* pause's */
  if (st != MP_OK)
    return st;
  MP__HIST_ENTRY(pool); /* its segment_map events, as pause's */
  if (pool->arenas != NULL)
    return mp__arenas_resume(pool);
  return mp__resume_one(pool, true);
}

bool mp__pool_is_paused(mp_pool_t *pool) {
  mp__pool_lock(pool);
  bool paused = pool->paused;
  mp__pool_unlock(pool);
  return paused;
}

bool mp__pool_resume_wanted(mp_pool_t *pool) {
  mp__pool_lock(pool);
  bool any = mp__paused_any_locked(pool);
  mp__pool_unlock(pool);
  return any;
}

/* Whether pool holds a host copy of its content (takes its lock). */
static bool mp__pause_copy_held(mp_pool_t *pool) {
  mp__pool_lock(pool);
  bool held = pool->pause_copy != NULL;
  mp__pool_unlock(pool);
  return held;
}

unsigned mp__pool_pause_kept(mp_pool_t *pool) {
  mp__pool_lock(pool);
  bool held = pool->pause_copy != NULL ||
              mp__arena_any_locked(pool, mp__pause_copy_held);
  mp__pool_unlock(pool);
  return held ? MP_PAUSE_KEEP_CONTENT : 0;
}

/* At destroy: what a paused pool still holds beside its reservation. */
void mp__pool_pause_release(mp_pool_t *pool) {
  if (pool->pause_copy != NULL) {
    mp__device_host_free(pool->dev, pool->pause_copy);
    pool->pause_copy = NULL;
  }
  /* The copies a refused free kept (mp__pause_copies_free): a last try. */
  while (pool->pause_stale != NULL) {
    void *p = pool->pause_stale;
    memcpy(&pool->pause_stale, p, sizeof pool->pause_stale);
    mp__device_host_free(pool->dev, p);
  }
}
