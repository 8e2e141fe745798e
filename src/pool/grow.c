/* grow.c - growth and release dispatch: which source a pool grows from
 * (the virtual range first, where it has one, else plain segments; a child
 * pool never grows), trim and release_threshold (free chunks of the virtual
 * range anywhere, then wholly free plain segments), and destroy's release
 * of every segment.
 *
 * Called with the lock held; the sources drop it around their device calls
 * (lock.c). A grow or release already in flight is waited for instead, and
 * the caller looks at the cache again; but a graph pool's growth that this
 * thread runs (its parent's out-of-memory handler allocating from it) is
 * MP_EBUSY. */
#include <stdio.h>
#include <stdlib.h>

#include "pool_internal.h"

#define MP__RELEASE_EVERY 8 /* frees between tries that left memory above */

/* A growth of the virtual range that failed after it mapped some of its
 * pieces (map_piece: the device refused a later one, vrange.c) gives them
 * back, so that a failed allocation leaves reserved where it was (pool.h:
 * a call that fails changes nothing but counters and the cache it gave
 * back). Kept, they were free memory the request could not use, and the
 * ladder's last growth left them mapped: a 40 MiB request on a device with
 * 16 MiB left held all 16 once it failed, memory no other allocator of the
 * device could have. As much as the growth added is unmapped (reserved
 * above was, strays aside: those are no free chunk), chosen as trim
 * chooses: the new pieces, or other free chunks in their place. The
 * growth's failure stays the thread's error. */
static MP__COLD void mp__grow_undo(mp_pool_t *pool, size_t was,
                                   mp__block_t **fresh) {
  size_t now = pool->st.reserved_bytes - pool->stray_bytes;
  if (now <= was)
    return;
  *fresh = NULL; /* its record may go with the unmap */
  mp__error_saved_t why;
  mp__error_save(&why);
  (void)mp__vrange_reclaim(pool, now - was, NULL, NULL, false);
  mp__error_restore(&why);
}

mp_status_t mp__segment_grow(mp_pool_t *pool, size_t size, uint32_t sidx,
                             mp__block_t **fresh) {
  MP__ASSERT_LOCKED(pool);
  *fresh = NULL;
  if (pool->parent != NULL && !pool->graph)
    return MP_ELIMIT; /* a child pool never grows */
  /* Paused while the caller had the lock dropped: no map into the range
   * the pause gave back (resume maps exactly the chunks it unmapped). */
  if (pool->paused || pool->grow_held)
    return mp__fail(MP_EBUSY, "allocation: the pool is paused");
  /* Growth rounds up to the granule or to MP__LARGE_ROUND: a size that
   * cannot be rounded without wrapping is more than any device holds. */
  size_t unit =
      pool->granule > MP__LARGE_ROUND ? pool->granule : MP__LARGE_ROUND;
  if (size > SIZE_MAX - unit)
    return pool->cap_is_max && size > pool->cap ? mp__segment_limit(pool)
                                                : MP_ENOMEM;
  if (pool->inflight) {
    /* A graph pool's growth that this thread runs: its parent's
     * out-of-memory handler allocates from it (the wait would be for
     * itself, for good). */
    if (mp__graph_growing_here(pool))
      return mp__fail(MP_EBUSY,
                      "allocation: the graph pool is growing in this thread "
                      "already (its parent's out-of-memory handler allocates "
                      "from it)");
    /* Someone else is growing or releasing: wait, then let the caller look
     * at the cache again. */
    mp__pool_wait_idle(pool);
    return MP_OK;
  }
  /* Growth is a device call (cuMemAlloc, cuMemHostAlloc, a map), which a
   * host function may not make (cuda.h, cuLaunchHostFunc: "must not make
   * any CUDA API calls"): refused before it, as growth, not as the device
   * call under it (the host pool's said mp_device_host_alloc, a call of
   * the pinned view that its caller never made). Past the room it is the
   * cap's answer, as anywhere; a graph pool's growth borrows from its
   * parent, whose own growth asks. */
  if (pool->upstream == NULL && size <= mp__pool_room(pool)) {
    mp_status_t st = mp__pool_caller_check(pool, "growing the pool");
    if (st != MP_OK)
      return st;
  }
  if (pool->cfg.flags & MP_POOL_VIRTUAL) {
    mp_status_t st = mp__vrange_ready(pool);
    if (st == MP_OK) {
      size_t was = pool->st.reserved_bytes - pool->stray_bytes;
      st = mp__vrange_grow(pool, size, sidx, fresh);
      if (st != MP_OK)
        mp__grow_undo(pool, was, fresh);
    }
    if (st != MP_ENOTSUP)
      return st;
    /* The range could not place it, or could not be reserved (the address
     * space short: mp__vrange_ready tries again at the next growth): no
     * plain segment for a pool that must stay pausable. */
    if (pool->cfg.flags & MP_POOL_PAUSABLE)
      return MP_ENOMEM;
  }
  return mp__plain_grow(pool, size, sidx, fresh);
}

mp_status_t mp__segment_trim(mp_pool_t *pool, size_t keep, const char *who) {
  MP__ASSERT_LOCKED(pool);
  if (pool->parent != NULL)
    return MP_OK; /* a child's range goes back only when it is destroyed */
  mp__pool_wait_idle(pool);
  if (pool->paused)
    return MP_OK; /* paused meanwhile: nothing is mapped */
  /* A trim that succeeds leaves the caller's last error as it was
   * (status.h: a success does not replace it), though the device refused
   * a stray or a piece it took at a later pass: before, mp_pool_trim
   * answered MP_OK with that refusal as the last error. */
  mp__error_kept_t was;
  mp__error_keep(&was);
  /* Mappings a refused peer access left (vrange.c): the driver may take
   * them back now; those it refuses again wait for the next try. */
  (void)mp__vrange_strays_retry(pool);
  mp__block_merge_deferred(pool);
  /* The refusals of the last pass, the one that gave nothing back: each
   * piece the device still refuses was asked once in it (a refusal ends no
   * scan), while one it refused in an earlier pass and took at a later one
   * is no refusal now. Free memory that no pass could ask for (a segment
   * or chunk a live block shares) is no refusal either: counted over the
   * whole trim, a refusal that later went made the trim report the
   * device's refusal of memory it never refused. */
  uint64_t refused = 0, since = 0; /* since: the last pass's start */
  while (mp__free_bytes(pool) > keep) {
    uint64_t before = pool->give_back_refused;
    since = mp__error_serial();
    if (mp__vrange_reclaim(pool, mp__free_bytes(pool) - keep, NULL, NULL,
                           false) == 0 &&
        !mp__plain_trim_one(pool)) {
      refused = pool->give_back_refused - before;
      break;
    }
  }
  if (refused == 0 || mp__free_bytes(pool) <= keep) {
    mp__error_give_back(&was);
    return MP_OK;
  }
  /* The thread's last error says why the device refused the last one,
   * where the refusing call said (else it is an older failure, which
   * would be given as the device's reason). As a cudaFree failing in
   * PyTorch's emptyCache raises. */
  (void)mp__device_said(pool->give_back_st, since);
  char b[32];
  return mp__fail(pool->give_back_st,
                  "%s: the device refused to take back %llu piece%s of free "
                  "memory, so %s free stays reserved (tried again at the "
                  "next trim): %s",
                  who, (unsigned long long)refused, refused == 1 ? "" : "s",
                  mp__fmt_bytes(b, sizeof b, mp__free_bytes(pool)),
                  mp_last_error());
}

void mp__segment_release_over(mp_pool_t *pool) {
  size_t th = pool->cfg.release_threshold;
  if (th == 0 || mp__free_bytes(pool) <= th ||
      pool->st.free_count < pool->release_next_free || pool->inflight ||
      pool->syncing || pool->paused)
    return;
  /* Part of a call that succeeds (a free): what the device refuses here
   * stays the pool's for a later try and is no failure of that call, so
   * the caller's last error stays as it was (status.h: a success does not
   * replace it), not the trim's message or the device's. */
  mp__error_saved_t was;
  mp__error_save(&was);
  /* Which streams have finished their work: a query each (before any new
   * marker, which would make an idle stream busy), never a wait. */
  if (pool->sync_device_from == 0 && mp__streams_all_idle_now(pool)) {
    /* Every stream the pool knows has finished: what waits for a sync
     * (blocks whose streams did not fit one record) is free to go too, but
     * not where a device synchronize is owed (sync_device_from). */
    mp__streams_sync_end(pool, mp__streams_sync_begin(pool));
  }
  (void)mp__segment_trim(pool, th, "release_threshold");
  /* Memory still above the threshold is in use by a stream (or not whole
   * chunks): the next try waits a few frees. */
  if (mp__free_bytes(pool) > th)
    pool->release_next_free = pool->st.free_count + MP__RELEASE_EVERY;
  mp__error_restore(&was);
}

mp_status_t mp__segment_release_all(mp_pool_t *pool) {
  mp__lost_t lost = {.first = MP_OK, .n = 0};
  mp__segment_t *s = pool->segs;
  while (s != NULL) {
    mp__segment_t *next = s->next;
    if (s->kind == MP__SEG_PLAIN) {
      uint64_t since = mp__error_serial();
      mp_status_t st = mp__device_free(pool->dev, (void *)s->base);
      if (st == MP_OK)
        pool->st.device_free_count++;
      else /* the refusing call's reason, never an older failure's */
        mp__lost_note(&lost, mp__device_said(st, since),
                      "free the plain segment", s->base, s->size);
    } else if (s->kind == MP__SEG_VIRTUAL) {
      mp__vrange_release(pool, s, &lost);
    }
    free(s);
    s = next;
  }
  pool->segs = NULL;
  pool->vseg = NULL;
  if (lost.n == 0)
    return MP_OK;
  char more[48] = "";
  if (lost.n > 1)
    snprintf(more, sizeof more, " (and %zu more refusal%s)", lost.n - 1,
             lost.n == 2 ? "" : "s");
  return mp__fail(lost.first,
                  "mp_pool_destroy: the device refused to %s at %p (%zu "
                  "bytes)%s once the release had begun, so the pool is "
                  "destroyed all the same and that memory is lost to it: %s",
                  lost.what, (void *)lost.at, lost.bytes, more, lost.why);
}
