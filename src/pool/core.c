/* core.c - the allocation core: take, search, grow and release blocks.
 *
 * An allocation rounds the request to the alignment, asks the free index for
 * the best fit usable on its stream (smallest block that fits, lowest
 * address on ties; at most MP__SEARCH_LIMIT candidates are looked at, so a
 * pile of blocks still pending on other streams cannot make it scan), splits
 * off the rest when it is worth keeping (mp__take_block; the fit and split
 * rules are pool_internal.h's), and the caller makes it live in the live
 * map. A free gives the block deps for the streams that used it, coalesces
 * both neighbours and puts it back in the index. No device call on either
 * path while the cache serves.
 *
 * The ladder when the cache cannot serve (mp__pool_take): grow -> reclaim
 * (close and poll stream epochs) -> synchronize the device, trim every free
 * segment, grow again -> take a block that fits but that newer work of
 * another stream holds, and wait for the streams again -> defragment
 * (defrag.c) -> MP_ENOMEM, or MP_ELIMIT when max_bytes (or a child's
 * range) is what stops it. From a host function the ladder waits for
 * nothing and makes no device call it can do without (mp__pool_in_host_fn).
 *
 * Also here: a pool's host structures (mp__pool_new, mp__pool_free_host),
 * which every kind of pool (plain, child, graph) is made and freed with.
 *
 * Invariant: between calls every block is either live (in the map) or free
 * (in the index), and stats equal what the blocks add up to (mp_pool_check
 * walks it). Everything here expects the pool lock held but pool_new and
 * free_host; the ladder drops it (lock.c's protocol). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pool_internal.h"

#define MP__SEARCH_LIMIT 16

_Thread_local mp_stream_t mp__take_stream;

bool mp__pool_round(const mp_pool_t *pool, size_t bytes, size_t *out) {
  return mp__pool_align_up(pool, bytes, out);
}

MP__COLD bool mp__whole_ok(const mp_pool_t *pool, const mp__block_t *b,
                           size_t size) {
  return size > pool->cfg.max_split && b->size - size < mp__whole_slack(size);
}

/* mp__search_ex from its first candidate b on (out of line: the caller's
 * common case returns b without it, and the loop's registers would weigh
 * on that path). */
__attribute__((noinline)) static mp__block_t *
mp__search_from(mp_pool_t *pool, size_t size, uint32_t sidx, mp__block_t *b,
                mp__block_t **pending) {
  for (unsigned k = 0; b != NULL && k < MP__SEARCH_LIMIT; k++) {
    if (mp__fits(pool, b, size)) {
      if (mp__deps_safe(pool, b, sidx, true) ||
          ((pool->cfg.flags & MP_POOL_STREAM_WAITS) && sidx != UINT32_MAX &&
           mp__deps_order(pool, b, sidx)))
        return b;
      if (*pending == NULL)
        *pending = b;
    }
    b = mp__index_next(pool, b);
  }
  return NULL;
}

/* *pending, set whenever the search returns NULL (left as it was when it
 * returns a block): a block that fits but was passed by only because
 * another stream's work on it has not completed yet (the first such block:
 * the best fit among them), or NULL. *at: the link that points at the
 * block the common case returns, for mp__index_remove_at (unchanged until
 * the take, which follows at once), else NULL. */
static MP__HOT mp__block_t *mp__search_ex_at(mp_pool_t *pool, size_t size,
                                             uint32_t sidx,
                                             mp__block_t **pending,
                                             mp__block_t *const **at) {
  mp__block_t *b = mp__index_best_fit_hot(pool, size, at);
  /* The common case, the best fit splittable and freed on sidx alone: what
   * mp__search_from would find first, without its loop (nor a store to
   * *pending, which the caller reads only without a block). */
  if (MP__LIKELY(b != NULL) && mp__split_allowed(pool, b, size) &&
      mp__deps_own(b, sidx))
    return b;
  *pending = NULL;
  *at = NULL; /* the loop's block: taken by a descent */
  return b != NULL ? mp__search_from(pool, size, sidx, b, pending) : NULL;
}

/* mp__search_ex_at for the callers whose take descends to the block. */
static MP__HOT mp__block_t *mp__search_ex(mp_pool_t *pool, size_t size,
                                          uint32_t sidx,
                                          mp__block_t **pending) {
  mp__block_t *const *at;
  return mp__search_ex_at(pool, size, sidx, pending, &at);
}

static mp__block_t *mp__search(mp_pool_t *pool, size_t size, uint32_t sidx) {
  mp__block_t *pending = NULL;
  return mp__search_ex(pool, size, sidx, &pending);
}

/* Joins the free neighbours that frees kept apart while another stream's
 * work held one of them (block.c) where that work is done, then searches
 * again; *pending: the search passed by a block only such work holds, or
 * pairs are still apart (merge_later) that together could hold the
 * request, which count as pending too: either half alone may be too small,
 * and the two together fit once the work is done. A request bigger than
 * every such run does not wait for them (it waited the whole 200 us before
 * each growth while any pair was apart). */
static mp__block_t *mp__search_joined(mp_pool_t *pool, size_t size,
                                      uint32_t sidx, bool *pending) {
  if (pool->merge_later || mp__apart_sync_due(pool))
    mp__block_merge_deferred(pool);
  mp__block_t *passed = NULL;
  mp__block_t *b = mp__search_ex(pool, size, sidx, &passed);
  *pending = passed != NULL || (pool->merge_later && pool->apart_bytes >= size);
  return b;
}

/* Before growing for a block that another stream's recent work still holds
 * (pending: the first search passed one by, or pairs are kept apart), give
 * that work a moment: an idle stream passes its marker within
 * microseconds, and a device allocation costs far more than the wait. The
 * lock is dropped while waiting; at most MP__PENDING_WAIT_US in total. */
#define MP__PENDING_WAIT_US 200
static mp__block_t *mp__search_patiently(mp_pool_t *pool, size_t size,
                                         uint32_t sidx, bool pending) {
  mp__block_t *b = NULL;
  if (pool->merge_later || mp__apart_sync_due(pool))
    b = mp__search_joined(pool, size, sidx, &pending);
  for (unsigned waited = 0;
       b == NULL && pending && waited < MP__PENDING_WAIT_US; waited += 10) {
    struct timespec ts = {0, 10000};
    mp__pool_unlock(pool);
    nanosleep(&ts, NULL);
    mp__pool_lock(pool);
    b = mp__search_joined(pool, size, sidx, &pending);
  }
  return b;
}

/* Takes b out of the index and cuts it to size; the rest (at the high end)
 * goes back as a free block when it is worth keeping: at least
 * min(size/16, 1 MiB). Smaller slivers stay with the block (counted as
 * allocated): kept apart they would only pile up in the smallest classes,
 * slowing every insert there, and rarely serve anything. Returns the taken
 * block, MP__B_FREE still set (mp__index_remove_hot): what takes it
 * replaces its flags (mp__block_make_live, mp__block_hold) or puts it back
 * (mp__block_untake). at: the link that points at b (the search's), or
 * NULL: the removal descends to b. */
static MP__HOT mp__block_t *mp__take_block_as(mp_pool_t *pool, mp__block_t *b,
                                              size_t size, bool live_next,
                                              mp__block_t *const *at) {
  MP__ASSERT((b->flags & MP__B_FREE) && b->size >= size);
  if (at != NULL)
    mp__index_remove_at(pool, b, at);
  else
    mp__index_remove_hot(pool, b);
  size_t rest = b->size - size;
  mp__block_t *r;
  /* Split, the rest takes b's place among the free blocks: the count
   * stays (no decrement and increment). The rest is kept when it is at
   * least min(size/16, 1 MiB), tested as two compares (a rest of 1 MiB or
   * more first: no min computed for it). */
  if (rest != 0 && (rest >= MP__MiB || rest >= size / 16) &&
      mp__split_allowed(pool, b, size) && (r = mp__rec_pop(pool)) != NULL) {
    if (live_next)
      return mp__block_split_low(pool, b, size, r);
    mp__block_split_rest(pool, b, size, r);
  } else {
    pool->st.free_blocks--;
  }
  return b;
}

/* A take that may be put back (mp__block_untake) or held by the ladder:
 * the taken block keeps its record, deps and all. */
static mp__block_t *mp__take_block(mp_pool_t *pool, mp__block_t *b,
                                   size_t size) {
  return mp__take_block_as(pool, b, size, false, NULL);
}

_Thread_local uint64_t mp__oom_seen;
_Thread_local bool mp__oom_quiet;

/* The caller's last error before the failure mp__pool_oom wrote, which an
 * allocation the out-of-memory handler's retry then serves gives back
 * (status.h: a success does not replace it); _set: filled for the call
 * under way by the ladder, which saw it before its rungs wrote theirs. */
static _Thread_local mp__error_saved_t mp__oom_before;
static _Thread_local bool mp__oom_before_set;
/* The pool and the failure (mp__error_serial) of the last out of memory
 * this thread counted: mp__pool_oom_retry's failure is that one while no
 * other failure has come since. */
static _Thread_local const mp_pool_t *mp__oom_pool;
static _Thread_local uint64_t mp__oom_serial;
/* That failure's oom event, where the pool's handler may answer it: the
 * ring's total with it (0: none recorded), what its slot held before,
 * and the size it names. */
static _Thread_local uint64_t mp__oom_event;
static _Thread_local mp__hkept_t mp__oom_under;
static _Thread_local size_t mp__oom_asked;
static _Thread_local uintptr_t mp__oom_stream;

/* Whether virtual range v has no place for size bytes: neither the room
 * at its top nor any hole, with the free blocks beside them, holds that
 * much. Every place growth may take there (vrange.c, mp__find_placement)
 * holds at most that, so growth into v can only fail. */
static bool mp__vrange_full_for(const mp__segment_t *v, size_t size) {
  const mp__block_t *t = v->last;
  size_t top = v->va_size - v->span;
  if (t != NULL && (t->flags & MP__B_FREE))
    top += t->size;
  if (top >= size)
    return false;
  for (size_t k = 0; k < v->nholes; k++) {
    const mp__block_t *h = v->holes[k];
    size_t n = h->size;
    if (h->prev != NULL && (h->prev->flags & MP__B_FREE))
      n += h->prev->size;
    if (h->next != NULL && (h->next->flags & MP__B_FREE))
      n += h->next->size;
    if (n >= size)
      return false;
  }
  return true;
}

const char *mp__pausable_note(const mp_pool_t *pool, mp_status_t st,
                              size_t asked, size_t room) {
  bool pausable = (pool->cfg.flags & MP_POOL_PAUSABLE) &&
                  (pool->cfg.flags & MP_POOL_VIRTUAL);
  /* The range has no place left (its holes too small, its top taken):
   * growth answers MP_ENOMEM, which the ladder's trim goes on from (grow.c),
   * but the device did not refuse anything. There is no option for the
   * range's size: it is twice the device's size or the cap, whichever is
   * larger, at create, or twice the cap of the moment where the address
   * space cannot hold that (vrange.c, mp__vrange_ready). */
  if (pausable && st == MP_ENOMEM && pool->vseg != NULL &&
      mp__vrange_full_for(pool->vseg, asked)) {
    static _Thread_local char note[320];
    char v[32];
    snprintf(note, sizeof note,
             " (pausable=1: the %s virtual range of %s is full, no hole "
             "in it nor its top holding the request, and a plain segment "
             "would make the pool unpausable; the range is sized at create "
             "from the device's size or the cap, from the cap alone where "
             "address space is short; pausable=0 allows plain segments)",
             pool->arena ? "arena's" : "pool's",
             mp__fmt_bytes(v, sizeof v, pool->vseg->va_size));
    return note;
  }
  if (pausable && st == MP_ELIMIT && asked <= room)
    return " (pausable=1: what is left under the cap is less than the "
           "whole granules the request needs, and a plain segment would "
           "make the pool unpausable)";
  /* A pool without arenas (one with arenas has no range of its own). */
  if (pausable && st == MP_ENOMEM && pool->arenas == NULL && pool->vseg == NULL)
    return " (pausable=1: the pool's virtual range could not be reserved, "
           "the address space short, and a plain segment would make the "
           "pool unpausable)";
  return "";
}

mp_status_t mp__pool_oom(mp_pool_t *pool, mp_status_t st, size_t asked,
                         uintptr_t hs) {
  char a[32], r[32], al[32], lf[32];
  if (!mp__oom_quiet)
    pool->st.oom_count++;
  mp__oom_seen++;
  /* An arena's: recorded by the arenas' path if it is final (arena.c).
   * With a handler, the slot it overwrites is kept, so that the handler's
   * retry can take it back (mp__pool_oom_retry). */
  mp__oom_event = 0;
  if (!pool->arena && pool->hist.ev != NULL && !mp__oom_quiet) {
    if (pool->oom_fn != NULL)
      mp__history_save_next(pool, &mp__oom_under);
    MP__HIST(pool, MP__H_OOM, mp__pool_room(pool), asked, hs);
    mp__oom_event = pool->oom_fn != NULL ? pool->hist.total : 0;
    mp__oom_asked = asked;
    mp__oom_stream = hs;
  }
  if (!mp__oom_before_set)
    mp__error_save(&mp__oom_before);
  mp__oom_before_set = false;
  mp__fail(st,
           "%s%s: asked %s, reserved %s, allocated %s, largest free block %s%s",
           st != MP_ELIMIT ? "out of " : "",
           st != MP_ELIMIT              ? mp__device_memory_name(pool->dev)
           : pool->graph                ? "graph pool: the parent's cap"
           : pool->parent               ? "child pool full"
           : pool->cfg.max_fraction > 0 ? "pool max_fraction"
                                        : "pool max_bytes",
           mp__fmt_bytes(a, sizeof a, asked),
           mp__fmt_bytes(r, sizeof r, pool->st.reserved_bytes),
           mp__fmt_bytes(al, sizeof al, pool->st.allocated_bytes),
           mp__fmt_bytes(lf, sizeof lf, mp__stats_largest_free(pool)),
           mp__pausable_note(pool, st, asked, mp__pool_room(pool)));
  mp__oom_pool = pool;
  mp__oom_serial = mp__error_serial();
  return st;
}

static bool mp__is_oom(mp_status_t st) {
  return st == MP_ENOMEM || st == MP_ELIMIT;
}

/* The growth a host function cannot wait for (another thread's device
 * call in flight): beyond the cap MP_ELIMIT, as growth answers, else the
 * device's refusal of the growth, which is a device call. */
static mp_status_t mp__grow_refused(mp_pool_t *pool, size_t size) {
  if (size > mp__pool_room(pool))
    return mp__segment_limit(pool);
  mp_status_t st = mp__pool_caller_check(pool, "growing the pool");
  return st != MP_OK ? st : MP_ENOMEM;
}

/* Grows until the cache serves or growing fails; returns the block.
 * host_fn (mp__pool_in_host_fn): no wait for a device call in flight. */
static mp_status_t mp__grow_and_search(mp_pool_t *pool, size_t size,
                                       uint32_t sidx, bool host_fn,
                                       mp__block_t **out) {
  /* Only growths this thread made count: waiting for another thread's
   * grow or release is progress too, and is followed by a fresh look. */
  mp_status_t st = MP_ENOMEM;
  for (int grown = 0; grown < 8;) {
    mp__block_t *f;
    if (host_fn && pool->inflight) {
      st = mp__grow_refused(pool, size);
      break;
    }
    if ((st = mp__segment_grow(pool, size, sidx, &f)) != MP_OK)
      break;
    st = MP_ENOMEM;
    grown += f != NULL;
    if ((*out = mp__search(pool, size, sidx)) != NULL) {
      st = MP_OK;
      break;
    }
    /* The search looks at a bounded number of candidates; the block that
     * received the new memory is one more, and fits by construction. */
    if (f != NULL && (f->flags & MP__B_FREE) && f->size >= size &&
        mp__fits(pool, f, size)) {
      if (mp__deps_safe(pool, f, sidx, false) ||
          ((pool->cfg.flags & MP_POOL_STREAM_WAITS) && sidx != UINT32_MAX &&
           mp__deps_order(pool, f, sidx))) {
        *out = f;
        st = MP_OK;
        break;
      }
      /* Growth counted on waiting for a busy neighbour and the wait could
       * not be made: grow without such neighbours from now on. */
      pool->growth_no_waits = true;
    }
  }
  pool->growth_no_waits = false;
  return st;
}

/* A taken block held while the ladder waits for the streams (on) or given
 * back to being taken (off): live in the map and the stats, requested 0,
 * so that no free merges newer work into it meanwhile and a check, stats,
 * pause or trim from another thread sees a consistent pool. The peak it
 * may lift is the allocation it is about to become. */
static void mp__block_hold(mp_pool_t *pool, mp__block_t *b, bool on) {
  /* A pause may run while the ladder waits (the synchronization first
   * waits for the one in flight, the lock dropped): the free bytes are
   * reserved less allocated (mp__free_bytes), so the held block's bytes
   * move in and out of them at the resume too. */
  /* Marked, so that a stale pointer to its address (a double free, a
   * record_stream) is refused meanwhile instead of freeing it. */
  if (on) {
    b->flags = (b->flags & ~(uint32_t)MP__B_FREE) | MP__B_LADDER;
    b->requested = 0;     /* a free block's is not kept (mp__block_release) */
    mp__map_add(pool, b); /* room was made before the take */
    pool->nladder++;
    pool->st.allocated_bytes += b->size;
    mp__stats_peaks(pool);
  } else {
    b->flags &= ~(uint32_t)MP__B_LADDER;
    mp__map_remove(pool, b);
    pool->nladder--;
    pool->st.allocated_bytes -= b->size;
  }
}

/* The last rung before out of memory: a free block that fits but that
 * another stream's work still holds. The earlier rungs waited for the
 * streams, but with the lock dropped (their wait, trim, growth), and a free
 * meanwhile on another stream gives the block it merges into work newer
 * than that wait (a stream churning through its blocks can do so to every
 * one). So the block is taken and held first, then the pool waits for
 * every stream once more: whatever work the block had is behind that wait,
 * and nothing can join it meanwhile. On MP_OK *out is the block, taken and
 * usable on sidx; MP_ENOMEM (nothing changed): no such block, no room in
 * the live map, or no wait can be made (a stream being captured, or
 * host_fn: called from a host function, mp__pool_in_host_fn). */
static MP__COLD mp_status_t mp__take_after_wait(mp_pool_t *pool, size_t size,
                                                uint32_t sidx, bool host_fn,
                                                mp__block_t **out) {
  mp__block_t *pending = NULL;
  mp__block_t *b = mp__search_ex(pool, size, sidx, &pending);
  if (b != NULL) {
    *out = mp__take_block(pool, b, size);
    return MP_OK;
  }
  if (pending == NULL || host_fn || pool->ncapturing > 0 ||
      (!mp__map_has_room(pool, 1) && !mp__map_reserve(pool, 1)))
    return MP_ENOMEM;
  b = mp__take_block(pool, pending, size);
  mp__block_hold(pool, b, true);
  mp_status_t st = mp__pool_sync(pool);
  mp__block_hold(pool, b, false);
  if (st != MP_OK) {
    mp__block_untake(pool, b);
    return MP_ENOMEM;
  }
  *out = b;
  return MP_OK;
}

/* The ladder, when the first search found nothing (pending: it passed by
 * a block only another stream's work holds): *out is the block, taken. */
static MP__COLD mp_status_t mp__pool_ladder_rungs(mp_pool_t *pool, size_t size,
                                                  uint32_t sidx, bool pending,
                                                  mp__block_t **out) {
  mp__block_t *b = mp__search_patiently(pool, size, sidx, pending);
  if (b != NULL)
    goto got;
  /* From a host function only the rungs that neither wait nor call the
   * device: the searches, and growth where nothing is in flight (at the
   * cap it answers MP_ELIMIT, else the device refuses it). */
  bool host_fn = mp__pool_in_host_fn(pool);
  mp_status_t st = mp__grow_and_search(pool, size, sidx, host_fn, &b);
  if (st == MP_OK)
    goto got;
  if (!mp__is_oom(st))
    return mp__status_out(st);
  /* Rung: reclaim blocks whose streams have moved on (queries). */
  if (!host_fn)
    mp__streams_poll(pool, true);
  if ((b = mp__search(pool, size, sidx)) != NULL)
    goto got;
  /* Paused while a rung had the lock dropped: no retry, no OOM counted
   * (alloc.c answers MP_EBUSY). */
  if (pool->paused)
    return mp__pool_paused(pool, "allocation");
  /* Rung: synchronize, give back every free segment, grow again. */
  if (!host_fn && (mp__free_bytes(pool) > 0 || pool->nstreams > 1)) {
    pool->st.alloc_retry_count++;
    mp_status_t synced = mp__pool_sync(pool);
    /* Refused while a stream of the pool is captured: the streams not
     * captured, and what the captured ones queued before their captures
     * began, are waited for instead (stream.c). Memory a graph's range gave
     * back waits for every stream its lender met, which may lag far behind
     * the host: without this wait a capture's allocations grew the device
     * full while that memory sat free. */
    if (synced != MP_OK && pool->ncapturing > 0)
      synced = mp__pool_sync_partial(pool);
    if (synced == MP_OK) {
      /* Joined first, the pairs kept apart for the device sync that just
       * passed (no search before counted them as pending): a child's trim
       * below walks none, and it failed with a pair that held the request.
       * Only those: a walk at every ladder for merge_later too made a
       * churn near the cap several times slower under TSan. */
      if (mp__apart_sync_due(pool))
        mp__block_merge_deferred(pool);
      if ((b = mp__search(pool, size, sidx)) != NULL)
        goto got;
      (void)mp__segment_trim(pool, 0, "the out-of-memory path");
      st = mp__grow_and_search(pool, size, sidx, host_fn, &b);
      if (st == MP_OK)
        goto got;
      if (!mp__is_oom(st))
        return mp__status_out(st);
      /* Rung: wait for a block that fits but work of another stream, newer
       * than the synchronization, holds (before moving blocks for room). */
      if (mp__take_after_wait(pool, size, sidx, false, out) == MP_OK)
        return MP_OK;
    }
  }
  /* Rung: defragment movable blocks (defrag.c; it synchronizes the device:
   * not while a stream of the pool is captured). */
  if ((pool->cfg.flags & MP_POOL_DEFRAG_ON_OOM) && pool->ncapturing == 0 &&
      !host_fn) {
    /* A take for every stream (UINT32_MAX) moves on the stream it is for
     * (mp__take_stream); the space moved blocks leave then waits for
     * that stream, and the last look below waits for it. */
    mp_stream_t s =
        sidx != UINT32_MAX ? pool->streams[sidx].s : mp__take_stream;
    mp__pool_unlock(pool);
    size_t moved = mp__defrag_on_oom(pool, size, s);
    mp__pool_lock(pool);
    if (moved > 0) {
      if ((b = mp__search(pool, size, sidx)) != NULL)
        goto got;
      st = mp__grow_and_search(pool, size, sidx, host_fn, &b);
      if (st == MP_OK)
        goto got;
      if (st == MP__EHOST)
        return mp__status_out(st);
    }
  }
  /* The last look, under the lock the answer is given with: a block freed
   * while defragmentation had the lock dropped serves the request, at once
   * or once its streams' work is waited for. */
  if (!pool->paused &&
      mp__take_after_wait(pool, size, sidx, host_fn, out) == MP_OK)
    return MP_OK;
  if (pool->paused)
    return mp__pool_paused(pool, "allocation");
  return mp__pool_oom(pool, st == MP_ELIMIT ? MP_ELIMIT : MP_ENOMEM, size,
                      sidx != UINT32_MAX ? MP__HIST_STREAM(pool, sidx)
                                         : (uintptr_t)mp__take_stream);
got:
  *out = mp__take_block(pool, b, size);
  return MP_OK;
}

/* mp__pool_ladder_rungs; an allocation it serves leaves the caller's last
 * error as it was (status.h: a success does not replace it), though its
 * rungs met failures on the way: a growth the device refused before a
 * trim made room, a trim whose give-back the device refused. One it fails
 * keeps that error for the handler's retry (mp__oom_before). */
static MP__COLD mp_status_t mp__pool_ladder(mp_pool_t *pool, size_t size,
                                            uint32_t sidx, bool pending,
                                            mp__block_t **out) {
  mp__error_saved_t was; /* kept here too: a rung may run another ladder */
  mp__error_save(&was);
  mp__oom_before = was;
  mp__oom_before_set = true;
  mp_status_t st = mp__pool_ladder_rungs(pool, size, sidx, pending, out);
  if (st == MP_OK)
    mp__error_restore(&was);
  mp__oom_before_set = false;
  return st;
}

MP__HOT mp_status_t mp__pool_take(mp_pool_t *pool, size_t size, uint32_t sidx,
                                  mp__block_t **out, bool *laddered) {
  MP__ASSERT_LOCKED(pool);
  MP__ASSERT((sidx < pool->nstreams || sidx == UINT32_MAX) &&
             size % pool->cfg.align == 0);
  mp__block_t *pending;   /* set by a search that finds nothing */
  mp__block_t *const *at; /* the link to b, or NULL */
  mp__block_t *b = mp__search_ex_at(pool, size, sidx, &pending, &at);
  *laddered = b == NULL;
  if (MP__UNLIKELY(b == NULL)) {
    /* Through a local of its own, as mp__stream_index does: with b's
     * address taken, every search stored b on the stack. */
    mp__block_t *got;
    mp_status_t st = mp__pool_ladder(pool, size, sidx, pending != NULL, &got);
    if (st == MP_OK)
      *out = got;
    return st;
  }
  /* Without the ladder the block is made live next under this hold of the
   * lock (alloc.c, mp_pool_alloc_contiguous): never put back. */
  *out = mp__take_block_as(pool, b, size, true, at);
  return MP_OK;
}

MP__HOT bool mp__pool_take_cached(mp_pool_t *pool, size_t size, uint32_t sidx,
                                  mp__block_t **out, bool live_next) {
  MP__ASSERT_LOCKED(pool);
  mp__block_t *pending;   /* unread */
  mp__block_t *const *at; /* the link to b, or NULL */
  mp__block_t *b = mp__search_ex_at(pool, size, sidx, &pending, &at);
  if (b == NULL)
    return false;
  /* As mp__pool_take's first look: the removal through the search's link,
   * and with live_next the rest keeps b's record (mp__block_split_low). */
  *out = mp__take_block_as(pool, b, size, live_next, at);
  return true;
}

/* Puts a taken, never-live block back. */
void mp__block_untake(mp_pool_t *pool, mp__block_t *b) {
  pool->st.free_blocks++;
  b = mp__block_coalesce(pool, b);
  mp__index_insert(pool, b);
}

MP__HOT void mp__block_make_live(mp_pool_t *pool, mp__block_t *b,
                                 size_t requested, uint32_t sidx, bool plain) {
  MP__ASSERT_LOCKED(pool);
  MP__ASSERT(!(b->flags & MP__B_HOLE)); /* MP__B_FREE: the take leaves it */
  MP__ASSERT(b->size >= requested && mp__free_bytes(pool) >= b->size);
  b->flags = 0;
  b->requested = requested;
  b->sidx = sidx;
  pool->streams[sidx].refs++;
  b->ndeps = 0;
  /* handle and child are read only under MP__B_MOVABLE and MP__B_CHILD,
   * which flags = 0 clears and whose setters set them: not stored here. */
  mp__map_add(pool, b); /* room was reserved before the take */
  pool->st.allocated_bytes += b->size;
  pool->st.requested_bytes += requested;
  /* alloc_count is derived (mp__stats_copy): the live map gained b. */
  mp__stats_live_peaks(pool);
  if (!plain)
    MP__HIST(pool, MP__H_ALLOC, b->addr, requested,
             MP__HIST_STREAM(pool, sidx));
}

/* mp__block_release_merged before the merges: b free, not yet merged. */
static inline __attribute__((always_inline)) void
mp__block_freed(mp_pool_t *pool, mp__block_t *b, bool plain) {
  MP__ASSERT_LOCKED(pool);
  MP__ASSERT(!(b->flags & (MP__B_FREE | MP__B_HOLE)));
  MP__ASSERT(pool->st.allocated_bytes >= b->size);
  if (!plain && MP__UNLIKELY(pool->hist.ev != NULL))
    mp__history_free(pool, b->addr, b->requested, b->size,
                     MP__HIST_STREAM(pool, b->sidx),
                     (b->flags & MP__B_HELD) != 0);
  pool->st.allocated_bytes -= b->size;
  pool->st.requested_bytes -= b->requested;
  pool->st.free_count++;
  /* Counted here, before the deps' stores: GCC 12 adds to it in memory;
   * after them it loaded it early and stored it late (three instructions). */
  pool->st.free_blocks++;
  /* requested is not cleared: it is read only while live (dump.c,
   * snapshot.c, check.c; the ladder's held block sets it 0). Nor handle /
   * child: read only under MP__B_MOVABLE / MP__B_CHILD, cleared below. */
  mp__deps_on_free(pool, b);
  b->flags &= MP__B_SYNC;
}

MP__HOT mp__block_t *mp__block_release_merged(mp_pool_t *pool, mp__block_t *b,
                                              bool plain) {
  mp__block_freed(pool, b, plain);
  return mp__block_coalesce(pool, b);
}

MP__HOT void mp__block_release(mp_pool_t *pool, mp__block_t *b) {
  mp__index_insert(pool, mp__block_release_merged(pool, b, false));
}

void mp__block_release_apart(mp_pool_t *pool, mp__block_t *b) {
  mp__block_freed(pool, b, false);
  mp__index_insert(pool, mp__block_coalesce_apart(pool, b));
}

static _Atomic uint64_t mp__pool_serials; /* the last serial given */

uint64_t mp__pool_serial_new(void) {
  return atomic_fetch_add_explicit(&mp__pool_serials, 1, memory_order_relaxed) +
         1;
}

mp_status_t mp__pool_new(mp_device_t *dev, const mp_pool_config_t *cfg,
                         mp_pool_t **out) {
  mp_pool_t *pool = mp__host_calloc(1, sizeof *pool);
  if (pool == NULL)
    return mp__fail(MP_ENOMEM, "out of host memory creating a pool");
  atomic_init(&pool->lock, 0);
  atomic_init(&pool->lock_seq, 0);
  atomic_init(&pool->idle_seq, 0);
  atomic_init(&pool->hot, pool);
  atomic_init(&pool->gate, NULL);
  atomic_init(&pool->gate_owner, 0);
  pool->serial = mp__pool_serial_new();
  atomic_init(&pool->solo_of, NULL);
  atomic_init(&pool->solo_waits, 0);
  pool->dev = dev;
  pool->cfg = *cfg;
  if (pool->cfg.align == 0)
    pool->cfg.align = MP__DEFAULT_ALIGN;
  pool->align_add = pool->cfg.align - 1;
  pool->align_mask = ~(pool->cfg.align - 1);
  pool->split_free_max =
      pool->cfg.max_split != 0 ? pool->cfg.max_split : SIZE_MAX;
  if (pool->cfg.segment_bytes == 0)
    pool->cfg.segment_bytes = MP__DEFAULT_SEGMENT;
  pool->cfg.segment_bytes =
      (pool->cfg.segment_bytes + pool->cfg.align - 1) & ~(pool->cfg.align - 1);
  pool->sync_gen = 1;
  pool->sync_done = 1;
  pool->last_s = MP__STREAM_GONE; /* no slot yet */
  mp__map_init(pool);
  mp__pool_rare_update(pool);
  mp_status_t st = mp__history_init(pool);
  if (st == MP_OK) {
    st = mp__device_watch(dev, mp__stream_gone, pool);
    if (st != MP_OK)
      mp__history_release(pool);
    else
      mp__device_pools_add(dev, 1);
  }
  if (st != MP_OK) {
    free(pool);
    return st;
  }
  *out = pool;
  return MP_OK;
}

void mp__pool_free_host(mp_pool_t *pool) {
  mp__device_unwatch(pool->dev, mp__stream_gone, pool);
  mp__device_pools_add(pool->dev, -1);
  mp__history_release(pool);
  mp__streams_release(pool);
  mp__rec_release_all(pool);
  if (pool->map_cap > 0)
    free(pool->map); /* else mp__map_init's table */
  free(pool->routes);
  free(pool->granges);
  free(pool);
}

/* Whether a handler runs on this thread (mp__oom_call). */
static _Thread_local bool mp__oom_in_handler;

int mp__oom_call(mp_pool_t *pool, mp_pool_oom_handler_t fn, size_t bytes,
                 mp_status_t st, void *ctx) {
  if (mp__oom_in_handler)
    return 0;
  mp__oom_in_handler = true;
  int again = fn(pool, bytes, st, ctx);
  mp__oom_in_handler = false;
  return again;
}

bool mp__pool_oom_last(const mp_pool_t *pool) {
  return mp__oom_pool == pool && mp__oom_serial == mp__error_serial();
}

void mp__pool_oom_before(mp__error_saved_t *out) {
  *out = mp__oom_before;
}

void mp__pool_oom_give_back(void) {
  mp__error_restore(&mp__oom_before);
}

bool mp__pool_oom_retry(mp_pool_t *pool, mp_status_t st, size_t bytes) {
  /* Only for the device running out, which the failure counted (as the
   * arenas' path, arena.c): host memory running out is MP_ENOMEM too,
   * and no handler frees host memory. */
  if ((st != MP_ENOMEM && st != MP_ELIMIT) || pool->oom_fn == NULL ||
      !mp__pool_oom_last(pool))
    return false;
  mp_pool_oom_handler_t fn = pool->oom_fn;
  void *ctx = pool->oom_ctx;
  char why[MP__ERROR_MAX];
  snprintf(why, sizeof why, "%s", mp_last_error());
  /* Copied: the handler's own allocations may fail and save theirs. */
  mp__error_saved_t before;
  mp__pool_oom_before(&before);
  /* The failure's oom event (the newest: the lock was held since) waits
   * for the handler's answer: one event for an allocation that fails (the
   * retry's failure records its own), none for one the retry serves, as
   * the arenas' path records it (arena.c). */
  bool event = mp__oom_event != 0 && mp__oom_event == pool->hist.total;
  size_t asked = mp__oom_asked;
  uintptr_t hs = mp__oom_stream;
  if (event)
    mp__history_take_back(pool, &mp__oom_under);
  void *caller = mp__hist_caller; /* the handler's calls into pools move it */
  mp__pool_unlock(pool);
  int again = mp__oom_call(pool, fn, bytes, st, ctx);
  mp__pool_lock(pool);
  mp__hist_caller = caller;
  if (!again) {
    mp__fail(st, "%s", why); /* the failure, not what the handler did */
    if (event)
      MP__HIST(pool, MP__H_OOM, mp__pool_room(pool), asked, hs);
  } else {
    if (!mp__oom_quiet && pool->st.oom_count > 0)
      pool->st.oom_count--; /* the retry's answer is the allocation's */
    /* The caller's last error as it was before the failure: a retry that
     * fails says its own. */
    mp__error_restore(&before);
  }
  return again != 0;
}

/* Why a caller's pointer is not a live block (mp__pool_find_live, inline
 * in pool_internal.h, looked it up): a message naming what is wrong with
 * it. movable_ok: a movable block's current pointer is accepted
 * (record_stream), not only raw blocks (free). */
mp_status_t mp__pool_find_live_why(mp_pool_t *pool, const char *fn, void *ptr,
                                   bool movable_ok, bool fwd,
                                   const mp__block_t *b) {
  uintptr_t p = (uintptr_t)ptr;
  if (b == NULL) {
    if (mp__arena_forwards(pool, p, fwd))
      return MP__EFORWARD; /* no message: another arena's block, maybe */
    mp__segment_t *seg = mp__segment_containing(pool, p);
    if (seg == NULL)
      return mp__fail(MP_EINVAL, "%s: %p was not allocated from this pool", fn,
                      ptr);
    for (mp__block_t *x = seg->first; x != NULL; x = x->next) {
      if (p >= x->addr && p < x->addr + x->size) {
        if (x->flags & MP__B_HOLE)
          return mp__fail(MP_EINVAL,
                          "%s: %p lies in memory the pool has unmapped (not "
                          "live)",
                          fn, ptr);
        if (x->flags & MP__B_FREE || p == x->addr)
          return mp__fail(MP_EINVAL, "%s: %p is not live (double free?)", fn,
                          ptr);
        return mp__fail(MP_EINVAL,
                        "%s: %p points inside the block at %p, not at its "
                        "start",
                        fn, ptr, (void *)x->addr);
      }
    }
    return mp__fail(MP_EINVAL, "%s: %p is not live", fn, ptr);
  }
  if ((b->flags & MP__B_CHILD) && mp__grange_of(pool, b->addr) != NULL)
    return mp__fail(MP_EINVAL, "%s: %p lies in a graph pool's range", fn, ptr);
  if (b->flags & MP__B_CHILD)
    return mp__fail(MP_EINVAL,
                    "%s: %p is a child pool's range: destroy the child", fn,
                    ptr);
  if ((b->flags & MP__B_MOVABLE) && !movable_ok)
    return mp__fail(MP_EINVAL, "%s: %p is a movable block: use mp_handle_free",
                    fn, ptr);
  if (b->flags & MP__B_LADDER)
    return mp__fail(MP_EINVAL, "%s: %p is not live (double free?)", fn, ptr);
  return mp__fail(MP_EINVAL,
                  "%s: %p was freed already (held until the processes "
                  "that imported it let go)",
                  fn, ptr);
}
