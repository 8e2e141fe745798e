/* graph.c - graph-private pools: memory a captured CUDA graph keeps.
 *
 * A graph pool is an mp_pool_t like any other, with one difference in where
 * its memory comes from: it grows (segment.c, plain growth) by borrowing a
 * range of its parent, a live parent block marked MP__B_CHILD whose child is
 * the graph pool, and it gives its ranges back only when released and
 * empty. So a block freed into it is reusable only by allocations routed to
 * it (the same capture, or later captures sharing the pool: PyTorch's
 * rule), and addresses stay put across replays.
 *
 * Routing: the parent keeps a small table of streams that allocate to a
 * graph pool (mp_pool_graph_begin/end) and of the ranges it lent, so that
 * mp_pool_alloc on such a stream, and frees of graph memory through the
 * parent, land in the graph pool. Both pools mark the stream capturing in
 * their stream tables (stream.c then never records on it nor queries it,
 * and stream.c's mp__pool_sync refuses): the calls CUDA forbids during
 * capture.
 *
 * Locks: never two pool locks at once. The parent's lock is taken with
 * the graph pool's dropped (growth runs with it dropped and the pool
 * marked inflight), and a call routed to the graph pool drops the parent's
 * first. Invariant: every range in parent->granges is a live parent block
 * of graph->segs, and a stream slot's capturing count, in either pool, is
 * the routes naming it plus the begins on it still in flight (begin counts
 * one mark in each pool, end or a refusal takes it back; a stream
 * forgotten before the end clears its own marks and route, stream.c); a
 * pool's ncapturing counts its slots with a nonzero count.
 *
 * A parent with arenas (arena.c) keeps the routes and its own marks (which
 * arenas made later copy); every arena marks the stream too, and the
 * arena that lends a range (the calling thread's: the graph pool's
 * upstream is arena.c's) keeps it in its own table of ranges, where the
 * release finds it to give it back. */
#include <stdlib.h>
#include <string.h>

#include "pool_internal.h"

/* arr (n used of *cap elements of elem bytes) with room for one more:
 * itself, or a copy twice as big; NULL (error set, arr untouched) without
 * host memory. */
static void *mp__graph_room(void *arr, size_t n, size_t *cap, size_t elem,
                            const char *what) {
  if (n < *cap)
    return arr;
  size_t c = *cap ? *cap * 2 : 8;
  void *a = mp__host_realloc(arr, c * elem);
  if (a == NULL) {
    mp__fail(MP_ENOMEM, "out of host memory for graph %s", what);
    return NULL;
  }
  *cap = c;
  return a;
}

/* Graph growth, the graph pool's upstream: with graph's lock dropped
 * (inflight), borrows bytes of the parent on stream s for a new range of
 * graph. */
static mp_status_t mp__graph_borrow(mp_pool_t *graph, size_t *bytes,
                                    mp_stream_t s, void **out);

/* Whether the graph pool allocation this thread is in asked the parent's
 * out-of-memory handler (mp__graph_ask). */
static _Thread_local bool mp__graph_asked;

/* Whether graph was released (mp__graph_release, from any thread: the
 * parent's out-of-memory handler inside graph's growth, or another thread
 * meanwhile, maybe one that handler waits for) while this allocation on it
 * borrows: a range borrowed for it now would serve a graph that is gone
 * (pool.h: no new block then), as a retry its own handler asks is refused
 * (pool.c). Read without graph's lock (the caller holds the parent's, or
 * none): graph lives on while the allocation is inside (ncalls). Every
 * release that the borrowing can have waited for (through the handler,
 * its only call out) is seen: the flag is read after the handler returns,
 * under the lender's lock before the range is lent. A release later than
 * that read, with no wait between them, orders after the allocation,
 * whose block then keeps the pool as any live block does. */
static bool mp__graph_gone_here(const mp_pool_t *graph) {
  return atomic_load_explicit(&graph->graph_gone, memory_order_acquire);
}

static MP__COLD mp_status_t mp__graph_refuse_gone(const mp_pool_t *graph) {
  return mp__fail(MP_EINVAL,
                  "graph pool %p was released while this allocation on it "
                  "borrowed from its parent: no range is lent to it",
                  (const void *)graph);
}

/* A graph pool's upstream: its borrowing (graph->borrow), marked as this
 * thread's growth of graph while it runs; none once graph is released
 * (its ladder may borrow again). */
static mp_status_t mp__graph_upstream(mp_pool_t *graph, size_t *bytes,
                                      mp_stream_t s, void **out) {
  if (mp__graph_gone_here(graph))
    return mp__graph_refuse_gone(graph);
  const mp_pool_t *was = mp__graph_growing;
  mp__graph_growing = graph;
  mp_status_t st = graph->borrow(graph, bytes, s, out);
  mp__graph_growing = was;
  /* Released meanwhile, by the handler that asked no retry or by another
   * thread it waited for (either may have freed blocks of graph first):
   * the ladder stops here, its next search would hand one out. */
  if (st != MP_OK && mp__graph_gone_here(graph))
    st = mp__graph_refuse_gone(graph);
  return st;
}

/* The route of s as owner's stream (mp__stream_owner), or NULL. */
static mp__route_t *mp__graph_route_of(const mp_pool_t *parent, mp_stream_t s,
                                       uint64_t owner) {
  for (size_t i = 0; i < parent->nroutes; i++)
    if (parent->routes[i].s == s && parent->routes[i].owner == owner)
      return &parent->routes[i];
  return NULL;
}

/* A call, never a copy inline: its callers take it only while routes
 * exist, and a fourth caller (mp_pool_alloc_movable's check) changed the
 * code inlined into mp_pool_alloc: 3.4 instructions more per free+alloc
 * pair (bench/micro/count_pairs.sh) on the path without routes; as a call,
 * 0.4 more than before that caller. */
__attribute__((noinline)) mp_pool_t *mp__graph_route(const mp_pool_t *parent,
                                                     mp_stream_t s) {
  const mp__route_t *r =
      mp__graph_route_of(parent, s, mp__stream_owner(parent, s));
  return r != NULL ? r->graph : NULL;
}

mp_pool_t *mp__graph_owner(const mp_pool_t *parent, uintptr_t p) {
  /* The common case first, in O(1): a live block of the parent's own (not a
   * range it lent) is no graph pool's, so frees of ordinary blocks do not
   * walk the ranges while graphs live. */
  const mp__block_t *b = mp__map_find(parent, p);
  if (b != NULL && !(b->flags & MP__B_CHILD))
    return NULL;
  const mp__grange_t *r = mp__grange_of(parent, p);
  return r != NULL ? r->graph : NULL;
}

mp_status_t mp__graph_create(mp_pool_t *parent, mp__upstream_t upstream,
                             mp_pool_t **out) {
  if (parent == NULL || out == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_graph_create: %s is NULL",
                    parent == NULL ? "parent" : "out");
  if (parent->parent != NULL)
    return mp__fail(MP_EINVAL, "mp_pool_graph_create: the parent is a %s pool",
                    parent->graph ? "graph" : "child");
  /* Under the lock: mp_pool_set_max_fraction changes it. */
  mp__pool_lock(parent);
  mp_pool_config_t cfg = parent->cfg;
  mp__pool_unlock(parent);
  /* Ranges borrowed from the parent are plain segments of the graph pool;
   * they are never split for reuse elsewhere, so no split limit either. */
  cfg.flags &= ~(unsigned)MP_POOL_VIRTUAL;
  cfg.max_bytes = 0;
  cfg.max_fraction = 0;
  cfg.max_split = 0;
  cfg.release_threshold = 0;
  /* A parent with arenas lends from the calling thread's arena (its
   * upstream, arena.c); the graph pool itself is one pool. */
  cfg.arenas = 0;
  mp_pool_t *g;
  mp_status_t st = mp__pool_new(parent->dev, &cfg, &g);
  if (st != MP_OK)
    return st;
  /* A pool id as PyTorch's graph_pool_handle() makes one, (0, n), for the
   * snapshot: never (0, 0), the id of a pool's own segments. */
  static _Atomic uint64_t ids;
  g->graph_id[1] = atomic_fetch_add_explicit(&ids, 1, memory_order_relaxed) + 1;
  mp__pool_lock(parent);
  if ((st = mp__pool_paused(parent, "mp_pool_graph_create")) == MP_OK) {
    /* A stream it routes must reach the arenas' path (arena.c, "Solo"):
     * solo ends for good here, once the call can no longer be refused
     * (a refused one changes nothing), under the lock its route is added
     * with (mp__graph_begin_owned), before the graph pool is published. */
    if (parent->arenas != NULL)
      mp__arena_solo_never(parent);
    g->parent = parent;
    g->graph = true;
    mp__pool_rare_update(g);
    /* The one call down-to-up in src/pool (pool_internal.h's map): plain
     * growth of g (segment.c) borrows from parent through it, as an RMM
     * resource asks its upstream. */
    g->borrow = upstream != NULL ? upstream : mp__graph_borrow;
    g->upstream = mp__graph_upstream;
    /* No cap of its own: every range it grows by is an allocation of the
     * parent, which answers against its cap of the moment (a copy taken
     * here would miss a later mp_pool_set_max_fraction) with its own
     * MP_ELIMIT or MP_ENOMEM. */
    g->cap = SIZE_MAX;
    g->cap_is_max = false;
    parent->children++;
  }
  mp__pool_unlock(parent);
  if (st != MP_OK) {
    mp__pool_free_host(g);
    return st;
  }
  *out = g;
  return MP_OK;
}

/* Counts one mark more or fewer on s (the calling thread's, for the
 * per-thread handle) in pool's stream table. */
static mp_status_t mp__graph_mark(mp_pool_t *pool, mp_stream_t s, bool on) {
  /* A pool with arenas uses no stream of its own: a slot it adds only
   * carries the marks that arenas made later copy (mp__arena_make), and
   * goes with the last one. */
  if (pool->arenas != NULL)
    return mp__stream_capture_mark_owned(pool, s, mp__stream_owner(pool, s), on,
                                         true);
  uint32_t sidx;
  mp_status_t st = mp__stream_index(pool, s, &sidx);
  if (st == MP_OK)
    mp__stream_capture_mark(pool, sidx, on);
  return st;
}

/* Takes back one mark of s as owner's stream (mp__stream_owner); none
 * without a slot (a forgotten stream's went with it). */
static void mp__graph_unmark_owned(mp_pool_t *pool, mp_stream_t s,
                                   uint64_t owner) {
  (void)mp__stream_capture_mark_owned(pool, s, owner, false, false);
}

/* Under parent's lock, on a pool with arenas: one mark more (on) or one
 * fewer of s as owner's stream in every arena made (arenas made later copy
 * the parent's own marks, mp__arena_make). Marking may fail (host memory
 * for a new slot): the marks made are taken back, and so nothing changes.
 */
static mp_status_t mp__graph_mark_arenas(mp_pool_t *parent, mp_stream_t s,
                                         uint64_t owner, bool on) {
  size_t n = parent->arenas != NULL ? parent->cfg.arenas : 0;
  mp_status_t st = MP_OK;
  size_t i = 0;
  for (; i < n && st == MP_OK; i++) {
    mp_pool_t *a = mp__arena_at(parent, i);
    if (a == NULL)
      continue;
    mp__pool_lock(a);
    st = mp__stream_capture_mark_owned(a, s, owner, on, true);
    mp__pool_unlock(a);
  }
  /* Arena i - 1 failed: the ones before it are unmarked again. */
  for (size_t k = 0; st != MP_OK && k + 1 < i; k++) {
    mp_pool_t *a = mp__arena_at(parent, k);
    if (a == NULL)
      continue;
    mp__pool_lock(a);
    mp__graph_unmark_owned(a, s, owner);
    mp__pool_unlock(a);
  }
  return st;
}

static mp_status_t mp__graph_check(mp_pool_t *parent, mp_pool_t *graph,
                                   const char *fn) {
  if (parent == NULL || graph == NULL)
    return mp__fail(MP_EINVAL, "%s: %s is NULL", fn,
                    parent == NULL ? "parent" : "graph");
  if (!graph->graph || graph->parent != parent)
    return mp__fail(MP_EINVAL, "%s: %p is not a graph pool of %p", fn,
                    (void *)graph, (void *)parent);
  return MP_OK;
}

/* cuda.h: #define CU_STREAM_LEGACY ((CUstream)0x1), the legacy default
 * stream's handle, as NULL is. */
#define MP__GRAPH_LEGACY_STREAM ((mp_stream_t)(uintptr_t)0x1)

/* Whether s names the legacy default stream, which no capture can use:
 * cuda.h, cuStreamBeginCapture, "Capture may not be initiated if stream
 * is CU_STREAM_LEGACY" (the fake driver refuses so too). begin only routes
 * and marks s, it begins no capture: a route there would send every
 * allocation on the default stream to the graph pool and mark that stream
 * capturing (no record, query or synchronize on it) for a capture that
 * cannot exist. Refused on every device alike (the host device has no
 * capture), so that a program's pools behave as they would on CUDA. */
static bool mp__graph_legacy_stream(mp_stream_t s) {
  return s == NULL || s == MP__GRAPH_LEGACY_STREAM;
}

/* Under graph's lock: a released graph pool refuses a begin. */
static mp_status_t mp__graph_begin_released(const mp_pool_t *graph) {
  return graph->released
             ? mp__fail(MP_EINVAL,
                        "mp_pool_graph_begin: graph pool %p is released",
                        (const void *)graph)
             : MP_OK;
}

/* Under parent's lock: what refuses a begin of s there (s routed already)
 * and room for its route; nothing marked. */
static mp_status_t mp__graph_begin_room(mp_pool_t *parent, mp_stream_t s) {
  if (mp__graph_route(parent, s) != NULL)
    return mp__fail(MP_EBUSY,
                    "mp_pool_graph_begin: stream %p already allocates to a "
                    "graph pool",
                    (void *)s);
  mp__route_t *r = mp__graph_room(parent->routes, parent->nroutes,
                                  &parent->routes_cap, sizeof *r, "routes");
  if (r == NULL)
    return MP_ENOMEM;
  parent->routes = r;
  return MP_OK;
}

mp_status_t mp__graph_begin_owned(mp_pool_t *parent, mp_pool_t *graph,
                                  mp_stream_t s, uint64_t *owner) {
  mp_status_t st = mp__graph_check(parent, graph, "mp_pool_graph_begin");
  if (st != MP_OK)
    return st;
  /* The refusals first, each under its own pool's lock (never two at
   * once), before anything is marked: a released graph pool, then s
   * routed already (or no host memory for its route). Before, the graph
   * pool's slot was marked first and a refused begin took the mark back
   * after: meanwhile another thread saw that pool capturing on s (its
   * synchronize refused, stream.c) for a capture that never began there,
   * and the mark and unmark settled and closed the slot's epoch. */
  mp__pool_lock(graph);
  st = mp__graph_begin_released(graph);
  mp__pool_unlock(graph);
  if (st != MP_OK)
    return st;
  mp__pool_lock(parent);
  st = mp__graph_begin_room(parent, s);
  if (st == MP_OK && parent->arenas != NULL)
    mp__arena_solo_never(parent); /* its create did; kept beside the route */
  mp__pool_unlock(parent);
  if (st != MP_OK)
    return st;
  /* Then the graph side: the slot is marked before any allocation can be
   * routed to it. Both asked again under the locks they are acted on
   * with: a release or another begin of s may have come while neither
   * lock was held (a race this call then loses as a call a moment later
   * would, its own mark taken back below). */
  mp__pool_lock(graph);
  /* Whether the graph pool met s before: a slot its mark adds goes again
   * if the begin is refused below. */
  bool knew = mp__stream_known(graph, s);
  st = mp__graph_begin_released(graph);
  if (st == MP_OK)
    st = mp__graph_mark(graph, s, true);
  mp__pool_unlock(graph);
  if (st != MP_OK)
    return st;
  mp__pool_lock(parent);
  st = mp__graph_begin_room(parent, s);
  if (st == MP_OK)
    st = mp__graph_mark(parent, s, true);
  /* After the mark, which adds s to the table: a per-thread stream is
   * routed for the calling thread only (the handle names its stream). */
  uint64_t own = mp__stream_owner(parent, s);
  /* With arenas, each arena's table too: the arena's cache is off while
   * it has a capturing slot (cached_off), so that an allocation on s
   * misses it and finds the route (pool.c), and no arena records on s or
   * queries it. */
  if (st == MP_OK &&
      (st = mp__graph_mark_arenas(parent, s, own, true)) != MP_OK)
    mp__graph_unmark_owned(parent, s, own);
  if (st == MP_OK) {
    parent->routes[parent->nroutes++] = (mp__route_t){s, own, graph};
    mp__pool_rare_update(parent);
  }
  mp__pool_unlock(parent);
  if (st == MP_OK && owner != NULL)
    *owner = own;
  /* A refusal changes nothing: this call's own mark goes (only it, as
   * another begin's mark or route may still stand), and the slot its mark
   * added (the parent's or an arena's mark refused for host memory), unless
   * something used it meanwhile (mp__stream_unmake keeps it then). Before,
   * the slot stayed: the refused begin left s in the graph pool's table. */
  if (st != MP_OK) {
    mp__pool_lock(graph);
    (void)mp__graph_mark(graph, s, false);
    if (!knew)
      (void)mp__stream_unmake(graph, s);
    mp__pool_unlock(graph);
  }
  return st;
}

/* The legacy stream is refused here, not in mp__graph_begin_owned:
 * torch.c routes through that the streams a begin_allocate_to_pool filter
 * takes, and PyTorch's MemPool (torch.cuda.use_mem_pool) takes the
 * current thread's allocations outside any capture, on whatever stream is
 * current, the default one included. */
mp_status_t mp_pool_graph_begin(mp_pool_t *parent, mp_pool_t *graph,
                                mp_stream_t s) {
  if (MP__UNLIKELY(mp__graph_legacy_stream(s))) {
    mp_status_t st = mp__graph_check(parent, graph, "mp_pool_graph_begin");
    return st != MP_OK
               ? st
               : mp__fail(MP_EINVAL,
                          "mp_pool_graph_begin: stream %p is the legacy "
                          "default stream, which CUDA cannot capture "
                          "(cuStreamBeginCapture refuses it): route the "
                          "stream being captured",
                          (void *)s);
  }
  return mp__graph_begin_owned(parent, graph, s, NULL);
}

/* Ends the route of s as owner's stream, or of the calling thread's
 * (owner NULL). */
static mp_status_t mp__graph_end(mp_pool_t *parent, mp_stream_t s,
                                 const uint64_t *owner) {
  if (parent == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_graph_end: parent is NULL");
  mp_pool_t *graph = NULL;
  mp__pool_lock(parent);
  uint64_t own = owner != NULL ? *owner : mp__stream_owner(parent, s);
  mp__route_t *r = mp__graph_route_of(parent, s, own);
  if (r != NULL) {
    graph = r->graph;
    *r = parent->routes[--parent->nroutes];
    mp__pool_rare_update(parent);
    mp__graph_unmark_owned(parent, s, own);             /* marked: has a slot */
    (void)mp__graph_mark_arenas(parent, s, own, false); /* cannot fail */
  }
  mp__pool_unlock(parent);
  if (graph == NULL)
    return mp__fail(MP_EINVAL,
                    "mp_pool_graph_end: stream %p allocates to no graph pool",
                    (void *)s);
  mp__pool_lock(graph);
  mp__graph_unmark_owned(graph, s, own);
  mp__pool_unlock(graph);
  return MP_OK;
}

mp_status_t mp_pool_graph_end(mp_pool_t *parent, mp_stream_t s) {
  return mp__graph_end(parent, s, NULL);
}

mp_status_t mp__graph_end_owned(mp_pool_t *parent, mp_stream_t s,
                                uint64_t owner) {
  return mp__graph_end(parent, s, &owner);
}

bool mp__graph_routed_owned(mp_pool_t *parent, mp_stream_t s, uint64_t owner) {
  mp__pool_lock(parent);
  bool found = mp__graph_route_of(parent, s, owner) != NULL;
  mp__pool_unlock(parent);
  return found;
}

mp_status_t mp__graph_set_id(mp_pool_t *graph, uint64_t first,
                             uint64_t second) {
  if (graph == NULL || !graph->graph)
    return mp__fail(MP_EINVAL, "mp__graph_set_id: not a graph pool");
  if (first == 0 && second == 0)
    return mp__fail(MP_EINVAL, "mp__graph_set_id: (0, 0) names a pool's own "
                               "segments, not a graph pool's");
  /* Under the lock: a snapshot reads the id under it. */
  mp__pool_lock(graph);
  graph->graph_id[0] = first;
  graph->graph_id[1] = second;
  mp__pool_unlock(graph);
  return MP_OK;
}

mp_pool_t *mp_pool_graph_of(mp_pool_t *parent, mp_stream_t s) {
  if (parent == NULL)
    return NULL;
  mp__pool_lock(parent);
  mp_pool_t *g = parent->nroutes ? mp__graph_route(parent, s) : NULL;
  mp__pool_unlock(parent);
  return g;
}

/* Room for one more lent range in lender's list (under its lock); false
 * (said) without host memory. */
static bool mp__graph_lend_room(mp_pool_t *lender) {
  mp__grange_t *r = mp__graph_room(lender->granges, lender->ngranges,
                                   &lender->granges_cap, sizeof *r, "ranges");
  if (r != NULL)
    lender->granges = r;
  return r != NULL;
}

mp_status_t mp__graph_lend_rooms(mp_pool_t *parent) {
  for (size_t i = 0; i < parent->cfg.arenas; i++) {
    mp_pool_t *a = mp__arena_at(parent, i);
    if (a == NULL)
      continue;
    mp__pool_lock(a);
    bool room = mp__graph_lend_room(a);
    mp__pool_unlock(a);
    if (!room)
      return MP__EHOST;
  }
  return MP_OK;
}

mp_status_t mp__graph_lend(mp_pool_t *lender, mp_pool_t *graph,
                           void *const *out, size_t *bytes) {
  bool room = mp__graph_lend_room(lender);
  mp__slot_t *slot = NULL;
  mp__block_t *b = mp__map_lookup(lender, (uintptr_t)*out, &slot);
  bool gone = mp__graph_gone_here(graph);
  if (!room || gone) {
    mp__map_remove_slot(lender, slot);
    mp__block_release(lender, b);
    /* A refused allocation: no free counted (nor, derived from free_count
     * and the live map, an allocation). The peaks the block may have
     * raised stay: room taken before the take (mp__graph_borrow,
     * mp__graph_lend_rooms) leaves a lend refused for host memory only
     * where another borrow took that room while the take had the lock
     * dropped. */
    lender->st.free_count--;
    return gone ? mp__graph_refuse_gone(graph) : MP__EHOST;
  }
  b->flags |= MP__B_CHILD;
  b->child = graph;
  lender->granges[lender->ngranges++] = (mp__grange_t){b->addr, b->size, graph};
  mp__pool_rare_update(lender);
  *bytes = b->size;
  return MP_OK;
}

static mp_status_t mp__graph_borrow(mp_pool_t *graph, size_t *bytes,
                                    mp_stream_t s, void **out) {
  mp_pool_t *parent = graph->parent;
  mp_status_t st;
  mp__pool_lock(parent);
  mp__grange_t *r = mp__graph_room(parent->granges, parent->ngranges,
                                   &parent->granges_cap, sizeof *r, "ranges");
  if (r != NULL)
    parent->granges = r;
  /* A failure counts once in the graph pool's allocation, whose ladder may
   * borrow again (mp__graph_counted). */
  bool quiet = mp__oom_quiet;
  mp__oom_quiet = mp__graph_counted();
  /* Only memory no work queued so far uses, on any stream: a replay runs
   * after nothing queued before the capture unless launched on s itself
   * (a block s freed is s's at once by stream order, but not a graph's). */
  st = r != NULL ? mp__pool_alloc_locked_done(parent, *bytes, s, out)
                 : MP__EHOST;
  bool device = mp__pool_oom_last(parent);
  /* Out of memory, the parent's handler, as the arenas' path asks it
   * (arena.c): the range is an allocation of the parent's. Once per
   * allocation of the graph pool, whose ladder may borrow again
   * (mp__graph_ask). A retry's failure counts in place of the first
   * (mp__pool_oom_retry). */
  if (device && mp__graph_ask(st) && mp__pool_oom_retry(parent, st, *bytes)) {
    /* The handler may have released graph before it asked for the retry,
     * or waited for another thread that did (mp__graph_lend refuses too,
     * for the arenas' path). */
    if (mp__graph_gone_here(graph)) {
      st = mp__graph_refuse_gone(graph);
      device = false;
    } else {
      st = mp__pool_alloc_locked_done(parent, *bytes, s, out);
      device = mp__pool_oom_last(parent);
    }
  }
  mp__oom_quiet = quiet;
  /* The parent's MP_ENOMEM that is not its out of memory is host memory
   * running out (its message says so): MP__EHOST, so that the graph pool's
   * ladder stops with that message instead of taking it for a full
   * device. Told by the failure itself: the parent's oom_count moves with
   * other threads' failures, and with the handler's own allocations. */
  if (st == MP_ENOMEM && !device)
    st = MP__EHOST;
  /* The allocation may have dropped the lock (growth) while another graph
   * pool borrowed: the room is asked again. */
  if (st == MP_OK)
    st = mp__graph_lend(parent, graph, out, bytes);
  mp__pool_unlock(parent);
  return st;
}

/* Under lender's lock: graph's range at base (its segment) goes back to
 * lender as a free block, reusable there once the work queued on every
 * stream lender knows has passed (replays may still run anywhere), and
 * with device once lender has synchronized the device (an arena, where
 * other arenas met streams it could not learn: graph_give_back_to_arena). */
static void mp__graph_give_back(mp_pool_t *lender, uintptr_t base,
                                bool device) {
  for (size_t i = 0; i < lender->ngranges; i++)
    if (lender->granges[i].base == base) {
      lender->granges[i] = lender->granges[--lender->ngranges];
      mp__pool_rare_update(lender);
      break;
    }
  mp__slot_t *slot = NULL;
  mp__block_t *b = mp__map_lookup(lender, base, &slot);
  mp__stream_use_all_released(lender, b);
  if (device)
    mp__stream_use_device(lender, b);
  mp__map_remove_slot(lender, slot);
  /* Apart from lender's free memory while the streams' work is pending:
   * merged, that memory would wait for it too (block.c). */
  mp__block_release_apart(lender, b);
}

/* A stream a pool has met (not only through a capture's mark). */
typedef struct {
  mp_stream_t s;
  uint64_t owner;
} mp__met_t;

/* Adds the streams pool a has met, those whose work may still run, to
 * *m (*n of them, room for *cap); false when host memory runs out or a
 * forgotten stream's work is not done (its handle may be gone: no other
 * arena can learn it). */
static bool mp__graph_streams_met(mp_pool_t *a, mp__met_t **m, size_t *n,
                                  size_t *cap) {
  mp__pool_lock(a);
  bool ok = true;
  for (uint32_t i = 0; ok && i < a->nstreams; i++) {
    const mp__strm_t *st = &a->streams[i];
    if (st->gone) {
      ok = mp__stream_gone_done(a, i);
      continue;
    }
    if (st->join || st->mark_only)
      continue;
    mp__met_t *r = mp__graph_room(*m, *n, cap, sizeof **m, "streams");
    if ((ok = r != NULL)) {
      *m = r;
      (*m)[(*n)++] = (mp__met_t){st->s, st->owner};
    }
  }
  mp__pool_unlock(a);
  return ok;
}

/* Under lender's lock: lender names every stream of m it has not met, so
 * that the range it gets back waits for their work; false where it cannot
 * (another thread's per-thread stream, on which this thread can record
 * nothing; host memory; a forget under way, or begun since forgets was read,
 * whose stream lender must not learn). The calling thread's own per-thread
 * stream is learned with its owner: this thread records on it, and the
 * device synchronize it would cost otherwise is a call CUDA forbids while
 * any thread captures in global mode (cuda.h, cuStreamBeginCapture), on a
 * stream lender may never have met and so cannot refuse for. */
static bool mp__graph_learn_streams(mp_pool_t *lender, const mp__met_t *m,
                                    size_t n, uint64_t forgets) {
  if (forgets == UINT64_MAX || mp__device_forgets(lender->dev) != forgets)
    return false;
  uint64_t self = mp__self();
  for (size_t k = 0; k < n; k++) {
    uint32_t sidx;
    if (mp__stream_met_owned(lender, m[k].s, m[k].owner))
      continue;
    if ((m[k].owner != 0 && m[k].owner != self) ||
        mp__stream_index_owned(lender, m[k].s, m[k].owner, &sidx) != MP_OK)
      return false;
  }
  return true;
}

/* With arenas: gives graph's range at base back to the arena that lent
 * it, the one whose table of ranges holds it. The graph's replays may run
 * on any stream any arena has met: the lender learns those it has not, and
 * the graph pool's own (gm, gn of them; gok: all of them listed), or where
 * it cannot, the range waits for a device synchronize of the lender. Each
 * arena under its own lock, never two at once; a stream met after the look
 * was not known at the release. forgets: the device's count of forgets
 * before the graph pool's streams were listed. */
static void mp__graph_give_back_to_arena(mp_pool_t *parent, uintptr_t base,
                                         const mp__met_t *gm, size_t gn,
                                         bool gok, uint64_t forgets) {
  for (size_t i = 0; i < parent->cfg.arenas; i++) {
    mp_pool_t *a = mp__arena_at(parent, i);
    if (a == NULL)
      continue;
    mp__pool_lock(a);
    bool lent = false;
    for (size_t k = 0; k < a->ngranges && !lent; k++)
      lent = a->granges[k].base == base;
    mp__pool_unlock(a);
    if (!lent)
      continue;
    /* Only this caller gives the range back: it stays lent meanwhile. */
    mp__met_t *m = NULL;
    size_t n = 0, cap = 0;
    bool ok = gok;
    for (size_t k = 0; ok && k < parent->cfg.arenas; k++) {
      mp_pool_t *o = mp__arena_at(parent, k);
      if (o != NULL && o != a)
        ok = mp__graph_streams_met(o, &m, &n, &cap);
    }
    mp__pool_lock(a);
    ok = ok && mp__graph_learn_streams(a, gm, gn, forgets) &&
         mp__graph_learn_streams(a, m, n, forgets);
    mp__graph_give_back(a, base, !ok);
    mp__pool_unlock(a);
    free(m);
    return;
  }
  MP__ASSERT(!"a graph pool's range in no arena");
}

/* Gives every range of a released, empty graph pool back to the pool that
 * lent it (its parent, or the parent's arena that lent it) and frees it.
 * The lender first learns the streams the graph pool met: a block freed in
 * it may still be used by one the lender never saw (a free or
 * mp_pool_record_stream there), and the range must wait for that work as
 * for its own streams'; where it cannot learn one, the range waits for a
 * device synchronize. */
static void mp__graph_finish(mp_pool_t *graph) {
  mp_pool_t *parent = graph->parent;
  bool arenas = parent->arenas != NULL;
  /* A look refused here (host memory, a stream) only makes a range wait
   * for a synchronize: the release or free that finishes succeeds, and
   * leaves the thread's last failure message as it was. */
  mp__error_saved_t saved;
  mp__error_save(&saved);
  uint64_t serial = mp__error_serial();
  uint64_t forgets = mp__device_forgets(parent->dev);
  mp__met_t *gm = NULL;
  size_t gn = 0, gcap = 0;
  bool gok = mp__graph_streams_met(graph, &gm, &gn, &gcap);
  bool learned = false;
  if (!arenas) {
    mp__pool_lock(parent);
    learned = gok && mp__graph_learn_streams(parent, gm, gn, forgets);
  }
  for (mp__segment_t *s = graph->segs; s != NULL; s = s->next)
    if (arenas)
      mp__graph_give_back_to_arena(parent, s->base, gm, gn, gok, forgets);
    else
      mp__graph_give_back(parent, s->base, !learned);
  free(gm);
  if (arenas)
    mp__pool_lock(parent);
  parent->children--;
  mp__pool_unlock(parent);
  for (mp__segment_t *s = graph->segs; s != NULL;) {
    mp__segment_t *n = s->next;
    free(s);
    s = n;
  }
  graph->segs = NULL;
  mp__pool_free_host(graph);
  if (mp__error_serial() != serial)
    mp__error_restore(&saved);
}

/* Growth (inflight) runs only inside an allocation (a graph pool's trim
 * gives nothing back), so the allocation that grew finishes the pool when
 * the free came meanwhile. */
bool mp__graph_take_last(mp_pool_t *graph) {
  bool last = graph->graph && graph->released && mp__map_count(graph) == 0 &&
              graph->ncapturing == 0 && graph->ncalls == 0 && !graph->inflight;
  if (last)
    graph->released = false; /* only the caller that saw it finishes it */
  return last;
}

bool mp__graph_enter(mp_pool_t *graph) {
  graph->ncalls++;
  bool outer = mp__graph_asked;
  mp__graph_asked = false;
  return outer;
}

MP__COLD mp_status_t mp__graph_refuse_released(mp_pool_t *graph,
                                               const char *fn) {
  mp__pool_unlock(graph);
  return mp__fail(MP_EINVAL,
                  "%s: graph pool %p is released (its live blocks keep it "
                  "only until they are freed)",
                  fn, (void *)graph);
}

MP__COLD mp_status_t mp__graph_refuse_retry(const mp_pool_t *graph,
                                            const char *fn) {
  return mp__fail(MP_EINVAL,
                  "%s: graph pool %p was released by its out-of-memory "
                  "handler",
                  fn, (const void *)graph);
}

bool mp__graph_leave(mp_pool_t *graph, bool outer) {
  mp__graph_asked = outer;
  graph->ncalls--;
  return mp__graph_take_last(graph);
}

bool mp__graph_ask(mp_status_t st) {
  if ((st != MP_ENOMEM && st != MP_ELIMIT) || mp__graph_asked ||
      mp__segment_trying)
    return false;
  mp__graph_asked = true;
  return true;
}

bool mp__graph_counted(void) {
  return mp__graph_asked || mp__segment_trying;
}

void mp__graph_finish_if(mp_pool_t *graph, bool last) {
  if (last)
    mp__graph_finish(graph);
}

mp_status_t mp_pool_graph_release(mp_pool_t *graph) {
  if (graph == NULL || !graph->graph)
    return mp__fail(MP_EINVAL, "mp_pool_graph_release: %p is not a graph pool",
                    (void *)graph);
  /* The ranges going back are frees in the parent's history: their stacks
   * start at this call's caller. */
  MP__HIST_ENTRY(graph->parent);
  return mp__graph_release(graph);
}

mp_status_t mp__graph_release(mp_pool_t *graph) {
  mp__pool_lock(graph);
  mp_status_t st = MP_OK;
  if (graph->released)
    st = mp__fail(MP_EINVAL, "mp_pool_graph_release: released already");
  else if (graph->ncapturing > 0)
    st = mp__fail(MP_EBUSY,
                  "mp_pool_graph_release: %u stream%s still allocate to it "
                  "(mp_pool_graph_end first)",
                  graph->ncapturing, graph->ncapturing == 1 ? "" : "s");
  else
    graph->released = true;
  /* A growth of graph in flight, in this thread (the parent's handler
   * releases) or another, borrows nothing more (mp__graph_gone_here). */
  if (st == MP_OK)
    atomic_store_explicit(&graph->graph_gone, true, memory_order_release);
  bool last = st == MP_OK && mp__graph_take_last(graph);
  mp__pool_unlock(graph);
  mp__graph_finish_if(graph, last);
  return st;
}
