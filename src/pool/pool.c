/* pool.c - the pool's public entry points: create/destroy, alloc/free
 * (own stream, another stream, after all), contiguous pieces,
 * record_stream, trim, caps, peers, mem_info.
 *
 * Each takes the lock, routes what is not the pool's own (a graph pool's
 * stream or range: graph.c; an exported block: export.c; a paused pool:
 * pause.c) and hands the rest to the allocation core (core.c, alloc.c).
 * The work itself lives below (pool_internal.h's map). One mutex per pool;
 * never held across a blocking device call (lock.c). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../structs.h"
#include "pool_internal.h"

/* ---- create / destroy --------------------------------------------------- */

/* The cap that max_bytes or max_fraction (of the device's memory) give,
 * else the device's size, else none. A device that does not tell its size
 * is no failure (nor a message for mp_last_error()); a driver that fails
 * the question (a kernel's fault left its error) is: a pool sized without
 * it would keep a range made for no cap after the driver answers again. */
static mp_status_t mp__pool_cap_for(const mp_pool_t *pool, size_t max_bytes,
                                    double fraction, size_t *cap, bool *is_max,
                                    size_t *total_out) {
  size_t total = 0;
  mp__error_saved_t saved;
  mp__error_save(&saved);
  mp_status_t info = mp_device_mem_info(pool->dev, NULL, &total);
  if (info == MP_EDRIVER)
    return mp__fail(MP_EDRIVER, "the device's size: %s", mp_last_error());
  if (info != MP_OK)
    mp__error_restore(&saved);
  bool told = info == MP_OK && total > 0;
  if (total_out != NULL)
    *total_out = told ? total : 0;
  *is_max = max_bytes != 0 || fraction > 0;
  if (max_bytes != 0) {
    *cap = max_bytes;
  } else if (fraction > 0) {
    if (!told)
      return mp__fail(MP_EINVAL, "pool config: max_fraction needs the "
                                 "device's size, which it does not tell");
    /* At most total: on a device near 2^64 bytes the product rounds up to
     * 2^64 as a double, which no size_t holds (the conversion is
     * undefined). */
    double want = (double)total * fraction;
    size_t share = want >= (double)SIZE_MAX ? SIZE_MAX : (size_t)want;
    *cap = (share < total ? share : total) & ~(pool->cfg.align - 1);
    /* As max_bytes below the alignment: a cap that no block fits. */
    char num[32];
    if (*cap == 0)
      return mp__fail(MP_EINVAL,
                      "pool config: max_fraction %s of the device's %zu "
                      "bytes is below the alignment %zu",
                      mp__fmt_g(num, sizeof num, fraction), total,
                      pool->cfg.align);
  } else {
    *cap = told ? total : SIZE_MAX;
  }
  return MP_OK;
}

mp_status_t mp_pool_set_max_fraction(mp_pool_t *pool, double fraction) {
  if (pool == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_set_max_fraction: pool is NULL");
  char num[32];
  if (!(fraction >= 0 && fraction <= 1))
    return mp__fail(MP_EINVAL, "mp_pool_set_max_fraction: %s is not in [0, 1]",
                    mp__fmt_g(num, sizeof num, fraction));
  if (pool->parent != NULL)
    return mp__fail(MP_EINVAL,
                    "mp_pool_set_max_fraction: a %s pool draws "
                    "from its parent's cap",
                    pool->graph ? "graph" : "child");
  size_t cap = 0;
  bool is_max = false;
  mp_status_t st = mp__pool_cap_for(pool, 0, fraction, &cap, &is_max, NULL);
  if (st != MP_OK)
    return st;
  mp__pool_lock(pool);
  /* Paused: MP_EBUSY, as every call but the few pool.h names (resume maps
   * back what the pool held before the pause whatever the cap says). */
  st = mp__pool_paused(pool, "mp_pool_set_max_fraction");
  if (st == MP_OK) {
    pool->cap = cap;
    pool->cap_is_max = is_max;
    pool->cfg.max_bytes = 0;
    pool->cfg.max_fraction = fraction;
    if (pool->arenas != NULL)
      mp__arena_recap(pool);
  }
  mp__pool_unlock(pool);
  return st;
}

mp_status_t mp_pool_create(mp_device_t *dev, const mp_pool_config_t *cfg,
                           mp_pool_t **out) {
  if (out == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_create: out is NULL");
  if (dev == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_create: device is NULL");
  /* The caller's struct, as long as its header made it, read into this
   * library's whole one (fields it lacks keep their defaults). */
  mp_pool_config_t c, made;
  if (cfg == NULL) {
    mp_pool_config_init(&made);
    cfg = &made;
  }
  mp_status_t st;
  if ((st = mp__config_env_check("mp_pool_create", cfg)) != MP_OK ||
      (st = mp__config_in("mp_pool_create: pool config", cfg, true, &c)) !=
          MP_OK ||
      (st = mp__config_validate(&c)) != MP_OK)
    return st;
  cfg = &c;
  mp_pool_t *pool;
  if ((st = mp__pool_new(dev, cfg, &pool)) != MP_OK)
    return st;
  size_t total = 0;
  if ((st = mp__pool_cap_for(pool, cfg->max_bytes, cfg->max_fraction,
                             &pool->cap, &pool->cap_is_max, &total)) != MP_OK) {
    mp__pool_free_host(pool);
    return st;
  }
  pool->va_basis = total > pool->cap ? total : pool->cap;
  if (cfg->release_fraction > 0) {
    if (pool->cap == SIZE_MAX) {
      mp__pool_free_host(pool);
      return mp__fail(MP_EINVAL,
                      "pool config: garbage_collection_threshold "
                      "(release_fraction) needs a cap or the device's size, "
                      "which it does not tell");
    }
    pool->cfg.release_threshold =
        (size_t)((double)pool->cap * cfg->release_fraction);
    /* A share under a byte is a byte: 0 would mean "keep all until
     * trim", the opposite of a threshold that small. */
    pool->cfg.release_threshold += pool->cfg.release_threshold == 0;
    mp__pool_rare_update(pool);
  }
  size_t g = 0;
  if (cfg->flags & MP_POOL_VIRTUAL) {
    /* A device without virtual memory is not a failure of this call: keep
     * the caller's last error as it was. */
    mp__error_saved_t saved;
    mp__error_save(&saved);
    if (mp__device_vm_granularity(dev, &g) == MP_OK && g != 0 &&
        (g & (g - 1)) == 0)
      pool->granule = g < pool->cfg.align ? pool->cfg.align : g;
    else
      mp__error_restore(&saved);
  }
  /* pausable=1 (virtual=1 checked by mp__config_validate) on a device
   * without virtual memory: every segment would be plain, and no pause
   * could keep its addresses. */
  if ((cfg->flags & MP_POOL_PAUSABLE) && pool->granule == 0) {
    mp__pool_free_host(pool);
    return mp__fail(MP_ENOTSUP,
                    "pool config: pausable=1 needs virtual memory, which "
                    "device '%s' does not offer: its pool would hold plain "
                    "segments, which no pause can keep",
                    mp_device_name(dev));
  }
  /* Blocks are aligned only as far as their segments are: the virtual
   * range to the granularity, plain segments to what the device promises
   * for an allocation (a virtual pool may fall back to them). */
  size_t plain = mp__device_alloc_align(dev), most = g > plain ? g : plain;
  if (pool->cfg.align > plain && pool->cfg.align > g) {
    mp__pool_free_host(pool);
    return mp__fail(MP_EINVAL,
                    "pool config: align %zu is above what the device "
                    "aligns its memory to (%zu)",
                    cfg->align, most);
  }
  if (cfg->arenas > 0 && (st = mp__arenas_init(pool)) != MP_OK) {
    mp__pool_free_host(pool);
    return st;
  }
  *out = pool;
  return MP_OK;
}

/* Giving device memory back is a device call, which a host function may
 * not make (cuda.h, cuLaunchHostFunc: "must not make any CUDA API calls"),
 * and a free the device refuses once the pool is being torn down loses the
 * memory for good. The wait before it is refused the same way, while
 * nothing has changed yet; but where no stream has work left to wait for
 * (every stream the pool knew was destroyed and seen done), the set of
 * events is empty and there was no wait at all. One wait is made all the
 * same, then: on an event of the pool's own, idle (never recorded, or last
 * recorded for work that is done), so that it waits for nothing but is
 * still a device call. Without an event, the set is dropped and the wait
 * is a device synchronize, as for a stream that cannot be given one. Only
 * where the pool itself holds device memory: a child's range goes back to
 * its parent, not to the device. */
static void mp__destroy_wait_anyway(mp_pool_t *pool, mp__sync_set_t *set) {
  if (set->n > 0 || pool->parent != NULL || pool->segs == NULL)
    return;
  mp_event_t ev;
  if (mp__event_get(pool, &ev) == MP_OK)
    set->ev[set->n++] = ev; /* room: one more than the streams */
  else
    mp__sync_set_release(pool, set);
}

/* MP_EBUSY while child or graph pools of pool live, else MP_OK. */
static mp_status_t mp__pool_no_children(mp_pool_t *pool) {
  mp__pool_lock(pool);
  size_t n = pool->children;
  mp__pool_unlock(pool);
  return n == 0 ? MP_OK
                : mp__fail(MP_EBUSY,
                           "mp_pool_destroy: %zu child pool%s still live", n,
                           n == 1 ? "" : "s");
}

/* Exports into pool's arenas from the one at index from on again, after
 * a destroy that sealed them refused. */
static void mp__arenas_unseal(mp_pool_t *pool, size_t from) {
  for (size_t i = from; i < pool->cfg.arenas; i++) {
    mp_pool_t *a = mp__arena_at(pool, i);
    if (a != NULL)
      mp__export_unseal(a);
  }
}

/* The part of a destroy of pool (one without arenas: an arena, a child,
 * or a pool with none) that may refuse and changes nothing: its children
 * and leases asked, its streams asked whether they can be waited for and
 * then waited for, and its exports sealed (export.c), so that what is left
 * (mp__pool_destroy_free) asks no stream again. arena: pool's index among
 * its parent's arenas, named in a refusal; SIZE_MAX for none. */
static mp_status_t mp__pool_destroy_ready(mp_pool_t *pool, size_t arena) {
  mp__pool_lock(pool);
  size_t n = pool->children;
  char where[40] = "";
  if (arena != SIZE_MAX)
    snprintf(where, sizeof where, " (arena %zu)", arena);
  if (n > 0) {
    mp__pool_unlock(pool);
    return mp__fail(MP_EBUSY, "mp_pool_destroy: %zu child pool%s still live%s",
                    n, n == 1 ? "" : "s", where);
  }
  /* A plain segment still imported by another process may not be freed
   * yet (export.c); refused, as pause is; nothing changed. */
  mp_status_t est = mp__export_destroy_busy(pool);
  if (est != MP_OK) {
    mp__pool_unlock(pool);
    return est;
  }
  /* Its memory goes only once its streams' work is done, found by an event
   * on each: a stream captured without the pool's knowledge would take the
   * event into its graph, and the wait would be an unsafe call (cuda.h,
   * cuStreamBeginCapture_v2). Refused, as pause is; nothing changed. */
  mp_status_t ust = mp__streams_unwaitable(pool, "mp_pool_destroy");
  /* The wait for another thread's synchronization drops the lock: a
   * capture begun meanwhile is asked for again under the lock the events
   * are recorded with (as mp__pool_sync_alloc does). */
  if (ust == MP_OK && mp__pool_wait_sync(pool))
    ust = mp__streams_unwaitable(pool, "mp_pool_destroy");
  if (ust != MP_OK) {
    mp__pool_unlock(pool);
    return ust;
  }
  /* The streams that used the pool must be done before memory goes back:
   * an event on each, not a device synchronize (another thread may be
   * capturing a graph). A wait that cannot be made (a host function of
   * the device) fails the destroy before anything is released: memory
   * the device then refused to free would be lost with the pool. A device
   * synchronize only where one is owed (sync_device_from: an arena given
   * a graph range back; no capture runs, as no graph pool lives). */
  mp__sync_set_t set = {0};
  bool wait = pool->nstreams > 0 || pool->sync_device_from != 0;
  if (wait && mp__streams_sync_events(pool, &set))
    mp__destroy_wait_anyway(pool, &set);
  /* A synchronize of the pool's like any other (stream.c's): one that
   * completes counts the streams done, the destroyed ones whose last
   * markers the set took too, so that a destroy refused after it (the
   * device refused the first free, a later arena refused) leaves nothing
   * owed; one that fails leaves them owed. */
  uint64_t snap = wait ? mp__streams_sync_begin(pool) : 0;
  mp__pool_sync_begin(pool);
  uint64_t since = mp__error_serial();
  mp_status_t st = wait ? mp__sync_set_wait(pool->dev, &set) : MP_OK;
  mp__pool_sync_end(pool);
  if (wait)
    mp__sync_set_done(pool, &set, snap, st);
  if (st != MP_OK) {
    mp__pool_unlock(pool);
    (void)mp__device_said(st, since); /* not an older failure as its why */
    return mp__fail(st,
                    "mp_pool_destroy: cannot wait for the device here, so "
                    "nothing was released and the pool is as it was: %s",
                    mp_last_error());
  }
  /* Both waits dropped the lock: an export made meanwhile is refused as
   * one made before the call (nothing has gone yet). */
  est = mp__export_destroy_busy(pool);
  /* No export from here on: the memory goes unlocked below. */
  if (est == MP_OK)
    pool->export_sealed = true;
  mp__pool_unlock(pool);
  return est;
}

/* The rest of a destroy of pool, once mp__pool_destroy_ready said yes: its
 * memory freed, then the pool. A device refusing the first free leaves the
 * pool as it was (unsealed); *gone: the pool was freed. */
static mp_status_t mp__pool_destroy_free(mp_pool_t *pool, bool *gone) {
  /* A child made since (child.c seals nothing) keeps its range. */
  mp_status_t st = mp__pool_no_children(pool);
  if (st != MP_OK) {
    mp__export_unseal(pool);
    return st;
  }
  /* The first device free comes before anything else is given up: a
   * device that refuses it (a driver error, a free it does not permit
   * now) leaves the pool as it was, for a later destroy. First a staging
   * buffer an earlier refusal kept (defrag.c). */
  uint64_t since = mp__error_serial();
  st = mp__defrag_stage_retry(pool);
  if (st != MP_OK) {
    mp__export_unseal(pool);
    (void)mp__device_said(st, since); /* not an older failure as its why */
    return mp__fail(st,
                    "mp_pool_destroy: the device refused to free a "
                    "defragmentation staging buffer, so nothing was "
                    "released and the pool is as it was: %s",
                    mp_last_error());
  }
  if (pool->parent == NULL && (st = mp__plain_release_first(pool)) != MP_OK) {
    mp__export_unseal(pool);
    return st;
  }
  mp__pool_lock(pool);
  mp__handle_retire_all(pool);
  mp__pool_pause_release(pool);
  mp__export_release_all(pool);
  mp__pool_unlock(pool);
  if (pool->parent != NULL) {
    mp__child_release(pool);
  } else {
    st = mp__segment_release_all(pool);
  }
  mp__pool_free_host(pool);
  *gone = true;
  return st;
}

/* mp_pool_destroy; *gone: the pool was freed (also on a failure after
 * the point of no return). */
void mp__pool_for_good(mp_pool_t *pool) {
  pool->for_good = true; /* before the pool is published */
}

static mp_status_t mp__pool_destroy(mp_pool_t *pool, bool *gone) {
  *gone = false;
  if (pool == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_destroy: pool is NULL");
  if (pool->for_good)
    return mp__fail(MP_EBUSY,
                    "mp_pool_destroy: a default pool (mp_default_pool, "
                    "mp_malloc, the torch hooks) lives until the process "
                    "exits; nothing was destroyed");
  if (pool->graph) {
    /* Not the public call: its mark would replace this call's caller. */
    mp_status_t gst = mp__graph_release(pool);
    *gone = gst == MP_OK; /* its handle is done with, its memory follows */
    return gst;
  }
  /* Arenas (arena.c): each an ordinary pool; the pool itself holds none of
   * their memory. Every arena is made ready first (mp__pool_destroy_ready:
   * its children, leases and streams asked, its streams waited for, its
   * exports sealed), so that a refusal there changes nothing; only then
   * are they freed, and nothing asks a stream again: a capture begun (or
   * a stream met) after an arena was asked would otherwise refuse that
   * arena after the ones before it went. One that still fails to go (the
   * device refused its first free) stays, and so does the pool: a later
   * destroy ends the rest. A graph pool of the pool (counted in the pool,
   * its ranges lent by the arenas) refuses first. */
  mp_status_t gst = pool->arenas != NULL ? mp__pool_no_children(pool) : MP_OK;
  if (gst != MP_OK)
    return gst;
  bool ready[MP_POOL_MAX_ARENAS] = {false};
  for (size_t i = 0; pool->arenas != NULL && i < pool->cfg.arenas; i++) {
    mp_pool_t *a = mp__arena_at(pool, i);
    mp_status_t ust = a != NULL ? mp__pool_destroy_ready(a, i) : MP_OK;
    ready[i] = a != NULL && ust == MP_OK;
    if (ust != MP_OK) {
      mp__arenas_unseal(pool, 0);
      return ust;
    }
  }
  /* An arena destroyed with memory the device refused is gone all the
   * same: the rest and the pool follow, and the first such failure is
   * returned at the end. */
  mp_status_t lost = MP_OK;
  char lost_why[MP__ERROR_MAX] = "";
  for (size_t i = 0; pool->arenas != NULL && i < pool->cfg.arenas; i++) {
    mp_pool_t *a = mp__arena_at(pool, i);
    bool a_gone = false;
    /* The solo (or lane) arena: the pool leaves solo for good before it
     * goes, so that a pool that stays (a later arena's failure) does not
     * point its hot path at it. */
    if (a != NULL && mp__pool_hot(pool) == a)
      mp__arena_unsolo(pool);
    /* One made since (a thread's first call meanwhile) is made ready
     * here: a refusal then comes after the arenas before it went. */
    mp_status_t ast =
        a == NULL || ready[i] ? MP_OK : mp__pool_destroy_ready(a, i);
    if (a != NULL && ast == MP_OK)
      ast = mp__pool_destroy_free(a, &a_gone);
    if (a != NULL && !a_gone) {
      /* The arenas before it went: the threads' memos of them must miss
       * (mp__arena_mine_memo), so that their next calls make new ones. */
      pool->serial = mp__pool_serial_new();
      mp__arenas_unseal(pool, i);
      return ast;
    }
    atomic_store_explicit(&pool->arenas[i].pool, NULL, memory_order_release);
    if (ast != MP_OK && lost == MP_OK) {
      lost = ast;
      snprintf(lost_why, sizeof lost_why, "%s", mp_last_error());
    }
  }
  /* Written only where there were arenas: a pool without them is read
   * unlocked by another thread's call in flight (mp_pool_trim), which a
   * refused destroy leaves to go on. */
  if (pool->arenas != NULL) {
    free(pool->arenas);
    pool->arenas = NULL;
  }
  mp_status_t st = mp__pool_destroy_ready(pool, SIZE_MAX);
  if (st == MP_OK)
    st = mp__pool_destroy_free(pool, gone);
  if (*gone && st == MP_OK && lost != MP_OK)
    return mp__fail(lost, "%s", lost_why);
  return st;
}

/* A child pool's range (or a graph pool's ranges) goes back to the parent
 * as a free in the parent's history: its stack starts at the caller of
 * the public entry point, as mp_pool_free's does. (parent is set at
 * create and never changes.) */
#define MP__DESTROY_ENTRY(pool)                                                \
  do {                                                                         \
    if ((pool) != NULL && (pool)->parent != NULL)                              \
      MP__HIST_ENTRY((pool)->parent);                                          \
  } while (0)

mp_status_t mp_pool_destroy(mp_pool_t *pool) {
  bool gone;
  MP__DESTROY_ENTRY(pool);
  return mp__pool_destroy(pool, &gone);
}

mp_status_t mp_pool_destroy_ex(mp_pool_t *pool, int *destroyed) {
  bool gone = false;
  MP__DESTROY_ENTRY(pool);
  mp_status_t st = mp__pool_destroy(pool, &gone);
  if (destroyed != NULL)
    *destroyed = gone ? 1 : 0;
  return st;
}

/* Under the lock: *have, whether peer (by ordinal) is one of pool's peers
 * already; MP_ENOMEM when it is not and the list is full. */
static mp_status_t mp__peer_room(const mp_pool_t *pool, mp_device_t *peer,
                                 bool *have) {
  unsigned n = atomic_load(&pool->npeers);
  *have = false;
  for (unsigned i = 0; i < n && !*have; i++)
    *have = mp__device_ordinal(pool->peers[i]) == mp__device_ordinal(peer);
  if (!*have && n == sizeof pool->peers / sizeof *pool->peers)
    return mp__fail(MP_ENOMEM, "mp_pool_set_access: at most %u peers",
                    (unsigned)(sizeof pool->peers / sizeof *pool->peers));
  return MP_OK;
}

/* Under the lock, no map in flight: peer loses the access given to the
 * first n chunks mapped of pool's virtual segment. A take-back the device
 * refuses is not reported: the caller reports the failure being undone. */
static void mp__peer_revoke(mp_pool_t *pool, mp_device_t *peer, size_t n) {
  const mp__segment_t *v = pool->vseg;
  for (size_t i = 0; i < n; i++)
    (void)mp__device_vm_revoke(pool->dev, (void *)v->chunks[i].addr,
                               v->chunks[i].size, peer);
}

/* A pool without arenas: peer (one it has) out of its list again and its
 * chunks closed to it; nothing if it does not have it. */
static void mp__peer_drop(mp_pool_t *pool, mp_device_t *peer) {
  mp__pool_lock(pool);
  mp__pool_wait_idle(pool); /* no map in flight reads the list */
  unsigned n = atomic_load(&pool->npeers);
  for (unsigned i = 0; i < n; i++)
    if (pool->peers[i] == peer) {
      mp__peer_revoke(pool, peer, mp__pool_chunks_mapped(pool, pool->vseg));
      memmove(&pool->peers[i], &pool->peers[i + 1],
              (n - i - 1) * sizeof *pool->peers);
      atomic_store_explicit(&pool->npeers, n - 1, memory_order_release);
      break;
    }
  mp__pool_unlock(pool);
}

/* One mp_pool_set_access across arenas at a time (every pool's: it is
 * rare), so that two calls never interleave their arenas. Taken before any
 * pool's lock; nothing holding a pool's lock takes it. */
static pthread_mutex_t mp__arenas_access_mu = PTHREAD_MUTEX_INITIALIZER;

/* A pool with arenas (arena.c): the peer joins the pool's own list, which
 * each arena made later copies (mp__arena_make), then every arena made gets
 * it, each under its own lock only (its wait for a map in flight is no
 * wait under the pool's lock). All or nothing: an arena failing (the device
 * refuses access) takes the peer out of the pool's list again, then out of
 * every arena that got it (an arena made meanwhile included), its chunks
 * closed to it again; the failure, the pool as it was. */
static mp_status_t mp__arenas_set_access(mp_pool_t *pool, mp_device_t *peer) {
  bool have;
  pthread_mutex_lock(&mp__arenas_access_mu);
  mp__pool_lock(pool);
  mp_status_t st = mp__peer_room(pool, peer, &have);
  unsigned n = atomic_load(&pool->npeers);
  if (st == MP_OK && !have) {
    pool->peers[n] = peer;
    atomic_store_explicit(&pool->npeers, n + 1, memory_order_release);
  }
  mp__pool_unlock(pool);
  if (st != MP_OK || have) /* have: every arena has it (all or nothing) */
    goto out;
  for (size_t i = 0; st == MP_OK && i < pool->cfg.arenas; i++)
    if (mp__arena_at(pool, i) != NULL)
      st = mp_pool_set_access(mp__arena_at(pool, i), peer);
  if (st != MP_OK) {
    char why[MP__ERROR_MAX];
    snprintf(why, sizeof why, "%s", mp_last_error());
    mp__pool_lock(pool);
    unsigned m = atomic_load(&pool->npeers);
    MP__ASSERT(m > 0 && pool->peers[m - 1] == peer);
    atomic_store_explicit(&pool->npeers, m - 1, memory_order_release);
    mp__pool_unlock(pool);
    for (size_t i = 0; i < pool->cfg.arenas; i++)
      if (mp__arena_at(pool, i) != NULL)
        mp__peer_drop(mp__arena_at(pool, i), peer);
    mp__fail(st, "%s (no arena has the peer)", why);
  }
out:
  pthread_mutex_unlock(&mp__arenas_access_mu);
  return st;
}

mp_status_t mp_pool_set_access(mp_pool_t *pool, mp_device_t *peer) {
  if (pool == NULL || peer == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_set_access: %s is NULL",
                    pool == NULL ? "pool" : "peer");
  if (peer->ops != pool->dev->ops)
    return mp__fail(MP_EINVAL,
                    "mp_pool_set_access: '%s' is not a device of the pool's "
                    "kind ('%s')",
                    mp_device_name(peer), mp_device_name(pool->dev));
  if (peer == pool->dev ||
      mp__device_ordinal(peer) == mp__device_ordinal(pool->dev))
    return MP_OK;
  /* Device calls (mapping for the peer), after a wait for any in flight. */
  mp_status_t wst = mp__pool_may_wait(pool, "mp_pool_set_access");
  if (wst != MP_OK)
    return wst;
  if (pool->arenas != NULL)
    return mp__arenas_set_access(pool, peer);
  mp__pool_lock(pool);
  mp__pool_wait_idle(pool); /* no map in flight misses the new peer */
  bool have;
  mp_status_t st = mp__peer_room(pool, peer, &have);
  if (st != MP_OK || have)
    goto out;
  /* The chunks mapped now (paused: those a failed undo left mapped; a
   * resume maps the others), then the peer for every later map. A chunk
   * refused: those before it closed to the peer again. */
  unsigned n = atomic_load(&pool->npeers);
  mp__segment_t *v = pool->vseg;
  size_t mapped = mp__pool_chunks_mapped(pool, v);
  for (size_t i = 0; i < mapped; i++) {
    uint64_t since = mp__error_serial();
    if ((st = mp__device_vm_access(pool->dev, (void *)v->chunks[i].addr,
                                   v->chunks[i].size, peer)) != MP_OK) {
      char why[MP__ERROR_MAX];
      st = mp__device_said(st, since); /* not an older failure as its why */
      snprintf(why, sizeof why, "%s", mp_last_error());
      mp__peer_revoke(pool, peer, i);
      mp__fail(st, "%s", why);
      goto out;
    }
  }
  pool->peers[n] = peer;
  atomic_store_explicit(&pool->npeers, n + 1, memory_order_release);
out:
  mp__pool_unlock(pool);
  return st;
}

mp_status_t mp_pool_mem_info(mp_pool_t *pool, size_t *free_bytes,
                             size_t *total_bytes) {
  if (pool == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_mem_info: pool is NULL");
  size_t f = 0, t = 0;
  mp_stats_t sum; /* summed over arenas, if any */
  if (pool->graph) {
    /* No cap or device room of its own (graph.c): what its parent can
     * still give it, plus its own idle cache (its ranges count as the
     * parent's allocated bytes). */
    mp_status_t st = mp_pool_mem_info(pool->parent, &f, &t);
    if (st != MP_OK)
      return st;
    mp__stats_read(pool, &sum);
    f = mp__add_sat(f, sum.free_bytes);
    if (free_bytes != NULL)
      *free_bytes = f < t ? f : t;
    if (total_bytes != NULL)
      *total_bytes = t;
    return MP_OK;
  }
  mp_status_t st = mp_device_mem_info(pool->dev, &f, &t);
  if (st != MP_OK)
    return st;
  mp__stats_read(pool, &sum);
  /* The cache (free_bytes: 0 paused, when nothing serves). Strays
   * (vrange.c) are reserved but serve nothing: no cache, and they hold
   * room under the cap as the live blocks do. Paused: nothing reserved
   * while the live blocks still count. */
  size_t idle = sum.free_bytes;
  size_t held = sum.reserved_bytes - sum.free_bytes;
  size_t used = held > sum.allocated_bytes ? held : sum.allocated_bytes;
  /* Under the lock: mp_pool_set_max_fraction moves it. */
  mp__pool_lock(pool);
  size_t cap = pool->cap_is_max ? pool->cap : SIZE_MAX;
  mp__pool_unlock(pool);
  f = mp__add_sat(f, idle);
  if (cap < t)
    t = cap;
  size_t left = cap > used ? cap - used : 0;
  if (f > left)
    f = left;
  if (f > t)
    f = t;
  if (free_bytes != NULL)
    *free_bytes = f;
  if (total_bytes != NULL)
    *total_bytes = t;
  return MP_OK;
}

bool mp__pool_contains(mp_pool_t *pool, const void *ptr) {
  /* With arenas the pool itself holds no memory (arena.c). */
  if (MP__UNLIKELY(pool->arenas != NULL))
    return mp__arena_owner(pool, ptr) != NULL;
  mp__pool_lock(pool);
  bool in = mp__segment_containing(pool, (uintptr_t)ptr) != NULL;
  mp__pool_unlock(pool);
  return in;
}

mp_device_t *mp_pool_device(const mp_pool_t *pool) {
  return pool ? pool->dev : NULL;
}

/* ---- alloc / free ------------------------------------------------------- */

static mp_status_t mp__pool_alloc_rare(mp_pool_t *pool, size_t bytes,
                                       mp_stream_t s, void **out, void *ra);
static mp_status_t mp__pool_alloc_failed(mp_pool_t *pool, size_t bytes,
                                         mp_stream_t s, void **out,
                                         mp_status_t st);

/* The rest of mp__arena_alloc after arena a's cache answered st (a miss,
 * or MP__EOFF: its cache is off): a stream routed to a graph pool
 * allocates there (every arena marks such a stream capturing, and its
 * cache is off: graph.c, alloc.c), any other through the arenas' path,
 * without the pool's lock. */
static MP__COLD mp_status_t mp__arena_alloc_rest(mp_pool_t *pool, mp_pool_t *a,
                                                 size_t bytes, mp_stream_t s,
                                                 void **out, mp_status_t st,
                                                 void *ra) {
  if (ra != NULL) /* NULL: the caller's mark stands (mp__pool_alloc_marked) */
    MP__HIST_ENTRY_AT(pool, ra);
  if (st != MP__EOFF)
    return mp__status_out(mp__arena_alloc_miss(pool, a, bytes, s, out));
  /* While a stream is captured the cache is off for every stream (one
   * flag, 0 instructions on the path without captures): a stream not
   * captured gets it here. */
  mp__pool_lock(a);
  bool capturing = a->ncapturing > 0 && mp__stream_captured(a, s);
  st = a->ncapturing > 0 && !capturing
           ? mp__pool_alloc_cached_off(a, bytes, s, out)
           : MP__EMISS;
  mp__pool_unlock(a);
  if (st == MP_OK)
    return st;
  mp_pool_t *g = capturing ? mp_pool_graph_of(pool, s) : NULL;
  if (g != NULL) {
    mp__pool_lock(g); /* a graph pool: never with arenas */
    return mp__pool_alloc_rare(g, bytes, s, out, NULL);
  }
  return mp__status_out(mp__arena_alloc_miss(pool, a, bytes, s, out));
}

/* mp_pool_alloc on a pool with arenas: the calling thread's arena's cache
 * (inline here: one frame, not three, and not in mp_pool_alloc itself,
 * whose path without arenas it slowed by 7 instructions a pair), the rest
 * out of line. */
__attribute__((noinline)) static mp_status_t
mp__arena_alloc(mp_pool_t *pool, size_t bytes, mp_stream_t s, void **out,
                void *ra) {
  mp_status_t st;
  mp_pool_t *a = mp__arena_mine_memo(pool);
  if (MP__UNLIKELY(a == NULL)) {
    /* Through a local: with a's own address taken, a lived on the stack
     * (a store, and a load at the unlock). */
    mp_pool_t *made;
    if ((st = mp__arena_mine_made(pool, &made)) != MP_OK)
      return st;
    a = made;
  }
  mp__pool_lock(a);
  st = mp__pool_alloc_cached(a, bytes, s, out, false);
  mp__pool_unlock(a);
  if (MP__LIKELY(st == MP_OK))
    return st;
  return mp__arena_alloc_rest(pool, a, bytes, s, out, st, ra);
}

/* mp_pool_alloc, locked, in a pool where pool->rare is set: the history's
 * caller (ra: mp_pool_alloc's return address), a stream that allocates to
 * a graph pool, and the checks that the plain path leaves out. Unlocks. */
static MP__COLD mp_status_t mp__pool_alloc_rare(mp_pool_t *pool, size_t bytes,
                                                mp_stream_t s, void **out,
                                                void *ra) {
  /* An arena's plain path runs solo, or for a call that read its pool's
   * hot pointer just before solo ended (arena.c, "Solo"). Past solo, with
   * a stream marked capturing (routed to a graph pool, which only the
   * arenas' path finds), that call goes to the arenas' path. */
  if (MP__UNLIKELY(pool->arena) &&
      atomic_load_explicit(&pool->solo_of, memory_order_relaxed) == NULL) {
    mp__pool_unlock(pool);
    return mp__arena_alloc(pool->arena_of, bytes, s, out, ra);
  }
  if (ra != NULL) /* NULL: the caller's mark stands (mp__pool_alloc_marked) */
    MP__HIST_ENTRY_AT(pool, ra);
  if (pool->nroutes > 0) {
    mp_pool_t *g = mp__graph_route(pool, s);
    if (g != NULL) {
      mp__pool_unlock(pool);
      mp__pool_lock(g); /* a graph pool: never with arenas */
      return mp__pool_alloc_rare(g, bytes, s, out, ra);
    }
  }
  /* A graph pool may be finished by a free while the lock is dropped
   * (the handler may free its last block): the last call out does it. */
  bool graph = pool->graph;
  /* Released, a graph pool lives on only for its live blocks' frees
   * (mp_pool_graph_release): a new block would borrow from the parent for
   * a graph that is gone. */
  if (MP__UNLIKELY(graph && pool->released))
    return mp__graph_refuse_released(pool, "mp_pool_alloc");
  bool outer = graph && mp__graph_enter(pool);
  mp_status_t st = mp__pool_alloc_locked_hot(pool, bytes, s, out, false);
  if (st != MP_OK && !graph) /* the plain path's failure, solo's too */
    return mp__pool_alloc_failed(pool, bytes, s, out, st);
  /* A handler may release the graph pool before it asks for the retry:
   * no new block then either. */
  if (st != MP_OK && mp__pool_oom_retry(pool, st, bytes))
    st = !pool->released ? mp__pool_alloc_locked(pool, bytes, s, out)
                         : mp__graph_refuse_retry(pool, "mp_pool_alloc");
  bool last = graph && mp__graph_leave(pool, outer);
  mp__pool_unlock(pool);
  mp__graph_finish_if(pool, last);
  return st;
}

/* mp_pool_alloc's plain path after its take failed with st, locked:
 * the out-of-memory handler and a retry, or on the solo arena of a pool
 * (arena.c) the arenas' out-of-memory path. Unlocks. */
static MP__COLD mp_status_t mp__pool_alloc_failed(mp_pool_t *pool, size_t bytes,
                                                  mp_stream_t s, void **out,
                                                  mp_status_t st) {
  if (pool->arena) {
    mp__pool_unlock(pool);
    return mp__arena_solo_failed(pool, bytes, s, out, st);
  }
  if (mp__pool_oom_retry(pool, st, bytes))
    st = mp__pool_alloc_locked(pool, bytes, s, out);
  mp__pool_unlock(pool);
  return st;
}

/* mp_pool_alloc without arenas (or solo on one): a call of its own, so
 * that mp_pool_alloc itself needs no frame and reaches either path with a
 * jump. Inline in mp_pool_alloc, the frame this path needs was made before
 * the arenas' test, and the arenas' path paid for it and its own (29
 * instructions a call in mp_pool_alloc): arenas=1 420.3 / 380.8
 * instructions a pair inline, 400.3 / 360.8 so; this path 358.1 / 318.3
 * inline, 361.2 / 321.8 so (the jump and ra's load; count_pairs.sh). ra:
 * mp_pool_alloc's return address, for a history's stacks. */
__attribute__((noinline)) static mp_status_t
mp__pool_alloc_plain(mp_pool_t *pool, size_t bytes, mp_stream_t s, void **out,
                     void *ra) {
  mp__pool_lock(pool);
  if (MP__UNLIKELY(pool->rare != 0))
    return mp__pool_alloc_rare(pool, bytes, s, out, ra);
  mp_status_t st = mp__pool_alloc_locked_hot(pool, bytes, s, out, true);
  if (MP__UNLIKELY(st != MP_OK))
    return mp__pool_alloc_failed(pool, bytes, s, out, st);
  mp__pool_unlock(pool);
  return st;
}

mp_status_t mp_pool_alloc(mp_pool_t *pool, size_t bytes, mp_stream_t s,
                          void **out) {
  if (MP__UNLIKELY(pool == NULL || out == NULL))
    return mp__fail(MP_EINVAL, "mp_pool_alloc: %s is NULL",
                    pool == NULL ? "pool" : "out");
  if (bytes == 0) {
    *out = NULL;
    return MP_OK;
  }
  /* Solo or the lane (arenas_auto=1, arena.c): the solo arena, its plain
   * path, or through its gate the arenas' path. */
  pool = mp__pool_hot(pool);
  void *ra = __builtin_return_address(0);
  mp_pool_t *g = mp__pool_gate(pool);
  if (MP__UNLIKELY(g != NULL))
    return mp__arena_alloc(g, bytes, s, out, ra);
  return mp__pool_alloc_plain(pool, bytes, s, out, ra);
}

mp_status_t mp__pool_alloc_marked(mp_pool_t *pool, size_t bytes, mp_stream_t s,
                                  void **out) {
  /* Only a pool that records stacks reads the mark, on its rare path (the
   * ring sets pool->rare), or its arenas on theirs, where mp_pool_alloc
   * would put its own return address. The ring is fixed from create to
   * destroy: read without the lock, as the mark's. */
  if (pool == NULL || out == NULL || bytes == 0 || !pool->hist.marks)
    return mp_pool_alloc(pool, bytes, s, out);
  if (pool->arenas != NULL)
    return mp__arena_alloc(pool, bytes, s, out, NULL);
  mp__pool_lock(pool);
  return mp__pool_alloc_rare(pool, bytes, s, out, NULL);
}

mp_status_t mp_pool_set_oom_handler(mp_pool_t *pool, mp_pool_oom_handler_t fn,
                                    void *ctx) {
  if (pool == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_set_oom_handler: pool is NULL");
  mp__pool_lock(pool);
  pool->oom_fn = fn;
  pool->oom_ctx = fn != NULL ? ctx : NULL;
  mp__pool_unlock(pool);
  return MP_OK;
}

bool mp__pool_block_of(mp_pool_t *pool, const void *ptr, void **base,
                       size_t *size) {
  uintptr_t p = (uintptr_t)ptr;
  bool found = false;
  if (MP__UNLIKELY(pool->arenas != NULL)) {
    mp_pool_t *a = mp__arena_owner(pool, ptr);
    return a != NULL && mp__pool_block_of(a, ptr, base, size);
  }
  mp__pool_lock(pool);
  mp_pool_t *g = pool->ngranges ? mp__graph_owner(pool, p) : NULL;
  mp__segment_t *seg = g == NULL ? mp__segment_containing(pool, p) : NULL;
  for (mp__block_t *x = seg ? seg->first : NULL; x != NULL; x = x->next)
    if (p >= x->addr && p - x->addr < x->size) {
      found = !(x->flags & (MP__B_FREE | MP__B_HOLE | MP__B_CHILD));
      *base = (void *)x->addr;
      *size = x->size;
      break;
    }
  mp__pool_unlock(pool);
  return g != NULL ? mp__pool_block_of(g, ptr, base, size) : found;
}

bool mp__pool_base_of(mp_pool_t *pool, const void *ptr, void **base,
                      size_t *size) {
  if (!mp__pool_block_of(pool, ptr, base, size))
    return false;
  /* The segment is the pool's (an arena's) own, a graph pool's range
   * being a block of it. */
  mp_pool_t *owner = pool->arenas != NULL ? mp__arena_owner(pool, ptr) : pool;
  if (owner == NULL)
    return true;
  mp__pool_lock(owner);
  const mp__segment_t *seg = mp__segment_containing(owner, (uintptr_t)ptr);
  if (seg != NULL && seg->kind == MP__SEG_PLAIN) {
    *base = (void *)seg->base;
    *size = seg->size;
  }
  mp__pool_unlock(owner);
  return true;
}

mp_status_t mp_pool_record_stream(mp_pool_t *pool, void *ptr, mp_stream_t s) {
  if (pool == NULL || ptr == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_record_stream: %s is NULL",
                    pool == NULL ? "pool" : "ptr");
  if (MP__UNLIKELY(pool->arenas != NULL)) {
    mp_pool_t *a = mp__arena_owner(pool, ptr);
    if (a != NULL)
      return mp_pool_record_stream(a, ptr, s);
  }
  mp__pool_lock(pool);
  if (MP__UNLIKELY(pool->ngranges > 0)) {
    mp_pool_t *g = mp__graph_owner(pool, (uintptr_t)ptr);
    if (g != NULL) {
      mp__pool_unlock(pool);
      return mp_pool_record_stream(g, ptr, s);
    }
  }
  mp__block_t *b = NULL; /* set when mp__pool_find_live succeeds */
  uint32_t sidx;
  mp__slot_t *slot = NULL;
  mp_status_t st = mp__pool_paused(pool, "mp_pool_record_stream");
  if (st == MP_OK)
    st = mp__pool_find_live(pool, "mp_pool_record_stream", ptr, true, false, &b,
                            &slot);
  if (st == MP_OK)
    st = mp__stream_index(pool, s, &sidx);
  if (st == MP_OK)
    mp__stream_add_use(pool, b, sidx);
  mp__pool_unlock(pool);
  return st;
}

/* The frees: ordered on the block's own stream, also on s, after every
 * stream the pool knows, or on its own stream with its recorded uses known
 * finished. */
typedef enum {
  MP__FREE_OWN,
  MP__FREE_ON,
  MP__FREE_ALL,
  MP__FREE_DONE
} mp__free_how_t;

static mp_status_t mp__pool_free_in(mp_pool_t *pool, void *ptr,
                                    mp__free_how_t how, mp_stream_t s,
                                    const char *fn);

/* The pool a free of ptr works on in a pool with arenas when the calling
 * thread has no arena there: the arena holding it, found as record_stream
 * finds it (the rest is the arena's free: an arena has no arenas or graph
 * pools); not in an arena, the pool itself, whose own path says what is
 * wrong with it. mp__arena_owner reads the range of the arena the thread
 * would have (arena 0 for a thread without a number) first, without a
 * lock; mp__arena_owner_slow alone leaves that range out, and looked for a
 * bad pointer in it in every arena's live map and segments, under each
 * arena's lock. */
static MP__COLD mp_pool_t *mp__arena_free_other(mp_pool_t *pool,
                                                const void *ptr) {
  mp_pool_t *a = mp__arena_owner(pool, ptr);
  return a != NULL ? a : pool;
}

static MP__COLD mp_status_t mp__pool_free_forward(mp_pool_t *a, void *ptr,
                                                  mp__free_how_t how,
                                                  mp_stream_t s,
                                                  const char *fn);

/* The rest of a free once b is out of the live map. */
static MP__HOT void mp__pool_free_release(mp_pool_t *pool, mp__block_t *b,
                                          bool plain) {
  /* Before b joins its free neighbours: the new block's own stream has not
   * reached the free yet, and merged in it would hold them back. */
  if (!plain)
    mp__segment_release_above(pool);
  mp__index_insert_hot(pool, mp__block_release_merged(pool, b, plain));
}

/* The free of exported b, just taken out of the live map (the lock held
 * since): back in the map (the removal left room) and held while an
 * importer holds it, else out again and freed. The lock is not dropped
 * until b is one or the other; then the leases of other blocks that
 * importers let go are reaped, which may release their blocks and drop
 * the lock (an unmap, release_threshold). The plain free takes b out
 * before it tests the flag, as it always did: testing first cost 2.6
 * instructions a pair. */
static MP__COLD void mp__pool_free_exported(mp_pool_t *pool, mp__block_t *b,
                                            bool plain) {
  mp__map_add(pool, b);
  if (!mp__export_hold(pool, b)) {
    mp__map_remove(pool, b);
    mp__pool_free_release(pool, b, plain);
  }
  mp__export_reap(pool);
}

/* The free under the lock, which it drops; plain: pool->rare is 0, and
 * what only a rare state needs (mp__pool_rare_of) is left out. */
static MP__HOT mp_status_t mp__pool_free_locked(mp_pool_t *pool, void *ptr,
                                                mp__free_how_t how,
                                                mp_stream_t s, const char *fn,
                                                bool plain, bool fwd) {
  MP__ASSERT(!plain || pool->rare == 0);
  if (!plain && MP__UNLIKELY(pool->ngranges > 0)) {
    mp_pool_t *g = mp__graph_owner(pool, (uintptr_t)ptr);
    if (g != NULL) {
      mp__pool_unlock(pool);
      return mp__pool_free_in(g, ptr, how, s, fn);
    }
  }
  mp__block_t *b = NULL; /* set when mp__pool_find_live succeeds */
  uint32_t sidx = 0;
  mp__slot_t *slot = NULL;
  mp_status_t st;
  if (!plain && MP__UNLIKELY(pool->paused))
    /* Paused: refused; but in an arena, a pointer outside it goes on to
     * the arena holding it, which may run (mid-pause, pause.c): no
     * failure, so no message. */
    st = mp__arena_forwards(pool, (uintptr_t)ptr, fwd)
             ? MP__EFORWARD
             : mp__pool_paused(pool, fn);
  else
    st = mp__pool_find_live(pool, fn, ptr, false, fwd, &b, &slot);
  if (st == MP_OK && how == MP__FREE_ON)
    st = mp__stream_index(pool, s, &sidx);
  if (st == MP_OK) {
    if (how == MP__FREE_ON)
      mp__stream_add_use(pool, b, sidx);
    else if (how == MP__FREE_ALL)
      mp__stream_use_all(pool, b);
    else if (how == MP__FREE_DONE)
      mp__stream_drop_uses(pool, b);
    mp__map_remove_slot(pool, slot);
    if (MP__UNLIKELY(b->flags & MP__B_EXPORTED))
      mp__pool_free_exported(pool, b, plain);
    else
      mp__pool_free_release(pool, b, plain);
  } else if (MP__UNLIKELY(st == MP__EFORWARD)) {
    mp__pool_unlock(pool);
    return mp__pool_free_forward(pool, ptr, how, s, fn);
  }
  bool last = !plain && MP__UNLIKELY(pool->graph) && mp__graph_take_last(pool);
  mp__pool_unlock(pool);
  mp__graph_finish_if(pool, last);
  return st;
}

/* mp__pool_free_locked where pool->rare is set: out of the plain path,
 * with the history's caller (ra, when an entry point gives it). */
static MP__COLD mp_status_t mp__pool_free_rare(mp_pool_t *pool, void *ptr,
                                               mp__free_how_t how,
                                               mp_stream_t s, const char *fn,
                                               void *ra, bool fwd) {
  if (ra != NULL)
    MP__HIST_ENTRY_AT(pool, ra);
  return mp__pool_free_locked(pool, ptr, how, s, fn, false, fwd);
}

/* The free on pool, whose lock it takes: the rare path or the plain one.
 * entry: as mp__pool_free_as's; fwd: as mp__pool_free_locked's. */
static MP__HOT mp_status_t mp__pool_free_at(mp_pool_t *pool, void *ptr,
                                            mp__free_how_t how, mp_stream_t s,
                                            const char *fn, bool entry,
                                            bool fwd) {
  mp__pool_lock(pool);
  if (MP__UNLIKELY(pool->rare != 0))
    return mp__pool_free_rare(pool, ptr, how, s, fn,
                              entry ? __builtin_return_address(0) : NULL, fwd);
  return mp__pool_free_locked(pool, ptr, how, s, fn, true, fwd);
}

/* A free on arena a (the calling thread's, or the lane's: arena.c) of a
 * pointer outside its segments, a's lock dropped: the other arena holding
 * it frees it (whose own path says what is wrong with it), without a
 * forward of its own; where none does, a's answer. */
static MP__COLD mp_status_t mp__pool_free_forward(mp_pool_t *a, void *ptr,
                                                  mp__free_how_t how,
                                                  mp_stream_t s,
                                                  const char *fn) {
  mp_pool_t *x =
      mp__arena_owner_slow(a->arena_of, (uintptr_t)ptr, a->arena_index);
  return mp__pool_free_at(x != NULL ? x : a, ptr, how, s, fn, false, false);
}

/* entry: inline in a public entry point, whose return address is the
 * history's caller (MP__HIST_ENTRY; always_inline, so that the builtin
 * reads the entry point's own), false from the library's own callers.
 * Stored only where the pool records stacks, which makes it rare: the
 * address is read there, not kept in a register across the lock. */
static MP__HOT mp_status_t mp__pool_free_as(mp_pool_t *pool, void *ptr,
                                            mp__free_how_t how, mp_stream_t s,
                                            const char *fn, bool entry) {
  if (ptr == NULL) {
    if (entry)
      MP__HIST_ENTRY(pool);
    return MP_OK;
  }
  pool = mp__pool_hot(pool); /* solo, the lane: the solo arena (arena.c) */
  mp_pool_t *g = mp__pool_gate(pool);
  if (MP__UNLIKELY(g != NULL)) {
    /* The calling thread's arena, whose live map finds its own blocks;
     * another arena's block misses and goes on (mp__pool_free_forward). A
     * check of the arena's range here first cost 13 instructions a pair
     * (arenas=1: 401.3 against 388.3, count_pairs.sh). */
    mp_pool_t *a = mp__arena_mine_memo(g);
    pool = MP__LIKELY(a != NULL) ? a : mp__arena_free_other(g, ptr);
  }
  return mp__pool_free_at(pool, ptr, how, s, fn, entry, true);
}

/* mp__pool_free_as in the graph pool holding ptr: a call (the inline body
 * cannot hold itself). */
__attribute__((noinline)) static mp_status_t
mp__pool_free_in(mp_pool_t *pool, void *ptr, mp__free_how_t how, mp_stream_t s,
                 const char *fn) {
  return mp__pool_free_as(pool, ptr, how, s, fn, false);
}

mp_status_t mp_pool_free(mp_pool_t *pool, void *ptr) {
  if (MP__UNLIKELY(pool == NULL))
    return mp__fail(MP_EINVAL, "mp_pool_free: pool is NULL");
  return mp__pool_free_as(pool, ptr, MP__FREE_OWN, NULL, "mp_pool_free", true);
}

mp_status_t mp__pool_free_on(mp_pool_t *pool, void *ptr, mp_stream_t s,
                             const char *fn) {
  return mp__pool_free_as(pool, ptr, MP__FREE_ON, s, fn, false);
}

mp_status_t mp__pool_free_named(mp_pool_t *pool, void *ptr, const char *fn) {
  return mp__pool_free_as(pool, ptr, MP__FREE_OWN, NULL, fn, false);
}

mp_status_t mp__pool_free_marked(mp_pool_t *pool, void *ptr) {
  if (MP__UNLIKELY(pool == NULL))
    return mp__fail(MP_EINVAL, "mp_pool_free: pool is NULL");
  return mp__pool_free_as(pool, ptr, MP__FREE_OWN, NULL, "mp_pool_free", false);
}

mp_status_t mp__pool_free_done(mp_pool_t *pool, void *ptr, const char *fn) {
  return mp__pool_free_as(pool, ptr, MP__FREE_DONE, NULL, fn, false);
}

mp_status_t mp_pool_free_after_all(mp_pool_t *pool, void *ptr) {
  if (MP__UNLIKELY(pool == NULL))
    return mp__fail(MP_EINVAL, "mp_pool_free_after_all: pool is NULL");
  return mp__pool_free_as(pool, ptr, MP__FREE_ALL, NULL,
                          "mp_pool_free_after_all", true);
}

mp_status_t mp_pool_add_stream(mp_pool_t *pool, mp_stream_t s) {
  if (pool == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_add_stream: pool is NULL");
  if (MP__UNLIKELY(pool->arenas != NULL))
    return mp__arena_add_stream(pool, s);
  mp__pool_lock(pool);
  uint32_t sidx;
  mp_status_t st = mp__pool_paused(pool, "mp_pool_add_stream");
  if (st == MP_OK)
    st = mp__stream_index(pool, s, &sidx);
  mp__pool_unlock(pool);
  return st;
}

mp_status_t mp_pool_free_async(mp_pool_t *pool, void *ptr, mp_stream_t s) {
  if (pool == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_free_async: pool is NULL");
  MP__HIST_ENTRY(pool);
  return mp__pool_free_on(pool, ptr, s, "mp_pool_free_async");
}

mp_status_t mp_pool_alloc_contiguous(mp_pool_t *pool, size_t count,
                                     const size_t *sizes, mp_stream_t s,
                                     void **out) {
  if (pool == NULL || sizes == NULL || out == NULL || count == 0)
    return mp__fail(MP_EINVAL, "mp_pool_alloc_contiguous: %s",
                    pool == NULL    ? "pool is NULL"
                    : sizes == NULL ? "sizes is NULL"
                    : out == NULL   ? "out is NULL"
                                    : "count is 0");
  /* Bad input first: a 0 size is MP_EINVAL wherever it is, and counts as
   * no failed allocation. */
  for (size_t i = 0; i < count; i++)
    if (sizes[i] == 0)
      return mp__fail(MP_EINVAL, "mp_pool_alloc_contiguous: sizes[%zu] is 0",
                      i);
  MP__HIST_ENTRY(pool);
  if (pool->arenas != NULL) {
    /* A stream routed to a graph pool gets the pieces there (as the path
     * without arenas does, contiguous.c). */
    mp_pool_t *g = mp_pool_graph_of(pool, s);
    return g != NULL ? mp__pool_alloc_pieces(g, count, sizes, s, out)
                     : mp__arena_alloc_contiguous(pool, count, sizes, s, out);
  }
  return mp__pool_alloc_pieces(pool, count, sizes, s, out);
}

mp_status_t mp_pool_graph_create(mp_pool_t *parent, mp_pool_t **out) {
  /* A parent with arenas lends through the calling thread's arena. */
  return mp__graph_create(
      parent,
      parent != NULL && parent->arenas != NULL ? mp__arena_graph_borrow : NULL,
      out);
}

mp_status_t mp_pool_ipc_export(mp_pool_t *pool, void *ptr,
                               mp_ipc_handle_t *out) {
  if (pool == NULL || ptr == NULL || out == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_ipc_export: %s is NULL",
                    pool == NULL  ? "pool"
                    : ptr == NULL ? "ptr"
                                  : "out");
  MP__HIST_ENTRY(pool); /* the frees of the blocks it reaps */
  if (pool->arenas != NULL) {
    mp_pool_t *a = mp__arena_owner(pool, ptr);
    /* In no arena: the pool's own path says what ptr is not. */
    if (a != NULL)
      pool = a;
  }
  return mp__export_block(pool, ptr, out);
}

mp_status_t mp_pool_ipc_poll(mp_pool_t *pool, size_t *held) {
  if (pool == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_ipc_poll: pool is NULL");
  MP__HIST_ENTRY(pool); /* the frees of the blocks it reaps */
  if (pool->arenas == NULL)
    return mp__export_poll(pool, held);
  mp_status_t st = mp__pool_paused_now(pool, "mp_pool_ipc_poll");
  size_t sum = 0;
  for (size_t i = 0; st == MP_OK && i < pool->cfg.arenas; i++) {
    mp_pool_t *a = mp__arena_at(pool, i);
    size_t n = 0;
    if (a != NULL && (st = mp__export_poll(a, &n)) == MP_OK)
      sum += n;
  }
  if (st == MP_OK && held != NULL)
    *held = sum;
  return st;
}

mp_status_t mp_pool_trim(mp_pool_t *pool, size_t keep_bytes) {
  if (pool != NULL)
    MP__HIST_ENTRY(pool);
  return mp__pool_trim_marked(pool, keep_bytes);
}

mp_status_t mp__pool_trim_marked(mp_pool_t *pool, size_t keep_bytes) {
  if (pool == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_trim: pool is NULL");
  /* Refused from a host function, where the device refuses every call
   * (backend.h's caller_check; cuda.h, cuLaunchHostFunc: "must not make any
   * CUDA API calls"), before anything changes: a trim is synchronization
   * and frees, and its wait for another thread's device call in flight (a
   * free, which waits for the queued host functions, this one too) never
   * returned. */
  mp_status_t cst = mp__pool_may_wait(pool, "mp_pool_trim");
  if (cst != MP_OK)
    return cst;
  if (pool->arenas != NULL)
    return mp__arena_trim(pool, keep_bytes);
  /* The retries below ignore a refusal (the next trim tries again), and a
   * trim that succeeds leaves the caller's last error as it was
   * (status.h: a success does not replace it), as mp__segment_trim does:
   * before, a kept staging buffer's or a stray's refused retry was the
   * last error of a trim that answered MP_OK. */
  mp__error_kept_t was;
  mp__error_keep(&was);
  (void)mp__defrag_stage_retry(pool); /* a staging buffer a refusal kept */
  mp__pool_lock(pool);
  mp_status_t st = mp__pool_paused(pool, "mp_pool_trim");
  if (st == MP_OK && pool->nexports > 0)
    mp__export_reap(pool);
  if (st == MP_OK && mp__free_bytes(pool) > keep_bytes &&
      pool->parent == NULL) {
    st = mp__pool_sync(pool);
    if (st == MP_OK)
      st = mp__segment_trim(pool, keep_bytes, "mp_pool_trim");
  } else if (st == MP_OK) {
    /* Nothing free to give back, but a stray may be (mp__segment_trim
     * tries them too). */
    (void)mp__vrange_strays_retry(pool);
  }
  mp__pool_unlock(pool);
  if (st == MP_OK)
    mp__error_give_back(&was);
  return st;
}
