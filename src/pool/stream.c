/* stream.c - stream-ordered reuse: the pool's stream table, epochs, marker
 * events and the event cache.
 *
 * Each stream the pool has seen has an open epoch. A block freed on stream S
 * gets the dep (S, epoch): work queued on S before the free belongs to that
 * epoch or an earlier one. S itself may reuse the block at once (its later
 * work runs after). Another stream may reuse it only once the epoch is done.
 * An epoch is closed by recording a marker event on S; when the marker
 * completes, every epoch up to it is done. A device synchronize completes
 * every epoch open when it began.
 *
 * Markers: a free records one on the block's stream (and on every stream
 * mp_pool_record_stream added) as soon as the pool has seen more than one
 * stream; a pool used from one stream only stays lazy and records a marker
 * when a second stream appears, when another stream wants a block of an
 * open epoch, or when the out-of-memory ladder reclaims. So a free+alloc
 * pair on one stream makes no device call at all, and a stream's idle
 * blocks become reusable by the others once its marker completed, never
 * held in a per-stream list.
 *
 * Stream waits (MP_POOL_STREAM_WAITS): a block whose deps are not done is
 * still handed to a stream T, after T is made to wait on the device for a
 * marker covering each dep (mp__deps_order); growth counts such blocks as
 * usable (mp__deps_orderable). When two free neighbours together name more
 * streams than a record holds, the pool's own join stream waits for all
 * their markers and one marker on it stands for them (mp__deps_join), so
 * they still merge. What a stream far behind cannot hold as a ninth marker
 * is folded into its newest (mp__stream_close). With these, which block
 * an allocation gets does not depend on how far the streams have run.
 *
 * Invariant: for every stream, done <= epoch and the markers' epochs rise
 * from head to tail; a dep (S, e) is satisfied exactly when e < S.done. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pool_internal.h"

mp_status_t mp__event_get(mp_pool_t *pool, mp_event_t *out) {
  if (pool->nevents > 0) {
    *out = pool->events[--pool->nevents];
    return MP_OK;
  }
  return mp_event_create(pool->dev, out);
}

void mp__event_put(mp_pool_t *pool, mp_event_t e) {
  mp_event_t *ev =
      mp__host_room(pool->events, &pool->events_cap, pool->nevents, sizeof *ev);
  if (ev == NULL) {
    mp_event_destroy(pool->dev, e);
    return;
  }
  pool->events = ev;
  pool->events[pool->nevents++] = e;
}

static void mp__stream_close(mp_pool_t *pool, mp__strm_t *st);
static void mp__stream_close_now(mp_pool_t *pool, mp__strm_t *st);
static bool mp__pt_register(mp_pool_t *pool);
static void mp__stream_poll(mp_pool_t *pool, mp__strm_t *st);
static bool mp__dep_done(const mp_pool_t *pool, const mp__dep_t *d);

_Static_assert(MP_POOL_FREE_AFTER_ALL_STREAMS == MP__MAX_DEPS,
               "pool.h promises what a block record holds");

/* ---- the handle table ---------------------------------------------------
 * Open addressing with linear probing and backward-shift deletion, as
 * src/ptrmap.c, but not on it (issue 15): the key is a pair (handle, owning
 * thread for per-thread default streams), not one address, and a slot holds
 * a 32-bit index into pool->streams, whose records the rebuild walks; on
 * ptrmap.c every entry would carry a copy of the key pair beside the record
 * that already holds it. */

/* The calling thread, for per-thread default streams: a number never given
 * to another thread (a reused TLS address would let a new thread inherit
 * an exited thread's unfinished stream). */
uint64_t mp__self(void) {
  static _Atomic uint64_t next = 1;
  static _Thread_local uint64_t self;
  if (MP__UNLIKELY(self == 0))
    self = atomic_fetch_add(&next, 1);
  return self;
}

static uint32_t mp__shash_at(const mp_pool_t *pool, mp_stream_t s,
                             uint64_t owner) {
  uint64_t k = ((uint64_t)(uintptr_t)s ^ (owner * 0x9e3779b97f4a7c15u)) *
               0xff51afd7ed558ccdu;
  return (uint32_t)(k >> 32) & (pool->shash_cap - 1);
}

/* sidx of (s, owner), or UINT32_MAX. */
static uint32_t mp__shash_find(const mp_pool_t *pool, mp_stream_t s,
                               uint64_t owner) {
  if (pool->shash_cap == 0)
    return UINT32_MAX;
  for (uint32_t i = mp__shash_at(pool, s, owner);;
       i = (i + 1) & (pool->shash_cap - 1)) {
    uint32_t v = pool->shash[i];
    if (v == 0)
      return UINT32_MAX;
    const mp__strm_t *st = &pool->streams[v - 1];
    if (st->s == s && st->owner == owner)
      return v - 1;
  }
}

static void mp__shash_put(mp_pool_t *pool, uint32_t sidx) {
  const mp__strm_t *st = &pool->streams[sidx];
  uint32_t i = mp__shash_at(pool, st->s, st->owner);
  while (pool->shash[i] != 0)
    i = (i + 1) & (pool->shash_cap - 1);
  pool->shash[i] = sidx + 1;
}

/* Room for one more entry at most half full; false: out of host memory. */
static bool mp__shash_reserve(mp_pool_t *pool, uint32_t live) {
  if ((uint64_t)(live + 1) * 2 <= pool->shash_cap)
    return true;
  uint32_t cap = pool->shash_cap ? pool->shash_cap * 2 : 16;
  uint32_t *h = mp__host_calloc(cap, sizeof *h);
  if (h == NULL)
    return false;
  free(pool->shash);
  pool->shash = h;
  pool->shash_cap = cap;
  for (uint32_t i = 0; i < pool->nstreams; i++)
    if (!pool->streams[i].gone)
      mp__shash_put(pool, i);
  return true;
}

static void mp__shash_remove(mp_pool_t *pool, uint32_t sidx) {
  uint32_t mask = pool->shash_cap - 1;
  const mp__strm_t *st = &pool->streams[sidx];
  uint32_t i = mp__shash_at(pool, st->s, st->owner);
  while (pool->shash[i] != sidx + 1)
    i = (i + 1) & mask;
  /* Backward shift: pull later entries of the run into the hole when their
   * home is at or before it. */
  for (uint32_t j = (i + 1) & mask; pool->shash[j] != 0; j = (j + 1) & mask) {
    const mp__strm_t *o = &pool->streams[pool->shash[j] - 1];
    uint32_t home = mp__shash_at(pool, o->s, o->owner);
    if (((j - home) & mask) >= ((j - i) & mask)) {
      pool->shash[i] = pool->shash[j];
      i = j;
    }
  }
  pool->shash[i] = 0;
}

/* A forgotten slot no block waits on and no live block names. */
static bool mp__slot_reusable(mp_pool_t *pool, mp__strm_t *st) {
  mp__stream_poll(pool, st);
  return st->refs == 0 && !st->dirty && st->nmarks == 0 &&
         st->done >= st->epoch;
}

/* The first reusable forgotten slot of gone[from, to), taken out of the
 * list into *out: true, or false when none is. */
static bool mp__slot_take(mp_pool_t *pool, uint32_t from, uint32_t to,
                          uint32_t *out) {
  for (uint32_t k = from; k < to; k++) {
    uint32_t i = pool->gone[k];
    if (mp__slot_reusable(pool, &pool->streams[i])) {
      pool->gone[k] = pool->gone[--pool->ngone];
      *out = i;
      return true;
    }
  }
  return false;
}

/* A slot for a new stream: a forgotten one whose work is all done (its
 * epoch counter carries on, so the deps of old free blocks stay done), or
 * a new one. Only a few forgotten slots are looked at per call; when none
 * of them will do, they go to the end of the list, so that the next call
 * looks at others. (The same first few were looked at every time: a live
 * block allocated on each of eight destroyed streams held the front for
 * good, and every later stream took a new slot until the table was full.)
 * A rare path: a stream's first use. */
static mp_status_t mp__slot_new(mp_pool_t *pool, uint32_t *out) {
  enum { LOOK = 8 };
  uint32_t look = pool->ngone < LOOK ? pool->ngone : LOOK;
  if (mp__slot_take(pool, 0, look, out))
    return MP_OK;
  /* A full table looks at every forgotten slot before it refuses, so that
   * the refusal says none will do: the turn below is made only for an add
   * that gets its slot. */
  if (pool->nstreams >= MP__MAX_STREAMS) {
    if (mp__slot_take(pool, look, pool->ngone, out))
      return MP_OK;
    return mp__fail(MP_ENOMEM,
                    "a pool serves at most %u streams at once (destroyed "
                    "streams count until their work is done)",
                    MP__MAX_STREAMS);
  }
  if (pool->nstreams == pool->streams_cap) {
    /* The forgotten list gets room for every slot, so that forgetting
     * never fails. */
    uint32_t cap = pool->streams_cap ? pool->streams_cap * 2 : 8;
    uint32_t *g = mp__host_realloc(pool->gone, cap * sizeof *g);
    if (g != NULL)
      pool->gone = g;
    mp__strm_t *st =
        g ? mp__host_realloc(pool->streams, cap * sizeof *st) : NULL;
    if (st == NULL)
      return mp__fail(MP_ENOMEM, "out of host memory for the stream table");
    pool->streams = st;
    pool->streams_cap = cap;
  }
  /* Only once the slot is sure: a refused add changes nothing (status.h);
   * the table refused (no host memory) after the turn. */
  if (pool->ngone > look) {
    uint32_t seen[LOOK];
    memcpy(seen, pool->gone, look * sizeof *seen);
    memmove(pool->gone, pool->gone + look,
            (pool->ngone - look) * sizeof *pool->gone);
    memcpy(pool->gone + pool->ngone - look, seen, look * sizeof *seen);
  }
  mp__strm_t *n = &pool->streams[pool->nstreams];
  memset(n, 0, sizeof *n);
  /* Epoch 0 is "before the pool knew the stream", so a sync snapshot of 0
   * (a stream added while a sync was in flight) completes nothing new. */
  n->epoch = n->done = 1;
  *out = pool->nstreams++;
  return MP_OK;
}

/* Closes stream sidx's open epoch when it has frees in it: done at once
 * when the stream is idle now (one query), else by a marker. A stream the
 * application has already waited for (cuStreamSynchronize) needs no
 * marker, and one recorded now would complete only when the device gets to
 * it: an allocation asking right after would find it pending and grow
 * instead of reusing (on the host device, until the stream's thread is
 * scheduled; a busy CI machine took more than the 200 us search_patiently
 * gives). */
static void mp__stream_settle(mp_pool_t *pool, uint32_t sidx) {
  mp__strm_t *st = &pool->streams[sidx];
  if (st->dirty && !mp__stream_idle_now(pool, sidx))
    mp__stream_close(pool, st);
}

mp_status_t mp__stream_check(mp_device_t *dev, mp_stream_t s) {
  return mp__device_stream_kind(dev, s) != MP__STREAM_BAD
             ? MP_OK
             : mp__fail(MP_EINVAL,
                        "stream %p is not a live stream of device "
                        "'%s'",
                        (void *)s, mp_device_name(dev));
}

static mp_status_t mp__stream_add(mp_pool_t *pool, mp_stream_t s,
                                  uint64_t owner, uint32_t *out) {
  mp__stream_kind_t kind = mp__device_stream_kind(pool->dev, s);
  if (kind == MP__STREAM_BAD)
    return mp__stream_check(pool->dev, s);
  if (kind == MP__STREAM_PER_THREAD && owner == 0)
    owner = mp__self();
  uint32_t live = pool->nstreams - pool->ngone;
  if (!mp__shash_reserve(pool, live))
    return mp__fail(MP_ENOMEM, "out of host memory for the stream table");
  uint32_t i = 0;
  mp_status_t st = mp__slot_new(pool, &i);
  if (st != MP_OK)
    return st;
  /* A second stream appears: blocks freed so far get their epochs closed
   * now, done at once where the stream is idle (with two or more, every
   * free closes its epoch at once). Once its slot is had: a refused add
   * changes nothing (it closed them first, and the table then refused).
   * Slot i, not yet the new stream's, is gone (reused) or clean (new):
   * settling it does nothing. */
  if (live == 1)
    for (uint32_t k = 0; k < pool->nstreams; k++)
      mp__stream_settle(pool, k);
  mp__strm_t *n = &pool->streams[i];
  uint64_t epoch = n->epoch, done = n->done;
  memset(n, 0, sizeof *n);
  n->s = s;
  n->owner = owner;
  n->epoch = epoch;
  n->done = done;
  mp__shash_put(pool, i);
  mp__stream_remember(pool, i);
  /* A thread's slot goes when the thread does (best effort: without host
   * memory it stays, as any stream the program never destroys). Once the
   * slot is had: a refused add changes nothing (status.h); it put the
   * pool in the process's list of pools with per-thread slots first. */
  if (owner != 0)
    (void)mp__pt_register(pool);
  /* Only once the slot is made: has_pt says a per-thread slot exists (an
   * add refused for host memory or a full table left it set, and every
   * later call took the rare path for a slot that never was). */
  if (kind == MP__STREAM_PER_THREAD) {
    pool->pt_handle = s;
    pool->has_pt = true;
    mp__pool_rare_update(pool);
  }
  *out = i;
  return MP_OK;
}

uint64_t mp__stream_owner(const mp_pool_t *pool, mp_stream_t s) {
  return MP__UNLIKELY(pool->has_pt && s == pool->pt_handle) ? mp__self() : 0;
}

mp_status_t mp__stream_lookup(mp_pool_t *pool, mp_stream_t s, uint32_t *out) {
  MP__ASSERT_LOCKED(pool);
  uint64_t owner = mp__stream_owner(pool, s);
  uint32_t i = pool->last_sidx;
  /* The last slot, unless another handle's or set aside (gone, its handle
   * kept: mp__stream_hide), which no call may match. */
  if (!(MP__LIKELY(i < pool->nstreams) && pool->streams[i].s == s &&
        pool->streams[i].owner == owner && !pool->streams[i].gone)) {
    i = mp__shash_find(pool, s, owner);
    if (i == UINT32_MAX)
      return mp__stream_add(pool, s, owner, out);
    mp__stream_remember(pool, i);
  }
  if (MP__UNLIKELY(pool->streams[i].want_close))
    mp__stream_close(pool, &pool->streams[i]); /* its owner, at last */
  pool->streams[i].mark_only = false; /* used (a mark's slot is not last_s) */
  *out = i;
  return MP_OK;
}

mp_status_t mp__stream_index_second(mp_pool_t *pool, mp_stream_t s,
                                    uint32_t *out) {
  MP__ASSERT_LOCKED(pool);
  uint64_t owner = mp__stream_owner(pool, s);
  uint32_t i = pool->second_sidx;
  /* The slot itself says whether it is still s's: a forgotten slot's
   * handle is MP__STREAM_GONE, a set-aside one is gone, and a slot that
   * matches neither is the one the hash maps s to. */
  const mp__strm_t *t = i < pool->nstreams ? &pool->streams[i] : NULL;
  if (!(t != NULL && t->s == s && t->owner == owner && !t->gone)) {
    i = mp__shash_find(pool, s, owner);
    if (i == UINT32_MAX)
      return mp__stream_lookup(pool, s, out); /* added, and remembered */
    pool->second_sidx = i;
  }
  if (MP__UNLIKELY(pool->streams[i].want_close))
    mp__stream_close(pool, &pool->streams[i]); /* its owner, at last */
  pool->streams[i].mark_only = false; /* used, as mp__stream_lookup's */
  *out = i;
  return MP_OK;
}

bool mp__stream_known(const mp_pool_t *pool, mp_stream_t s) {
  return mp__shash_find(pool, s, mp__stream_owner(pool, s)) != UINT32_MAX;
}

bool mp__stream_captured(const mp_pool_t *pool, mp_stream_t s) {
  uint32_t i = mp__shash_find(pool, s, mp__stream_owner(pool, s));
  return i != UINT32_MAX && pool->streams[i].capturing > 0;
}

mp_status_t mp__stream_index_owned(mp_pool_t *pool, mp_stream_t s,
                                   uint64_t owner, uint32_t *out) {
  MP__ASSERT_LOCKED(pool);
  uint32_t i = mp__shash_find(pool, s, owner);
  if (i == UINT32_MAX)
    return mp__stream_add(pool, s, owner, out);
  pool->streams[i].mark_only = false; /* used */
  *out = i;
  return MP_OK;
}

bool mp__stream_gone_done(mp_pool_t *pool, uint32_t i) {
  mp__strm_t *st = &pool->streams[i];
  mp__stream_poll(pool, st);
  return !st->dirty && st->done >= st->epoch;
}

static void mp__stream_use_slots(mp_pool_t *pool, mp__block_t *b,
                                 bool keep_marks) {
  for (uint32_t i = 0; i < pool->nstreams && !(b->flags & MP__B_MANY_USES);
       i++) {
    mp__strm_t *st = &pool->streams[i];
    if (st->join)
      continue; /* nothing of the application's runs on it */
    if (st->gone && mp__stream_gone_done(pool, i))
      continue;
    bool mark = st->mark_only;
    mp__stream_add_use(pool, b, i);
    if (keep_marks)
      st->mark_only = mark;
  }
}

void mp__stream_use_all(mp_pool_t *pool, mp__block_t *b) {
  mp__stream_use_slots(pool, b, false);
}

void mp__stream_use_all_released(mp_pool_t *pool, mp__block_t *b) {
  mp__stream_use_slots(pool, b, true);
}

void mp__stream_use_device(mp_pool_t *pool, mp__block_t *b) {
  /* Its deps stay (its release sets them): the sync adds to them, as for
   * a block whose streams did not fit its record. The sync that frees it
   * must cover streams pool has no slot for. */
  b->flags |= MP__B_SYNC;
  b->gen = pool->sync_gen;
  /* The latest generation owed: a device sync begun at or after it covers
   * every block owed before (a sync under way now began before it). */
  pool->sync_device_from = pool->sync_gen;
}

bool mp__stream_met_owned(const mp_pool_t *pool, mp_stream_t s,
                          uint64_t owner) {
  uint32_t i = mp__shash_find(pool, s, owner);
  return i != UINT32_MAX && !pool->streams[i].mark_only;
}

bool mp__stream_met(const mp_pool_t *pool, mp_stream_t s) {
  return mp__stream_met_owned(pool, s, mp__stream_owner(pool, s));
}

/* The route of a forgotten stream (slot st) in a parent's table of streams
 * that allocate to a graph pool (graph.c), if any, goes with its slot: no
 * later stream given the same handle is routed by it. Here, not in graph.c,
 * which stream.c does not call (pool_internal.h's layers). */
static void mp__stream_unroute(mp_pool_t *pool, const mp__strm_t *st) {
  if (st->reborn)
    return; /* went at the birth: the route of s now is the new stream's */
  for (size_t i = 0; i < pool->nroutes; i++)
    if (pool->routes[i].s == st->s && pool->routes[i].owner == st->owner) {
      pool->routes[i] = pool->routes[--pool->nroutes];
      mp__pool_rare_update(pool);
      return;
    }
}

/* Slot i matches no handle again; it is reused once its work is done
 * (mp__slot_new). */
static void mp__stream_unhash(mp_pool_t *pool, uint32_t i) {
  mp__strm_t *st = &pool->streams[i];
  mp__shash_remove(pool, i);
  st->mark_only = false;
  st->s = MP__STREAM_GONE;
  if (pool->last_sidx == i)
    pool->last_s = MP__STREAM_GONE;
  st->gone = true;
  pool->gone[pool->ngone++] = i;
}

/* A stream that allocates to a graph pool stops, its slot being forgotten
 * (as at mp_pool_graph_end, which could find neither slot by its handle
 * any more): each pool clears its own mark, the parent drops the route. */
static void mp__stream_uncapture(mp_pool_t *pool, mp__strm_t *st) {
  st->capture_only = false;
  if (st->capturing) {
    st->capturing = 0;
    pool->ncapturing--;
    mp__stream_unroute(pool, st);
    mp__pool_rare_update(pool); /* cached_off follows ncapturing */
  }
}

/* Forgets slot i: closes its epoch with a marker while the handle is
 * still valid, then never matches or records on it again. */
static void mp__stream_retire(mp_pool_t *pool, uint32_t i) {
  mp__strm_t *st = &pool->streams[i];
  mp__stream_uncapture(pool, st);
  /* Whatever was queued on it may still use blocks freed on it, or blocks
   * it allocated: close the epoch (without a marker it waits for a sync). */
  st->dirty = true;
  mp__stream_close(pool, st);
  mp__stream_unhash(pool, i);
}

/* What mp__stream_gone does with the stream it is told of, this thread's
 * forget only (mp_stream_forget tells every watcher on the caller's
 * thread): forget it (RETIRE), or, around the destroy of a stream being
 * captured, which the driver may refuse, set its slot aside (HIDE), then
 * give it back as it was (SHOW) or forget it with its handle dead (DROP). */
enum {
  MP__GONE_RETIRE,
  MP__GONE_CLOSE, /* a plain destroy's begin: RETIRE's marker, then HIDE */
  MP__GONE_HIDE,
  MP__GONE_SHOW,
  MP__GONE_DROP,
  MP__GONE_DROP_OVER,
  MP__GONE_DROP_CLOSED, /* a plain destroy's end: DROP, its epoch closed */
  MP__GONE_BORN
};
static _Thread_local int mp__gone_how;

/* Slot i set aside: matched by no handle and never recorded on or asked
 * (gone), but kept whole: its epoch, marks, capture marks and route, and
 * out of the forgotten list, so no new stream takes it. Its handle stays
 * in it, which tells it from a forgotten slot (MP__STREAM_GONE) and, once
 * a new stream may have the handle, from that stream's slot (hashed). */
static void mp__stream_hide(mp_pool_t *pool, uint32_t i) {
  mp__shash_remove(pool, i);
  pool->streams[i].gone = true;
  if (pool->last_sidx == i)
    pool->last_s = MP__STREAM_GONE;
}

/* Slot i before a destroy that is no capture's (mp__stream_destroy_begin):
 * its epoch closed with a marker while the handle is valid, as at a
 * retire, then set aside, so that a call naming the stream before the
 * driver answers gets a slot of its own, which the end forgets with the
 * handle (or, refused, forgets in favour of slot i). A slot marked
 * capturing is closed too, as the retire did after uncapturing it: the
 * driver says the stream is not capturing (mp__stream_close asks it
 * again), and the marks stay for a refusal to keep. */
static void mp__stream_close_hide(mp_pool_t *pool, uint32_t i) {
  mp__strm_t *st = &pool->streams[i];
  uint32_t capturing = st->capturing;
  st->dirty = true;
  st->capturing = 0;
  mp__stream_close(pool, st);
  st->capturing = capturing;
  mp__stream_hide(pool, i);
}

/* The open epoch of st, whose content never runs, counted done once the
 * epochs before it are: joined to the newest marker (stream order: its
 * point comes before), or done now where none is pending and every epoch
 * before is. False where a device sync in flight is still to cover
 * those. */
static bool mp__stream_never_runs(mp_pool_t *pool, mp__strm_t *st) {
  mp__stream_poll(pool, st);
  if (st->nmarks > 0)
    st->marks[(st->mark_head + st->nmarks - 1) % MP__MAX_MARKS].epoch =
        st->epoch;
  else if (st->done >= st->epoch)
    st->done = st->epoch + 1;
  else
    return false;
  st->epoch++;
  st->dirty = false;
  return true;
}

/* Set-aside slot i forgotten with its handle dead (destroyed): as
 * mp__stream_retire, without the marker, which no capturing stream can
 * take anyway (mp__stream_close): its open epoch waits for a device
 * synchronize. Unless the capture is over with the stream (DROP_OVER: it began
 * it; it ends without a graph, cuda.h: "Capture must be ended on the same
 * stream in which it was initiated") and the slot was marked with nothing
 * of its own open (capture_only): then its open epoch holds only captured
 * work, which never runs, and what the stream queued before the capture
 * is behind its earlier markers. */
static void mp__stream_drop(mp_pool_t *pool, uint32_t i, int how) {
  mp__strm_t *st = &pool->streams[i];
  bool captured =
      how == MP__GONE_DROP_OVER && st->capturing > 0 && st->capture_only;
  mp__stream_uncapture(pool, st);
  /* Closed by a marker before the destroy (mp__stream_close_hide): its
   * open epoch is empty, dirty still where no marker could be recorded. */
  if (how != MP__GONE_DROP_CLOSED &&
      (!captured || !mp__stream_never_runs(pool, st)))
    st->dirty = true;
  st->mark_only = false;
  st->s = MP__STREAM_GONE;
  pool->gone[pool->ngone++] = i;
}

/* Slot i, which its handle matched while the stream's slot was set aside
 * (a call that named the stream during its destroy made it), forgotten
 * without a marker: once the destroy succeeded no call may name the dead
 * handle, and once it was refused a marker would cover the blocks the
 * slot names only up to now, while the stream lives on and may still use
 * them. Its open epoch waits for a device synchronize where a block was
 * freed in it or a live block names it. Kept (false) while marked
 * capturing, the route of that capture to a graph pool going with the
 * slot: a destroy refused keeps the stream's newer slot then
 * (mp__stream_show); a destroy that went through uncaptures it first
 * (mp__stream_gone, mp__stream_reborn). */
static bool mp__stream_forget_met(mp_pool_t *pool, uint32_t i) {
  mp__strm_t *st = &pool->streams[i];
  if (st->capturing)
    return false;
  st->capture_only = false;
  st->dirty = st->dirty || st->refs != 0;
  mp__stream_unhash(pool, i);
  return true;
}

/* Set-aside slot i matched by its handle again, as before it was set
 * aside; forgotten instead if the table has no room. The handle lives on
 * (the destroy was refused), and slot i is what the pool knows of it: its
 * capture marks, with them the route of its capture to a graph pool, and
 * its blocks' epochs. So where a call named the stream during its destroy
 * and made it a slot of its own, that slot is the one forgotten
 * (mp__stream_forget_met). Slot i went before: the stream, still
 * captured, lost its route, allocated from the parent's cache, and
 * mp_pool_graph_end found none to end. Where that slot is marked
 * capturing, slot i goes, as before. */
static void mp__stream_show(mp_pool_t *pool, uint32_t i) {
  mp__strm_t *st = &pool->streams[i];
  uint32_t j = mp__shash_find(pool, st->s, st->owner);
  /* Reborn: the stream is dead whatever the driver said (a new stream has
   * its handle, and slot j is that stream's). */
  if (st->reborn || (j != UINT32_MAX && !mp__stream_forget_met(pool, j)) ||
      !mp__shash_reserve(pool, pool->nstreams - pool->ngone)) {
    mp__stream_drop(pool, i, MP__GONE_DROP);
    return;
  }
  st->gone = false;
  mp__shash_put(pool, i);
}

/* A new stream was given handle s (mp__stream_born), i its slot or
 * UINT32_MAX. Where a slot of s is set aside, the driver destroyed the
 * stream that had the handle, whatever its destroy is yet to answer: the
 * slot is marked reborn, and its capture's route goes now, so that the new
 * stream may begin one of its own. Slot i, made by a call that named the
 * dead stream during its destroy (the new stream's handle is not out
 * yet), is that stream's: forgotten as at the drop, capture marks and
 * all. From now on the slot the handle matches is the new stream's, and
 * the drop leaves it (mp__stream_gone): forgotten there, as before, the
 * blocks the new stream freed waited for a device synchronize, and a
 * stream the shim had added (cuStreamCreate, for mp_pool_free_after_all)
 * was known no more once that slot's work was done. */
static void mp__stream_reborn(mp_pool_t *pool, mp_stream_t s, uint32_t i) {
  bool aside = false;
  for (uint32_t k = 0; k < pool->nstreams; k++) {
    mp__strm_t *st = &pool->streams[k];
    if (k != i && st->gone && !st->reborn && st->s == s && st->owner == 0) {
      mp__stream_unroute(pool, st);
      st->reborn = aside = true;
    }
  }
  if (aside && i != UINT32_MAX) {
    mp__stream_uncapture(pool, &pool->streams[i]);
    (void)mp__stream_forget_met(pool, i);
  }
}

/* Whether a slot of s other than i is set aside with its handle reborn. */
static bool mp__stream_aside_reborn(const mp_pool_t *pool, mp_stream_t s,
                                    uint32_t i) {
  for (uint32_t k = 0; k < pool->nstreams; k++) {
    const mp__strm_t *st = &pool->streams[k];
    if (k != i && st->gone && st->reborn && st->s == s && st->owner == 0)
      return true;
  }
  return false;
}

void mp__stream_gone(void *ctx, mp_stream_t s) {
  mp_pool_t *pool = ctx;
  mp__pool_lock(pool);
  uint32_t i = mp__shash_find(pool, s, 0);
  if (mp__gone_how == MP__GONE_BORN) {
    mp__stream_reborn(pool, s, i);
    mp__pool_unlock(pool);
    return;
  }
  if (mp__gone_how == MP__GONE_RETIRE && i != UINT32_MAX)
    mp__stream_retire(pool, i);
  else if (mp__gone_how == MP__GONE_CLOSE && i != UINT32_MAX)
    mp__stream_close_hide(pool, i);
  else if (mp__gone_how == MP__GONE_HIDE && i != UINT32_MAX)
    mp__stream_hide(pool, i);
  else if (mp__gone_how >= MP__GONE_DROP && i != UINT32_MAX &&
           !mp__stream_aside_reborn(pool, s, i)) {
    /* Made by a call that named the dead stream during its destroy, with
     * whatever capture marks and route that call gave it: a new stream's
     * begin comes after its birth (mp__stream_born), and then the slot
     * is the new stream's. Kept while capturing, the dead stream's route
     * stayed matched to its handle: a new stream given that handle
     * allocated to the graph pool, and its own begin was refused. */
    mp__stream_uncapture(pool, &pool->streams[i]);
    (void)mp__stream_forget_met(pool, i); /* its handle died too */
  }
  for (uint32_t k = 0; mp__gone_how > MP__GONE_HIDE && k < pool->nstreams; k++)
    if (k != i && pool->streams[k].s == s && pool->streams[k].owner == 0) {
      if (mp__gone_how == MP__GONE_SHOW)
        mp__stream_show(pool, k);
      else
        mp__stream_drop(pool, k, mp__gone_how);
    }
  mp__pool_unlock(pool);
}

/* mp_stream_forget of s with mp__stream_gone doing how. */
static void mp__stream_forget_as(mp_device_t *dev, mp_stream_t s, int how) {
  mp__gone_how = how;
  (void)mp_stream_forget(dev, s);
  mp__gone_how = MP__GONE_RETIRE;
}

bool mp__stream_forget_keeps_handle(void) {
  return mp__gone_how == MP__GONE_HIDE || mp__gone_how == MP__GONE_SHOW;
}

void mp__stream_set_aside(mp_device_t *dev, mp_stream_t s) {
  mp__stream_forget_as(dev, s, MP__GONE_HIDE);
}

void mp__stream_set_aside_end(mp_device_t *dev, mp_stream_t s, bool destroyed,
                              bool over) {
  mp__stream_forget_as(dev, s,
                       !destroyed ? MP__GONE_SHOW
                       : over     ? MP__GONE_DROP_OVER
                                  : MP__GONE_DROP);
}

void mp__stream_destroy_begin(mp_device_t *dev, mp_stream_t s) {
  mp__stream_forget_as(dev, s, MP__GONE_CLOSE);
}

void mp__stream_destroy_end(mp_device_t *dev, mp_stream_t s, bool destroyed) {
  mp__stream_forget_as(dev, s,
                       destroyed ? MP__GONE_DROP_CLOSED : MP__GONE_SHOW);
}

/* Only the pools are told (no forget: torch.c's watcher would take the new
 * stream for a destroyed one, and a graph release would count a forget). */
void mp__stream_born(mp_device_t *dev, mp_stream_t s) {
  if (dev == NULL || s == NULL)
    return;
  mp__gone_how = MP__GONE_BORN;
  mp__device_watchers_tell(dev, mp__stream_gone, s);
  mp__gone_how = MP__GONE_RETIRE;
}

/* ---- per-thread default streams of threads that exit ------------------- */

/* The pools holding per-thread slots, told by a thread-exit destructor:
 * the exiting thread retires its own slot in each (it may still record on
 * its own per-thread stream). mp__pt_mu guards the list, its generation
 * and every pool's pt_pins, and is never held while a pool's lock is
 * taken, so a pool registers under its own lock (its first per-thread
 * slot, or a new arena given another thread's) with no inversion. (It was
 * held across the walk before, and a registration that found it busy gave
 * up: an arena, whose one thread brought no later slot, kept the slots of
 * exited threads for good.) The exiting thread pins a pool (pt_pins) while
 * it works on it without the list's lock, and destroy waits for the pins
 * to go; it walks the list again from the start whenever the generation
 * moved (a pool registered meanwhile may hold a copy of its slot,
 * mp__arena_make; one that left moved another in the list). */
static pthread_mutex_t mp__pt_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t mp__pt_unpinned = PTHREAD_COND_INITIALIZER;
static mp_pool_t **mp__pt_pools;
static size_t mp__pt_n, mp__pt_cap;
static uint64_t mp__pt_gen;
static pthread_key_t mp__pt_key;
static pthread_once_t mp__pt_once = PTHREAD_ONCE_INIT;
static bool mp__pt_key_ok;

static void mp__pt_thread_exit(void *unused) {
  (void)unused;
  uint64_t self = mp__self();
  pthread_mutex_lock(&mp__pt_mu);
  uint64_t gen = mp__pt_gen;
  for (size_t k = 0; k < mp__pt_n; k++) {
    mp_pool_t *pool = mp__pt_pools[k];
    pool->pt_pins++;
    pthread_mutex_unlock(&mp__pt_mu);
    mp__pool_lock(pool);
    uint32_t i = mp__shash_find(pool, pool->pt_handle, self);
    if (i != UINT32_MAX)
      mp__stream_retire(pool, i);
    mp__pool_unlock(pool);
    pthread_mutex_lock(&mp__pt_mu);
    if (--pool->pt_pins == 0)
      pthread_cond_broadcast(&mp__pt_unpinned);
    if (mp__pt_gen != gen) {
      gen = mp__pt_gen;
      k = (size_t)-1; /* from the start: retiring again finds nothing */
    }
  }
  pthread_mutex_unlock(&mp__pt_mu);
}

static void mp__pt_key_make(void) {
  mp__pt_key_ok = pthread_key_create(&mp__pt_key, mp__pt_thread_exit) == 0;
}

/* The calling thread will retire its per-thread slot in pool at exit.
 * Under pool->lock; false: out of host memory. */
static bool mp__pt_register(mp_pool_t *pool) {
  static _Thread_local bool armed;
  pthread_once(&mp__pt_once, mp__pt_key_make);
  if (!mp__pt_key_ok)
    return false;
  if (!armed)
    armed = pthread_setspecific(mp__pt_key, (void *)1) == 0;
  if (pool->pt_registered)
    return armed;
  pthread_mutex_lock(&mp__pt_mu);
  if (mp__pt_n == mp__pt_cap) {
    size_t cap = mp__pt_cap ? mp__pt_cap * 2 : 4;
    mp_pool_t **p = mp__host_realloc(mp__pt_pools, cap * sizeof *p);
    if (p == NULL) {
      pthread_mutex_unlock(&mp__pt_mu);
      return false;
    }
    mp__pt_pools = p;
    mp__pt_cap = cap;
  }
  mp__pt_pools[mp__pt_n++] = pool;
  mp__pt_gen++;
  pool->pt_registered = true;
  pthread_mutex_unlock(&mp__pt_mu);
  return armed;
}

/* Destroy: the pool leaves the registry (no pool lock held), once no
 * exiting thread works on it. */
static void mp__pt_unregister(mp_pool_t *pool) {
  if (!pool->pt_registered)
    return;
  pthread_mutex_lock(&mp__pt_mu);
  for (size_t k = 0; k < mp__pt_n; k++)
    if (mp__pt_pools[k] == pool) {
      mp__pt_pools[k] = mp__pt_pools[--mp__pt_n];
      mp__pt_gen++;
      break;
    }
  while (pool->pt_pins > 0)
    pthread_cond_wait(&mp__pt_unpinned, &mp__pt_mu);
  pthread_mutex_unlock(&mp__pt_mu);
  pool->pt_registered = false;
}

static void mp__stream_poll(mp_pool_t *pool, mp__strm_t *st) {
  while (st->nmarks > 0) {
    mp__marker_t *m = &st->marks[st->mark_head];
    if (mp_event_query(pool->dev, m->ev) != MP_OK)
      break;
    if (m->epoch + 1 > st->done)
      st->done = m->epoch + 1;
    mp__event_put(pool, m->ev);
    st->mark_head = (st->mark_head + 1) % MP__MAX_MARKS;
    st->nmarks--;
  }
}

/* Closes the open epoch by recording a marker; leaves it open when no event
 * can be had (the ladder's device sync still completes it). A forgotten
 * stream is never recorded on (its handle is dead); a per-thread default
 * stream only by its own thread (the handle names the caller's stream), so
 * another thread leaves a request its owner serves on its next call. */
static void mp__stream_close(mp_pool_t *pool, mp__strm_t *st) {
  /* A capturing stream: a marker recorded on it would be part of the graph
   * and never complete outside it (graph.c). */
  if (!st->dirty || st->gone || st->capturing)
    return;
  if (MP__UNLIKELY(st->owner != 0) && st->owner != mp__self()) {
    st->want_close = true;
    return;
  }
  /* A close that cannot be made leaves the epoch open, which a later
   * close or a synchronize covers: the call it serves (a free among them)
   * succeeds, so the caller's last error stays (status.h). */
  mp__error_kept_t kept;
  mp__error_keep(&kept);
  mp__stream_close_now(pool, st);
  mp__error_give_back(&kept);
}

/* mp__stream_close's device calls. */
static void mp__stream_close_now(mp_pool_t *pool, mp__strm_t *st) {
  if (st->nmarks == MP__MAX_MARKS)
    mp__stream_poll(pool, st);
  /* Nor one the application captures without telling the pool (a stream
   * that joined a capture through an event): the marker would be a node of
   * its graph, and asking about it would invalidate the capture. Nor one
   * whose capture state cannot be told (-1: the legacy stream while a
   * blocking stream captures, where work invalidates that capture). The
   * epoch stays open; a later close marks it. */
  if (MP__UNLIKELY(mp__device_stream_capturing(pool->dev, st->s) != 0))
    return;
  if (st->nmarks == MP__MAX_MARKS) {
    /* Every marker still pending (a stream far behind the host): record
     * the newest one again, here. It then stands for this epoch and the
     * one it closed before (stream order: its new point comes after that
     * epoch's work), so the open epoch is closed without a ninth event;
     * waits already made on its old point keep that point (cuStreamWait-
     * Event uses the record current at the call: cuda.h). */
    mp__marker_t *m =
        &st->marks[(st->mark_head + st->nmarks - 1) % MP__MAX_MARKS];
    if (mp_event_record(pool->dev, m->ev, st->s) != MP_OK)
      return;
    m->epoch = st->epoch;
    st->epoch++;
    st->dirty = false;
    st->want_close = false;
    return;
  }
  mp_event_t ev;
  if (mp__event_get(pool, &ev) != MP_OK)
    return;
  if (mp_event_record(pool->dev, ev, st->s) != MP_OK) {
    mp__event_put(pool, ev);
    return;
  }
  unsigned tail = (st->mark_head + st->nmarks) % MP__MAX_MARKS;
  st->marks[tail].ev = ev;
  st->marks[tail].epoch = st->epoch;
  st->nmarks++;
  st->epoch++;
  st->dirty = false;
  st->want_close = false;
}

/* dep on stream sidx for a free now. A forgotten stream gets no new work:
 * its last epoch is the one closed when it was forgotten. */
static void mp__dep_now(mp_pool_t *pool, mp__dep_t *d, uint32_t sidx) {
  mp__strm_t *st = &pool->streams[sidx];
  if (MP__UNLIKELY(st->gone)) {
    *d = mp__dep(sidx, st->dirty ? st->epoch : st->epoch - 1);
    return;
  }
  *d = mp__dep(sidx, st->epoch);
  st->dirty = true;
}

/* A live block's uses: epoch 0 (no epoch is 0) for a use until its free
 * (record_stream), else a copy's (defrag.c), which ends with that epoch
 * of its stream. */
static bool mp__use_copy_done(const mp_pool_t *pool, const mp__dep_t *d) {
  return mp__dep_epoch(*d) != 0 && mp__dep_done(pool, d);
}

/* The copies' uses of b that are done go: room for another use. */
static void mp__uses_prune(mp_pool_t *pool, mp__block_t *b) {
  for (uint32_t i = 0; i < b->ndeps;) {
    mp__strm_t *st = &pool->streams[mp__dep_sidx(b->deps[i])];
    mp__stream_poll(pool, st);
    if (mp__use_copy_done(pool, &b->deps[i])) {
      st->refs--;
      b->deps[i] = b->deps[--b->ndeps];
    } else {
      i++;
    }
  }
}

/* Stream sidx uses b until its free (epoch 0) or until its open epoch is
 * done (copy: a copy queued on it now). */
static void mp__stream_add_use_as(mp_pool_t *pool, mp__block_t *b,
                                  uint32_t sidx, bool copy) {
  MP__ASSERT_LOCKED(pool);
  if (sidx == b->sidx || (b->flags & MP__B_MANY_USES))
    return;
  /* A block of another stream used on sidx (a free there, record_stream):
   * work queued on sidx before a capture began may use it, so what sidx's
   * open epoch holds is no longer the capture's alone. */
  pool->streams[sidx].capture_only = false;
  mp__dep_t use = mp__dep(sidx, 0);
  if (copy)
    mp__dep_now(pool, &use, sidx); /* its epoch, the copy's */
  for (uint32_t i = 0; i < b->ndeps; i++)
    if (mp__dep_sidx(b->deps[i]) == sidx) {
      /* A use until the free stays one; a copy's ends later or never. */
      if (mp__dep_epoch(b->deps[i]) != 0)
        b->deps[i] = use;
      return;
    }
  if (b->ndeps + 1 == MP__MAX_DEPS)
    mp__uses_prune(pool, b);
  /* One dep slot stays for the block's own stream at the free. A use that
   * does not fit is not named: the block then waits for a device sync. */
  if (b->ndeps + 1 < MP__MAX_DEPS) {
    b->deps[b->ndeps++] = use;
    pool->streams[sidx].refs++;
    /* A use (mp_pool_free_after_all names every stream, a capture's mark
     * slot too): the slot is the pool's now, not only the mark's. */
    pool->streams[sidx].mark_only = false;
  } else {
    b->flags |= MP__B_MANY_USES;
  }
}

void mp__stream_add_use(mp_pool_t *pool, mp__block_t *b, uint32_t sidx) {
  mp__stream_add_use_as(pool, b, sidx, false);
}

void mp__stream_add_copy_use(mp_pool_t *pool, mp__block_t *b, uint32_t sidx) {
  mp__stream_add_use_as(pool, b, sidx, true);
}

void mp__stream_use_done(mp_pool_t *pool, mp__block_t *b, uint32_t sidx) {
  MP__ASSERT_LOCKED(pool);
  for (uint32_t i = 0; i < b->ndeps; i++)
    if (mp__dep_sidx(b->deps[i]) == sidx) {
      b->deps[i] = b->deps[--b->ndeps];
      pool->streams[sidx].refs--;
      return;
    }
}

void mp__stream_drop_uses(mp_pool_t *pool, mp__block_t *b) {
  MP__ASSERT_LOCKED(pool);
  for (uint32_t i = 0; i < b->ndeps; i++)
    pool->streams[mp__dep_sidx(b->deps[i])].refs--;
  b->ndeps = 0;
  b->flags &= ~(uint32_t)MP__B_MANY_USES;
}

void mp__deps_on_free_uses(mp_pool_t *pool, mp__block_t *b) {
  MP__ASSERT_LOCKED(pool);
  pool->streams[b->sidx].refs--;
  for (uint32_t i = 0; i < b->ndeps; i++)
    pool->streams[mp__dep_sidx(b->deps[i])].refs--;
  if (b->flags & MP__B_MANY_USES) {
    b->flags = (b->flags & ~(uint32_t)MP__B_MANY_USES) | MP__B_SYNC;
    b->gen = pool->sync_gen;
    b->ndeps = 0;
    /* Which streams used it is not known any more: every live one may
     * still have work on it, as a dep would say (mp__dep_now). A look at
     * which streams are idle (release_threshold, growth) asks the dirty
     * ones only, and with every stream clean it found them all idle and
     * completed the sync: the block went back to the device while a use
     * was still running. */
    for (uint32_t i = 0; i < pool->nstreams; i++)
      if (!pool->streams[i].gone)
        pool->streams[i].dirty = true;
    return;
  }
  mp__dep_t uses[MP__MAX_DEPS];
  uint32_t nuses = b->ndeps;
  for (uint32_t i = 0; i < nuses; i++)
    uses[i] = b->deps[i];
  mp__dep_now(pool, &b->deps[0], b->sidx);
  uint32_t n = 1;
  /* A use until the free: the stream's work so far; a copy's: its epoch,
   * unless done. */
  for (uint32_t i = 0; i < nuses && n < MP__MAX_DEPS; i++) {
    if (mp__dep_sidx(uses[i]) == b->sidx)
      continue;
    if (mp__dep_epoch(uses[i]) == 0)
      mp__dep_now(pool, &b->deps[n++], mp__dep_sidx(uses[i]));
    else if (!mp__dep_done(pool, &uses[i]))
      b->deps[n++] = uses[i];
  }
  b->ndeps = n;
  /* With one stream nobody else can want the block: stay lazy (no device
   * call). With several, close the epoch now so that the marker has
   * completed by the time another stream looks, but only where the stream
   * has no marker still unasked: one recorded at every free cost a device
   * call per free (cuEventRecord; on the host device a hand-off to the
   * stream's thread: the llama trace's frees took 1.4 us, its 3058 frees
   * recorded 3056 markers). While one is out, later frees join the open
   * epoch, which is closed when another stream asks about one of its
   * blocks (mp__deps_check settles it: done at once where the stream is
   * idle, else a marker then), at a sync or trim, or by the next free once
   * a look found the markers done. With stream_waits=1 every free still
   * closes its epoch: a stream made to wait for the block waits for the
   * marker recorded at its free, not for later work of the freeing
   * stream. So does every free on a per-thread default stream: only its
   * own thread can close its epoch (another leaves want_close), and a
   * thread that stops calling the pool would keep it open for good, its
   * finished frees of no use to the other streams. When the next free will
   * look for memory to give back (release_threshold; a free looks before
   * its own block is released, pool.c), the epoch is closed at once where
   * the stream is idle: that look asks the streams whether they are idle,
   * and a marker recorded here could still be pending then, keeping the
   * stream busy until the device reaches it, so the memory would stay
   * (every look, when frees come about as fast as the device takes a
   * record). */
  if (n > 1 || pool->nstreams > 1) {
    bool look = MP__UNLIKELY(pool->cfg.release_threshold != 0) &&
                mp__free_bytes(pool) > pool->cfg.release_threshold &&
                pool->st.free_count >= pool->release_next_free;
    bool every = (pool->cfg.flags & MP_POOL_STREAM_WAITS) != 0;
    for (uint32_t i = 0; i < n; i++) {
      mp__strm_t *st = &pool->streams[mp__dep_sidx(b->deps[i])];
      if (look)
        mp__stream_settle(pool, mp__dep_sidx(b->deps[i]));
      else if (every || st->nmarks == 0 || st->owner != 0)
        mp__stream_close(pool, st);
    }
  }
}

void mp__stream_capture_mark(mp_pool_t *pool, uint32_t sidx, bool on) {
  MP__ASSERT_LOCKED(pool);
  mp__strm_t *t = &pool->streams[sidx];
  if (on) {
    /* Settled while it may still be asked and recorded on. */
    if (t->capturing == 0) {
      mp__stream_settle(pool, sidx); /* t stays valid: no new slot */
      pool->ncapturing++;
      t->capture_only = t->refs == 0 && !t->dirty &&
                        mp__device_stream_capturing(pool->dev, t->s) == 1;
    }
    t->capturing++;
  } else if (t->capturing > 0 && --t->capturing == 0) {
    pool->ncapturing--;
    t->capture_only = false;
    /* The epoch the capture left open closes now (no marker could be
     * recorded meanwhile), so that by the time another stream asks about
     * what the capture freed, the marker has had time to complete. */
    mp__stream_close(pool, t);
  }
  mp__pool_rare_update(pool); /* cached_off follows ncapturing */
}

/* Slot i, which no live block names and with nothing of its own open,
 * matches no handle again, as if the pool had never met its stream: first
 * in the forgotten list, as mp__slot_new looks at only its first few. */
static void mp__stream_unmake_at(mp_pool_t *pool, uint32_t i) {
  MP__ASSERT(pool->streams[i].refs == 0);
  bool pt = pool->streams[i].owner != 0;
  mp__stream_unhash(pool, i);
  uint32_t *g = pool->gone, last = pool->ngone - 1;
  uint32_t first = g[0];
  g[0] = g[last];
  g[last] = first;
  /* Another thread's per-thread stream was the only one: the pool's path
   * without per-thread slots again (has_pt makes every free take the
   * rare path). */
  if (pt) {
    bool any = false;
    for (uint32_t k = 0; k < pool->nstreams && !any; k++)
      any = !pool->streams[k].gone && pool->streams[k].owner != 0;
    pool->has_pt = any;
    mp__pool_rare_update(pool);
  }
}

mp_status_t mp__stream_capture_mark_owned(mp_pool_t *pool, mp_stream_t s,
                                          uint64_t owner, bool on, bool carry) {
  MP__ASSERT_LOCKED(pool);
  uint32_t i = mp__shash_find(pool, s, owner);
  if (i == UINT32_MAX) {
    if (!on)
      return MP_OK;
    mp_status_t st = mp__stream_add(pool, s, owner, &i);
    if (st != MP_OK)
      return st;
    pool->streams[i].mark_only = carry;
    /* Every use of the slot then goes through a lookup, which clears
     * mark_only: the last-stream shortcut (mp__stream_index_as) does not
     * lead to it. */
    if (carry && pool->last_sidx == i)
      pool->last_s = MP__STREAM_GONE;
  }
  mp__stream_capture_mark(pool, i, on);
  mp__strm_t *t = &pool->streams[i];
  /* Still marked, or used since it was added (a lookup cleared mark_only:
   * an allocation, a free or record_stream on it, mp_pool_add_stream): it
   * stays, as any stream the pool met. */
  if (on || t->capturing > 0 || !t->mark_only)
    return MP_OK;
  t->mark_only = false;
  /* Its epoch holds a released range's work (mp__stream_use_all_released)
   * and the unmark could record no marker to close it (no event, the
   * stream captured again, another thread's per-thread stream): the slot
   * stays, a stream the pool met, so that a later close or idle look
   * completes that work. Forgotten, nothing would ever ask it again, and
   * only a device synchronize outside every capture would free the
   * range. */
  if (t->dirty)
    return MP_OK;
  /* What a free after all streams made wait for it meanwhile waits for
   * the marker its unmark recorded (as after a forget). */
  mp__stream_unmake_at(pool, i);
  return MP_OK;
}

bool mp__stream_unmake(mp_pool_t *pool, mp_stream_t s) {
  MP__ASSERT_LOCKED(pool);
  uint32_t i = mp__shash_find(pool, s, mp__stream_owner(pool, s));
  if (i == UINT32_MAX)
    return false;
  const mp__strm_t *t = &pool->streams[i];
  /* Used meanwhile (another thread's call on s): a block allocated on it
   * or using it, a free on it, a marker, a capture mark; or a call that
   * relies on it is in flight (pins). Kept, as any stream the pool met. */
  if (t->refs != 0 || t->dirty || t->nmarks != 0 || t->capturing != 0 ||
      t->join || t->pins != 0)
    return false;
  mp__stream_unmake_at(pool, i);
  return true;
}

int mp__stream_pin(mp_pool_t *pool, mp_stream_t s, bool made, uint64_t *pin) {
  MP__ASSERT_LOCKED(pool);
  uint32_t i = mp__shash_find(pool, s, mp__stream_owner(pool, s));
  if (i == UINT32_MAX)
    return -1;
  mp__strm_t *t = &pool->streams[i];
  if (made) {
    t->fresh = true;
    t->fresh_id = ++pool->fresh_ids;
  }
  if (!t->fresh)
    return 0;
  t->pins++;
  *pin = t->fresh_id;
  return 1;
}

bool mp__stream_unpin(mp_pool_t *pool, mp_stream_t s, uint64_t pin,
                      bool served) {
  MP__ASSERT_LOCKED(pool);
  uint32_t i = mp__shash_find(pool, s, mp__stream_owner(pool, s));
  /* Forgotten meanwhile (the program destroyed s during the call): the
   * slot s has now, if any, is not the one pinned, and its pins are other
   * calls' (made fresh again by one of them: another fresh_id). */
  if (i == UINT32_MAX || pool->streams[i].pins == 0 ||
      pool->streams[i].fresh_id != pin)
    return false;
  mp__strm_t *t = &pool->streams[i];
  t->pins--;
  if (served)
    t->fresh = false;
  if (t->pins != 0 || !t->fresh)
    return false;
  t->fresh = false; /* kept where something else used it: settled */
  return mp__stream_unmake(pool, s);
}

static bool mp__dep_done(const mp_pool_t *pool, const mp__dep_t *d) {
  return mp__dep_epoch(*d) < pool->streams[mp__dep_sidx(*d)].done;
}

/* The marker of st whose completion means epoch e is done: the first one
 * recorded when an epoch >= e closed (markers complete in stream order, so
 * a later one covers e too), or NULL. */
static const mp__marker_t *mp__marker_covering(const mp__strm_t *st,
                                               uint64_t e) {
  for (unsigned k = 0; k < st->nmarks; k++) {
    const mp__marker_t *m = &st->marks[(st->mark_head + k) % MP__MAX_MARKS];
    if (m->epoch >= e)
      return m;
  }
  return NULL;
}

/* The union of a's and b's unfinished deps, latest epoch per stream, into
 * out; false when it needs more than MP__MAX_DEPS entries. */
static bool mp__deps_union(const mp_pool_t *pool, const mp__block_t *a,
                           const mp__block_t *b, mp__dep_t *out,
                           uint32_t *nout) {
  uint32_t n = 0;
  const mp__block_t *src[2] = {a, b};
  for (int k = 0; k < 2; k++) {
    for (uint32_t i = 0; i < src[k]->ndeps; i++) {
      const mp__dep_t *d = &src[k]->deps[i];
      if (mp__dep_done(pool, d))
        continue;
      uint32_t j = 0;
      while (j < n && mp__dep_sidx(out[j]) != mp__dep_sidx(*d))
        j++;
      if (j < n) {
        if (mp__dep_epoch(out[j]) < mp__dep_epoch(*d))
          out[j] = *d; /* the same stream */
      } else if (n < MP__MAX_DEPS) {
        out[n++] = *d;
      } else {
        return false;
      }
    }
  }
  *nout = n;
  return true;
}

/* The join stream's slot in the stream table, made on first use. A stream
 * the table cannot take yet is kept for the next try: destroying it here
 * would tell every pool's watcher (mp_stream_forget), this pool's too,
 * whose lock is held. mp__streams_release destroys it. */
static bool mp__join_index(mp_pool_t *pool, uint32_t *out) {
  if (pool->join == NULL) {
    mp_stream_t s;
    if (mp_stream_create(pool->dev, &s) != MP_OK)
      return false;
    pool->join = s;
  }
  if (mp__stream_index(pool, pool->join, out) != MP_OK)
    return false;
  pool->streams[*out].join = true;
  return true;
}

/* The unfinished deps of blocks a and b (b may be NULL), but those on
 * stream skip, each with a marker (open epochs closed): calls fn (if any)
 * on each marker; false when one has none (a capturing stream, or no
 * event to be had) or fn says so. */
typedef bool (*mp__marker_fn)(mp_pool_t *pool, const mp__marker_t *m,
                              void *ctx);
static bool mp__each_marker(mp_pool_t *pool, const mp__block_t *a,
                            const mp__block_t *b, uint32_t skip,
                            mp__marker_fn fn, void *ctx) {
  const mp__block_t *blk[2] = {a, b};
  for (int k = 0; k < 2 && blk[k] != NULL; k++)
    for (uint32_t i = 0; i < blk[k]->ndeps; i++) {
      const mp__dep_t *d = &blk[k]->deps[i];
      if (mp__dep_sidx(*d) == skip || mp__dep_done(pool, d))
        continue;
      mp__strm_t *st = &pool->streams[mp__dep_sidx(*d)];
      if (st->capturing)
        return false;
      if (mp__dep_epoch(*d) == st->epoch)
        mp__stream_close(pool, st);
      if (mp__dep_done(pool, d))
        continue;
      const mp__marker_t *m = mp__marker_covering(st, mp__dep_epoch(*d));
      if (m == NULL || (fn != NULL && !fn(pool, m, ctx)))
        return false;
    }
  return true;
}

/* mp__marker_fn: the stream *ctx waits on the device for marker m. */
static bool mp__stream_wait(mp_pool_t *pool, const mp__marker_t *m, void *ctx) {
  return mp_stream_wait_event(pool->dev, *(mp_stream_t *)ctx, m->ev) == MP_OK;
}

/* MP_POOL_STREAM_WAITS, when dst and src together wait for more streams
 * than a record holds: the pool's join stream waits on the device for
 * every one of their markers, and a marker recorded on it after those
 * waits stands for all of them, so that dst can take src in. No
 * application stream gets a new dependency, and the host never waits.
 * False, dst unchanged (waits already made only hold the join stream),
 * when a dep has no marker or a device call fails. */
static bool mp__deps_join_now(mp_pool_t *pool, mp__block_t *dst,
                              const mp__block_t *src) {
  uint32_t j;
  if (!mp__join_index(pool, &j))
    return false;
  /* Markers first for all, so that nothing is waited on unless all can
   * be; the table may have grown (a new join slot): take pointers now. */
  if (!mp__each_marker(pool, dst, src, UINT32_MAX, NULL, NULL))
    return false;
  mp_stream_t js = pool->join;
  if (!mp__each_marker(pool, dst, src, UINT32_MAX, mp__stream_wait, &js))
    return false;
  mp__strm_t *jst = &pool->streams[j];
  uint64_t e = jst->epoch;
  jst->dirty = true;
  mp__stream_close(pool, jst);
  if (jst->epoch == e)
    return false; /* no marker on the join stream: it stays dirty */
  dst->deps[0] = mp__dep(j, e);
  dst->ndeps = 1;
  return true;
}

/* mp__deps_join_now where the pool joins streams. Refused (no join stream
 * or slot: a full table; a marker or a wait refused), the caller goes on
 * without (a later sync), so the refusal is not its last error
 * (status.h). */
static bool mp__deps_join(mp_pool_t *pool, mp__block_t *dst,
                          const mp__block_t *src) {
  if (!(pool->cfg.flags & MP_POOL_STREAM_WAITS) ||
      ((dst->flags | src->flags) & MP__B_SYNC))
    return false;
  mp__error_kept_t kept;
  mp__error_keep(&kept);
  bool joined = mp__deps_join_now(pool, dst, src);
  if (!joined)
    mp__error_give_back(&kept);
  return joined;
}

/* mp__deps_try_union without the device-sync question: also the forced
 * merge's (mp__deps_merge), whose block takes the later sync. */
static bool mp__deps_union_into(mp_pool_t *pool, mp__block_t *dst,
                                const mp__block_t *src) {
  mp__dep_t u[MP__MAX_DEPS];
  uint32_t n;
  if (!mp__deps_union(pool, dst, src, u, &n)) {
    /* Too many streams pending: ask their markers, then try once more. */
    for (uint32_t i = 0; i < dst->ndeps; i++)
      mp__stream_poll(pool, &pool->streams[mp__dep_sidx(dst->deps[i])]);
    for (uint32_t i = 0; i < src->ndeps; i++)
      mp__stream_poll(pool, &pool->streams[mp__dep_sidx(src->deps[i])]);
    if (!mp__deps_union(pool, dst, src, u, &n))
      return mp__deps_join(pool, dst, src);
  }
  if (src->flags & MP__B_SYNC) {
    if (!(dst->flags & MP__B_SYNC) || dst->gen < src->gen)
      dst->gen = src->gen;
    dst->flags |= MP__B_SYNC;
  }
  memcpy(dst->deps, u, n * sizeof u[0]);
  dst->ndeps = n;
  return true;
}

__attribute__((noinline)) bool
mp__deps_try_union(mp_pool_t *pool, mp__block_t *dst, const mp__block_t *src) {
  /* The plain free's merge (block.c, mp__coalesce without the streams'
   * question) meets a neighbour waiting for a device sync only here. Not
   * inlined: in the unity build the free's merge took it in and a pair
   * cost one instruction more (363.2 / 323.8 against 362.2 / 322.8,
   * count_pairs.sh). */
  if (mp__sync_apart(pool, dst, src)) {
    mp__sync_apart_note(pool, dst, src);
    return false;
  }
  return mp__deps_union_into(pool, dst, src);
}

bool mp__deps_merge(mp_pool_t *pool, mp__block_t *dst, const mp__block_t *src) {
  if (mp__sync_apart(pool, dst, src) ? mp__deps_union_into(pool, dst, src)
                                     : mp__deps_try_merge(pool, dst, src))
    return true;
  /* More streams than a record holds: wait for the next device sync. Keep
   * the deps too, so nothing is forgotten if the flag is cleared first. */
  dst->flags |= MP__B_SYNC;
  dst->gen = pool->sync_gen;
  return true;
}

bool mp__deps_check(mp_pool_t *pool, mp__block_t *b, uint32_t sidx, bool poll) {
  if (b->flags & MP__B_SYNC) {
    if (b->gen >= pool->sync_done)
      return false;
    b->flags &= ~(uint32_t)MP__B_SYNC;
  }
  bool safe = true;
  uint32_t n = 0;
  for (uint32_t i = 0; i < b->ndeps; i++) {
    mp__dep_t *d = &b->deps[i];
    if (mp__dep_sidx(*d) != sidx && !mp__dep_done(pool, d)) {
      if (poll) {
        mp__strm_t *st = &pool->streams[mp__dep_sidx(*d)];
        if (mp__dep_epoch(*d) == st->epoch)
          mp__stream_settle(pool, mp__dep_sidx(*d));
        mp__stream_poll(pool, st);
      }
      if (!mp__dep_done(pool, d))
        safe = false;
    }
    if (!mp__dep_done(pool, d))
      b->deps[n++] = *d;
  }
  b->ndeps = n;
  return safe;
}

bool mp__deps_pending(const mp_pool_t *pool, const mp__block_t *b) {
  if (mp__sync_pending(pool, b))
    return true;
  uint32_t first = UINT32_MAX;
  for (uint32_t i = 0; i < b->ndeps; i++) {
    if (mp__dep_done(pool, &b->deps[i]))
      continue;
    if (first == UINT32_MAX)
      first = mp__dep_sidx(b->deps[i]);
    else if (mp__dep_sidx(b->deps[i]) != first)
      return true;
  }
  return false;
}

bool mp__deps_orderable(mp_pool_t *pool, const mp__block_t *b, uint32_t sidx) {
  const mp__strm_t *me = &pool->streams[sidx];
  if ((b->flags & MP__B_SYNC) || me->gone || me->capturing)
    return false;
  bool asked = false; /* whether me's capture state was asked */
  for (uint32_t i = 0; i < b->ndeps; i++) {
    const mp__dep_t *d = &b->deps[i];
    if (mp__dep_sidx(*d) == sidx || mp__dep_done(pool, d))
      continue;
    const mp__strm_t *st = &pool->streams[mp__dep_sidx(*d)];
    if (st->capturing)
      return false;
    /* The same conditions as mp__deps_order's, but for an event: an open
     * epoch gets its marker when the block is taken, unless its stream is
     * gone, another thread's per-thread stream, or captured unawares. */
    if (mp__dep_epoch(*d) == st->epoch
            ? st->gone || (st->owner != 0 && st->owner != mp__self()) ||
                  mp__device_stream_capturing(pool->dev, st->s) != 0
            : mp__marker_covering(st, mp__dep_epoch(*d)) == NULL)
      return false;
    if (!asked && mp__device_stream_capturing(pool->dev, me->s) != 0)
      return false;
    asked = true;
  }
  return true;
}

bool mp__deps_order(mp_pool_t *pool, mp__block_t *b, uint32_t sidx) {
  MP__ASSERT_LOCKED(pool);
  mp__strm_t *me = &pool->streams[sidx];
  /* A block waiting for a device sync names no marker; a capturing stream
   * may not wait on an event recorded outside its capture (nor may one the
   * application captures without telling the pool). */
  if ((b->flags & MP__B_SYNC) || me->gone || me->capturing ||
      mp__device_stream_capturing(pool->dev, me->s) != 0)
    return false;
  /* First every unfinished dep gets a marker (closing an open epoch), so
   * that nothing is waited on unless everything can be. A failed wait
   * leaves the waits made so far: only extra ordering. */
  mp_stream_t s = me->s;
  return mp__each_marker(pool, b, NULL, sidx, NULL, NULL) &&
         mp__each_marker(pool, b, NULL, sidx, mp__stream_wait, &s);
}

void mp__streams_poll(mp_pool_t *pool, bool close) {
  for (uint32_t i = 0; i < pool->nstreams; i++) {
    if (close)
      mp__stream_settle(pool, i);
    mp__stream_poll(pool, &pool->streams[i]);
  }
}

/* mp__streams_sync_begin; partial (mp__pool_sync_partial): the streams it
 * keeps out stay as they are, and no device-sync generation begins. */
static uint64_t mp__sync_begin_as(mp_pool_t *pool, bool partial) {
  for (uint32_t i = 0; i < pool->nstreams; i++) {
    mp__strm_t *st = &pool->streams[i];
    if (partial && st->sync_keep) {
      st->sync_owed = false;
      continue;
    }
    /* A forgotten stream's last frees have epoch - 1 (mp__dep_now) unless
     * it is dirty: owed while that is not done. */
    st->sync_owed = st->gone && (st->dirty || st->done < st->epoch);
    st->sync_snap = st->epoch++;
    st->dirty = false;
  }
  return partial ? pool->sync_gen : pool->sync_gen++;
}

uint64_t mp__streams_sync_begin(mp_pool_t *pool) {
  return mp__sync_begin_as(pool, false);
}

void mp__streams_sync_failed(mp_pool_t *pool) {
  /* The epochs stay advanced: a later marker, or sync, covers the closed
   * one too. Streams forgotten during the wait have sync_owed false and
   * their own marks (mp__stream_retire). */
  for (uint32_t i = 0; i < pool->nstreams; i++) {
    mp__strm_t *st = &pool->streams[i];
    if (st->sync_owed)
      st->dirty = true;
    st->sync_owed = false;
  }
}

/* mp__streams_sync_end; partial: no device-sync generation is done (a
 * captured stream's open epoch, and a stream kept out, were not waited
 * for), the streams counted done up to their sync_snap. */
static void mp__sync_end_as(mp_pool_t *pool, uint64_t snap, bool partial) {
  /* Streams added while the lock was dropped have sync_snap 0: harmless. */
  for (uint32_t i = 0; i < pool->nstreams; i++) {
    mp__strm_t *st = &pool->streams[i];
    if (st->sync_snap + 1 > st->done)
      st->done = st->sync_snap + 1;
    mp__stream_poll(pool, st);
  }
  if (partial)
    return;
  if (snap + 1 > pool->sync_done)
    pool->sync_done = snap + 1;
  /* That sync began after the owed generation: it was a device one. */
  if (pool->sync_device_from != 0 && snap >= pool->sync_device_from)
    pool->sync_device_from = 0;
}

void mp__streams_sync_end(mp_pool_t *pool, uint64_t snap) {
  mp__sync_end_as(pool, snap, false);
}

bool mp__streams_owe_device(const mp_pool_t *pool) {
  if (pool->sync_device_from != 0)
    return true;
  for (uint32_t i = 0; i < pool->nstreams; i++) {
    const mp__strm_t *st = &pool->streams[i];
    if (st->gone && st->dirty && !st->capturing)
      return true;
  }
  return false;
}

/* MP_OK unless a device synchronize is owed while a capture the device can
 * see runs, on any stream, the pool's or not, by any thread. A
 * cuCtxSynchronize waits for every stream of the context: during a capture
 * of any of them it is refused and invalidates the capture, whatever the
 * modes (CUDA Programming Guide, "Prohibited and Unhandled Operations";
 * src/device/cuda.c, mp__cuda_capture_seen). Refused too where the device
 * cannot say (-1); the debt is kept for a later call. A non-blocking stream
 * the program made itself and never named to the device goes unseen. */
static mp_status_t mp__streams_device_unwaitable(const mp_pool_t *pool,
                                                 const char *what) {
  if (!mp__streams_owe_device(pool))
    return MP_OK;
  mp_stream_t which = NULL;
  int cap = mp__device_capture_seen(pool->dev, NULL, &which);
  if (cap == -2)
    return mp__fail(MP_EDRIVER, "no %s: %s", what, mp_last_error());
  if (cap == 0)
    return MP_OK;
  return mp__fail(MP_EBUSY,
                  "no %s while a stream of the device is being captured (%p; "
                  "NULL: a blocking stream, as the legacy stream says), or "
                  "the device cannot say: the pool owes a device synchronize "
                  "(for streams it could not mark), which would invalidate "
                  "the capture; it stays owed for a later call",
                  what, (void *)which);
}

/* mp__streams_unwaitable's look at the streams themselves (no device
 * synchronize owed asked about). */
static mp_status_t mp__streams_live_unwaitable(const mp_pool_t *pool,
                                               const char *what) {
  uint64_t self = mp__self();
  bool others = false; /* another thread's per-thread stream: the legacy one */
  for (uint32_t i = 0; i <= pool->nstreams; i++) {
    mp_stream_t s = NULL; /* past the table: the legacy stream, if needed */
    if (i < pool->nstreams) {
      const mp__strm_t *st = &pool->streams[i];
      if (st->gone || st->capturing)
        continue;
      if (st->owner != 0 && st->owner != self) {
        others = true;
        continue;
      }
      s = st->s;
    } else if (!others) {
      break;
    }
    int cap = mp__device_stream_capturing(pool->dev, s);
    if (cap == -2) /* the driver's own failure, not a capture */
      return mp__fail(MP_EDRIVER, "no %s: %s", what, mp_last_error());
    if (cap != 0)
      return mp__fail(MP_EBUSY,
                      "no %s while stream %p is captured without the pool's "
                      "knowledge, or is the legacy stream while a blocking "
                      "stream captures: an event there would invalidate the "
                      "capture",
                      what, (void *)s);
  }
  return MP_OK;
}

mp_status_t mp__streams_unwaitable(const mp_pool_t *pool, const char *what) {
  mp_status_t dst = mp__streams_device_unwaitable(pool, what);
  return dst != MP_OK ? dst : mp__streams_live_unwaitable(pool, what);
}

/* The last marker of each forgotten stream into set (the others back to
 * the cache): its work is behind it. Only once the set is whole, so that a
 * set given up on (a device synchronize instead, or a refusal) took none.
 * The slot is dirty from here on: owed a device synchronize unless a sync
 * that waited for the set completes (mp__streams_sync_begin clears it,
 * mp__streams_sync_end counts it done, mp__streams_sync_failed owes it
 * again). A caller whose wait fails without a sync begun (a destroy from a
 * host function, which leaves the pool as it was) gave the marker back to
 * the cache, and without the mark the slot, no marker left and nothing
 * owed, was counted done by the next sync, which waited for the live
 * streams only: a block freed on it went to another stream while its
 * work was still queued. */
static void mp__streams_take_gone_marks(mp_pool_t *pool, mp__sync_set_t *set) {
  for (uint32_t i = 0; i < pool->nstreams; i++) {
    mp__strm_t *st = &pool->streams[i];
    if (!st->gone || st->capturing || st->nmarks == 0 ||
        (set->partial && st->sync_keep))
      continue;
    for (unsigned k = 0; k < st->nmarks; k++) {
      mp__marker_t *m = &st->marks[(st->mark_head + k) % MP__MAX_MARKS];
      if (k + 1 == st->nmarks)
        set->ev[set->n++] = m->ev;
      else
        mp__event_put(pool, m->ev);
    }
    st->nmarks = 0;
    st->dirty = true;
  }
}

/* A partial sync's captured stream st: its epochs stay (the open one holds
 * what the capture freed, which only a replay may use), and the newest
 * marker recorded on it joins the wait, by a device wait of the join
 * stream js on it. That marker was recorded before the capture began (none
 * is recorded on a captured stream: mp__stream_close), so it is no node of
 * the graph, and a wait on it neither records on nor queries the captured
 * stream; cuStreamWaitEvent waits for the record current at the call
 * (cuda.h), which a later record of the same marker does not change. */
static void mp__sync_keep_captured(mp_pool_t *pool, mp__strm_t *st,
                                   mp_stream_t js) {
  st->sync_keep = true;
  if (st->nmarks == 0 || js == NULL)
    return;
  const mp__marker_t *m =
      &st->marks[(st->mark_head + st->nmarks - 1) % MP__MAX_MARKS];
  if (mp__stream_wait(pool, m, &js))
    st->sync_snap = m->epoch;
}

/* mp__streams_sync_events, or (partial) mp__pool_sync_partial's events:
 * there a stream no event can mark is kept out of the sync (sync_keep)
 * instead of giving up for a device synchronize, and a captured stream's
 * newest marker is waited for through the join stream. */
static bool mp__sync_events_as(mp_pool_t *pool, mp__sync_set_t *set,
                               bool partial) {
  set->n = 0;
  set->partial = partial;
  if (!partial && pool->sync_device_from != 0) { /* mp__stream_use_device */
    set->ev = NULL;
    return false;
  }
  /* The join slot first, where a captured stream has a marker to wait
   * for: made now, it may move the table. */
  bool marked = false;
  for (uint32_t i = 0; partial && i < pool->nstreams && !marked; i++)
    marked = pool->streams[i].capturing && pool->streams[i].nmarks > 0;
  uint32_t j = UINT32_MAX;
  if (marked && !mp__join_index(pool, &j))
    j = UINT32_MAX;
  /* False, the caller falls back to a device synchronize (or refuses
   * with a why of its own): the refusals met here are not the caller's
   * last error (status.h). */
  mp__error_kept_t kept;
  mp__error_keep(&kept);
  set->ev = mp__host_alloc((pool->nstreams + 1) * sizeof *set->ev);
  if (set->ev == NULL)
    return false;
  /* The captured streams' waits before the join stream's own event, which
   * then stands for them. A stream kept out counts nothing done (sync_snap
   * 0) unless its marker is waited for: an earlier sync's snapshot, one
   * that failed among them (mp__streams_sync_failed), was never waited
   * for. The others get theirs from mp__streams_sync_begin. */
  for (uint32_t i = 0; partial && i < pool->nstreams; i++) {
    pool->streams[i].sync_keep = false;
    pool->streams[i].sync_snap = 0;
    if (pool->streams[i].capturing)
      mp__sync_keep_captured(pool, &pool->streams[i],
                             j != UINT32_MAX ? pool->streams[j].s : NULL);
  }
  uint64_t self = mp__self();
  bool legacy = false; /* an event on the legacy stream is in the set */
  for (uint32_t i = 0; i < pool->nstreams; i++) {
    mp__strm_t *st = &pool->streams[i];
    /* A capturing stream cannot be waited for (an event recorded on it
     * would be a node of the graph): mp__pool_sync and pause refuse to run
     * while one is; destroy goes on without it. */
    if (st->capturing)
      continue;
    if (st->gone) {
      /* Its work is behind its last marker (FIFO on one stream), taken
       * below once every live stream has its event; without one (closing
       * failed) only a device synchronize covers it. */
      if (st->dirty && !partial)
        goto device;
      st->sync_keep = st->dirty; /* partial: kept out */
      continue;
    }
    /* Another thread's per-thread stream, which no handle of this thread
     * names: an event on the legacy stream stands for it, as a blocking
     * stream's work comes before the legacy stream's work queued after it
     * (CUDA runtime API, "Stream synchronization behavior": the per-thread
     * default stream is a blocking stream and synchronizes with the legacy
     * default stream). One covers every such stream. Not a device
     * synchronize, which CUDA refuses beside another thread's capture in
     * global mode, and which invalidates it (cuda.h,
     * cuThreadExchangeStreamCaptureMode); the legacy stream's own capture
     * state (a blocking stream capturing) was refused by
     * mp__streams_unwaitable. */
    bool other = st->owner != 0 && st->owner != self;
    if (other && legacy)
      continue;
    mp_event_t ev;
    if (mp__event_get(pool, &ev) != MP_OK)
      goto unmarked;
    if (mp_event_record(pool->dev, ev, other ? NULL : st->s) != MP_OK) {
      mp__event_put(pool, ev);
      goto unmarked;
    }
    legacy = legacy || other;
    set->ev[set->n++] = ev;
    continue;
  unmarked:
    if (!partial)
      goto device;
    st->sync_keep = true;
  }
  /* The join stream unmarked: the captured streams' waits count nothing. */
  for (uint32_t i = 0;
       j != UINT32_MAX && pool->streams[j].sync_keep && i < pool->nstreams; i++)
    if (pool->streams[i].capturing)
      pool->streams[i].sync_snap = 0;
  mp__streams_take_gone_marks(pool, set);
  return true;
device:
  mp__sync_set_release(pool, set);
  mp__error_give_back(&kept);
  return false;
}

bool mp__streams_sync_events(mp_pool_t *pool, mp__sync_set_t *set) {
  return mp__sync_events_as(pool, set, false);
}

mp_status_t mp__sync_set_wait(mp_device_t *dev, const mp__sync_set_t *set) {
  if (set->ev == NULL)
    return mp_device_synchronize(dev);
  mp_status_t st = MP_OK;
  for (size_t i = 0; i < set->n && st == MP_OK; i++)
    st = mp_event_synchronize(dev, set->ev[i]);
  return st;
}

void mp__sync_set_release(mp_pool_t *pool, mp__sync_set_t *set) {
  for (size_t i = 0; i < set->n; i++)
    mp__event_put(pool, set->ev[i]);
  free(set->ev);
  set->ev = NULL;
  set->n = 0;
}

void mp__sync_set_done(mp_pool_t *pool, mp__sync_set_t *set, uint64_t snap,
                       mp_status_t st) {
  bool partial = set->partial;
  mp__sync_set_release(pool, set);
  if (st == MP_OK)
    mp__sync_end_as(pool, snap, partial);
  else
    mp__streams_sync_failed(pool);
}

bool mp__stream_idle_now(mp_pool_t *pool, uint32_t sidx) {
  mp__strm_t *st = &pool->streams[sidx];
  if (st->gone || st->capturing || (st->owner != 0 && st->owner != mp__self()))
    return false;
  /* Under the lock: nothing is freed on the stream while it is asked. */
  if (mp_stream_query(pool->dev, st->s) != MP_OK)
    return false;
  uint64_t snap = st->epoch++;
  st->dirty = false;
  st->want_close = false;
  if (snap + 1 > st->done)
    st->done = snap + 1;
  mp__stream_poll(pool, st);
  return true;
}

bool mp__streams_all_idle_now(mp_pool_t *pool) {
  bool all = true;
  for (uint32_t i = 0; i < pool->nstreams; i++) {
    mp__strm_t *st = &pool->streams[i];
    mp__stream_poll(pool, st); /* the markers that completed, at least */
    if (st->gone)
      all = all && !st->dirty && st->done >= st->epoch;
    else if ((st->dirty || st->done < st->epoch) && /* else nothing owed */
             !mp__stream_idle_now(pool, i)) {
      all = false;
      /* Busy: a marker now makes it no busier, and lets a later look find
       * the open epoch's frees done even if the stream is never idle when
       * asked (fed all the time); without one they waited for a sync. */
      mp__stream_close(pool, st);
    }
  }
  return all;
}

void mp__streams_release(mp_pool_t *pool) {
  mp__pt_unregister(pool);
  for (uint32_t i = 0; i < pool->nstreams; i++) {
    mp__strm_t *st = &pool->streams[i];
    for (unsigned k = 0; k < st->nmarks; k++)
      mp_event_destroy(pool->dev,
                       st->marks[(st->mark_head + k) % MP__MAX_MARKS].ev);
    st->nmarks = 0;
  }
  for (size_t i = 0; i < pool->nevents; i++)
    mp_event_destroy(pool->dev, pool->events[i]);
  if (pool->join != NULL)
    mp_stream_destroy(pool->dev, pool->join);
  pool->join = NULL;
  free(pool->events);
  free(pool->streams);
  free(pool->shash);
  free(pool->gone);
  pool->events = NULL;
  pool->streams = NULL;
  pool->shash = NULL;
  pool->gone = NULL;
  pool->shash_cap = pool->ngone = 0;
  pool->nevents = pool->events_cap = 0;
  pool->nstreams = pool->streams_cap = 0;
  pool->last_s = MP__STREAM_GONE;
}

/* Whether a capture stops a sync of pool: a stream with blocks' work
 * (or, where a device synchronize is owed, any stream) being captured. */
static bool mp__capture_stops_sync(const mp_pool_t *pool) {
  if (pool->ncapturing == 0)
    return false;
  /* A device synchronize would invalidate the capture. */
  if (pool->sync_device_from != 0)
    return true;
  /* A slot only a capture's mark holds (an arena that never used the
   * stream: graph.c) holds no block's work, unless a range given back
   * during the capture waits for it (dirty: mp__stream_use_all_released):
   * the others' events do. */
  for (uint32_t i = 0; i < pool->nstreams; i++) {
    const mp__strm_t *t = &pool->streams[i];
    if (t->capturing > 0 && (!t->mark_only || t->dirty))
      return true;
  }
  return false;
}

/* Waits for the work of every stream the pool knows, by an event on each:
 * what the pool's blocks can be in use by (pool.h: a block used on another
 * stream is named by mp_pool_record_stream). No device synchronize, which
 * would also be a call CUDA forbids while another thread captures a graph
 * in global mode; only when a stream cannot be marked does it fall back to
 * one. With buf_bytes > 0 it also allocates a device buffer of that size
 * while the lock is down (defragmentation's staging buffer; *buf is NULL
 * when the device has no room). */
static mp_status_t mp__pool_sync_refused(const mp_pool_t *pool) {
  if (MP__UNLIKELY(mp__capture_stops_sync(pool)))
    return mp__fail(MP_EBUSY,
                    "a stream of the pool is being captured (graph pool): no "
                    "synchronize until mp_pool_graph_end");
  return mp__streams_unwaitable(pool, "synchronize");
}

mp_status_t mp__pool_sync_alloc(mp_pool_t *pool, size_t buf_bytes, void **buf) {
  mp_status_t ust = mp__pool_sync_refused(pool);
  if (MP__UNLIKELY(ust != MP_OK))
    return ust;
  /* The wait drops the lock: a capture may have begun meanwhile (a graph
   * pool's route, or one the pool does not know of), and its stream can
   * be neither waited for nor counted done, so the refusal is asked again
   * under the lock the events are recorded with. */
  if (mp__pool_wait_sync(pool) && (ust = mp__pool_sync_refused(pool)) != MP_OK)
    return ust;
  /* The events first: the snapshot clears the dirty marks by which they
   * tell a forgotten stream that only a device synchronize covers. */
  mp__sync_set_t set;
  /* A device synchronize (a stream no event can mark) while a capture's
   * mark stands would invalidate that capture. */
  if (!mp__streams_sync_events(pool, &set) && pool->ncapturing > 0)
    return mp__fail(MP_EBUSY,
                    "a stream is being captured (graph pool) and only a "
                    "device synchronize would do: none until "
                    "mp_pool_graph_end");
  uint64_t snap = mp__streams_sync_begin(pool);
  mp__pool_sync_begin(pool);
  mp_status_t st = mp__sync_set_wait(pool->dev, &set);
  if (st == MP_OK && buf_bytes > 0 &&
      mp_device_alloc(pool->dev, buf_bytes, buf) != MP_OK)
    *buf = NULL;
  mp__pool_sync_end(pool);
  mp__sync_set_done(pool, &set, snap, st);
  return st;
}

mp_status_t mp__pool_sync(mp_pool_t *pool) {
  return mp__pool_sync_alloc(pool, 0, NULL);
}

mp_status_t mp__pool_sync_partial(mp_pool_t *pool) {
  const char *what = "synchronize beside a capture";
  mp_status_t st = mp__streams_live_unwaitable(pool, what);
  if (st != MP_OK)
    return st;
  /* Asked again under the lock the events are recorded with, as
   * mp__pool_sync_alloc does: the wait for another sync dropped it. */
  if (mp__pool_wait_sync(pool) &&
      (st = mp__streams_live_unwaitable(pool, what)) != MP_OK)
    return st;
  mp__sync_set_t set;
  if (!mp__sync_events_as(pool, &set, true))
    return mp__fail(MP_ENOMEM, "out of host memory for a synchronize");
  uint64_t snap = mp__sync_begin_as(pool, true);
  mp__pool_sync_begin(pool);
  st = mp__sync_set_wait(pool->dev, &set);
  mp__pool_sync_end(pool);
  mp__sync_set_done(pool, &set, snap, st);
  return st;
}
