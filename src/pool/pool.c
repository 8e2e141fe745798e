/* pool.c - the caching best-fit pool: create/destroy, alloc/free, the
 * out-of-memory ladder, contiguous pieces, record_stream, trim and child
 * pools.
 *
 * An allocation rounds the request to the alignment, asks the free index for
 * the best fit usable on its stream (smallest block that fits, lowest
 * address on ties; at most MP__SEARCH_LIMIT candidates are looked at, so a
 * pile of blocks still pending on other streams cannot make it scan), splits
 * off the rest when it is worth keeping (mp__take_block), and records the
 * block in the live map. A free looks the block up, gives it deps for the
 * streams that used it, coalesces both neighbours and puts it back in the
 * index. No device call on either path
 * while the cache serves.
 *
 * The ladder when the cache cannot serve: grow -> reclaim (close and poll
 * stream epochs) -> synchronize the device, trim every free segment, grow
 * again -> defragment (mp__pool_defrag_on_oom, defrag.c) -> MP_ENOMEM, or
 * MP_ELIMIT when max_bytes (or a child's range) is what stops it.
 *
 * Invariant: between calls every block is either live (in the map) or free
 * (in the index), and stats equal what the blocks add up to (mp_pool_check
 * walks it). One mutex per pool; never held across a blocking device call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pool_internal.h"

#define MP__SEARCH_LIMIT 16

void mp__pool_lock(mp_pool_t *pool) {
  pthread_mutex_lock(&pool->lock);
}

void mp__pool_unlock(mp_pool_t *pool) {
  pthread_mutex_unlock(&pool->lock);
}

__attribute__((weak)) size_t
mp__pool_defrag_on_oom(mp_pool_t *pool, size_t need, mp_stream_t s) {
  (void)pool;
  (void)need;
  (void)s;
  return 0; /* nothing moved: defrag.c replaces this */
}

bool mp__pool_round(const mp_pool_t *pool, size_t bytes, size_t *out) {
  size_t a = pool->cfg.align;
  if (bytes > SIZE_MAX - (a - 1))
    return false;
  *out = (bytes + a - 1) & ~(a - 1);
  return true;
}

static unsigned mp__log2(size_t v) {
  return 63u - (unsigned)__builtin_clzll((unsigned long long)v);
}

/* A block above max_split is never split for a smaller request; it goes
 * whole only to a request above max_split that it fits within
 * max(1/8, 2 MiB), as the large segments made for such requests do. In
 * plain segments a free block spanning a whole small-request segment
 * (segment_bytes) is fresh memory and exempt, or nothing could be carved
 * from it; in the virtual range the limit is mp__vsplit_limit (at least
 * one growth step), and growth for a small request keeps the new memory
 * apart from free neighbours it would push above that limit, while the
 * big free blocks that cannot serve small requests are what reclaim and
 * trim unmap first. One exception: in a pool used from several streams
 * the free block at the top of the virtual range may be split whatever its
 * size. Reclaim there cannot wait for its streams, and a top block whose
 * last use is still running would otherwise swallow every chunk grown
 * above it once freed, so the range grew without bound (a graph workload
 * under max_split=64M: 14x its live bytes). */
size_t mp__vsplit_limit(const mp_pool_t *pool) {
  size_t ms = pool->cfg.max_split;
  if (ms == 0)
    return 0;
  size_t g = pool->granule ? pool->granule : 1;
  size_t seg = (pool->cfg.segment_bytes + g - 1) / g * g;
  ms = ms > seg ? ms : seg;
  /* Growth maps whole granules: a limit between two multiples would leave
   * the memory grown for a request just under it above it, unsplittable
   * and too big to be taken whole. */
  return ms > SIZE_MAX - (g - 1) ? ms : (ms + g - 1) / g * g;
}

/* The split limit of plain segments: max_split rounded up to the unit large
 * segments are made in, for the same reason. */
static size_t mp__plain_split_limit(const mp_pool_t *pool) {
  size_t ms = pool->cfg.max_split, u = MP__LARGE_ROUND;
  return ms > SIZE_MAX - (u - 1) ? ms : (ms + u - 1) / u * u;
}

static bool mp__split_allowed(const mp_pool_t *pool, const mp__block_t *b,
                              size_t size) {
  size_t ms = pool->cfg.max_split;
  if (ms == 0 || b->size <= ms || b->size == size)
    return true;
  if (b->seg->kind == MP__SEG_VIRTUAL)
    return b->size <= mp__vsplit_limit(pool) ||
           (b->next == NULL && pool->nstreams > 1);
  if (b->size <= mp__plain_split_limit(pool))
    return true;
  return b->prev == NULL && b->next == NULL &&
         b->seg->size == pool->cfg.segment_bytes;
}

static bool mp__whole_ok(const mp_pool_t *pool, const mp__block_t *b,
                         size_t size) {
  size_t slack = size / 8 > MP__LARGE_ROUND ? size / 8 : MP__LARGE_ROUND;
  return size > pool->cfg.max_split && b->size - size < slack;
}

/* pending: set when a block that fits was passed by only because another
 * stream's work on it has not completed yet. */
static mp__block_t *mp__search_ex(mp_pool_t *pool, size_t size, uint32_t sidx,
                                  bool *pending) {
  mp__block_t *b = mp__index_best_fit(pool, size);
  for (unsigned k = 0; b != NULL && k < MP__SEARCH_LIMIT; k++) {
    if (mp__split_allowed(pool, b, size) || mp__whole_ok(pool, b, size)) {
      if (mp__deps_safe(pool, b, sidx, true))
        return b;
      *pending = true;
    }
    b = mp__index_next(pool, b);
  }
  return NULL;
}

static mp__block_t *mp__search(mp_pool_t *pool, size_t size, uint32_t sidx) {
  bool pending = false;
  return mp__search_ex(pool, size, sidx, &pending);
}

/* Before growing for a block that another stream's recent work still holds,
 * give that work a moment: an idle stream passes its marker within
 * microseconds, and a device allocation costs far more than the wait. The
 * lock is dropped while waiting; at most MP__PENDING_WAIT_US in total. */
#define MP__PENDING_WAIT_US 200
static mp__block_t *mp__search_patiently(mp_pool_t *pool, size_t size,
                                         uint32_t sidx) {
  bool pending = false;
  mp__block_t *b = mp__search_ex(pool, size, sidx, &pending);
  for (unsigned waited = 0;
       b == NULL && pending && waited < MP__PENDING_WAIT_US; waited += 10) {
    struct timespec ts = {0, 10000};
    pthread_mutex_unlock(&pool->lock);
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&pool->lock);
    pending = false;
    b = mp__search_ex(pool, size, sidx, &pending);
  }
  return b;
}

/* Takes b out of the index and cuts it to size; the rest (at the high end)
 * goes back as a free block when it is worth keeping: at least
 * min(size/16, 1 MiB). Smaller slivers stay with the block (counted as
 * allocated): kept apart they would only pile up in the smallest classes,
 * slowing every insert there, and rarely serve anything. Returns the taken
 * block. */
static mp__block_t *mp__take_block(mp_pool_t *pool, mp__block_t *b,
                                   size_t size) {
  mp__index_remove(pool, b);
  pool->st.free_blocks--;
  size_t keep = size / 16 < MP__MiB ? size / 16 : MP__MiB;
  if (b->size > size && b->size - size >= keep &&
      mp__split_allowed(pool, b, size))
    mp__block_split(pool, b, size);
  return b;
}

/* Waits for the work of every stream the pool knows, by an event on each:
 * what the pool's blocks can be in use by (pool.h: a block used on another
 * stream is named by mp_pool_record_stream). No device synchronize, which
 * would also be a call CUDA forbids while another thread captures a graph
 * in global mode; only when a stream cannot be marked does it fall back to
 * one. With buf_bytes > 0 it also allocates a device buffer of that size
 * while the lock is down (defragmentation's staging buffer; *buf is NULL
 * when the device has no room). */
mp_status_t mp__pool_sync_alloc(mp_pool_t *pool, size_t buf_bytes, void **buf) {
  if (MP__UNLIKELY(pool->ncapturing > 0))
    return mp__fail(MP_EBUSY,
                    "a stream of the pool is being captured (graph pool): no "
                    "synchronize until mp_pool_graph_end");
  mp__pool_wait_sync(pool);
  uint64_t snap = mp__streams_sync_begin(pool);
  mp__sync_set_t set;
  mp__streams_sync_events(pool, &set);
  mp__pool_sync_begin(pool);
  mp_status_t st = mp__sync_set_wait(pool->dev, &set);
  if (st == MP_OK && buf_bytes > 0 &&
      mp_device_alloc(pool->dev, buf_bytes, buf) != MP_OK)
    *buf = NULL;
  mp__pool_sync_end(pool);
  mp__sync_set_release(pool, &set);
  if (st == MP_OK)
    mp__streams_sync_end(pool, snap);
  return st;
}

mp_status_t mp__pool_sync(mp_pool_t *pool) {
  return mp__pool_sync_alloc(pool, 0, NULL);
}

static mp_status_t mp__oom(mp_pool_t *pool, mp_status_t st, size_t asked) {
  char a[32], r[32], al[32], lf[32];
  pool->st.oom_count++;
  MP__HIST(pool, MP__H_OOM,
           pool->cap > pool->st.reserved_bytes
               ? pool->cap - pool->st.reserved_bytes
               : 0,
           asked, 0);
  return mp__fail(
      st, "%s: asked %s, reserved %s, allocated %s, largest free block %s",
      st == MP_ELIMIT ? (pool->parent ? "child pool full" : "pool max_bytes")
                      : "out of device memory",
      mp__fmt_bytes(a, sizeof a, asked),
      mp__fmt_bytes(r, sizeof r, pool->st.reserved_bytes),
      mp__fmt_bytes(al, sizeof al, pool->st.allocated_bytes),
      mp__fmt_bytes(lf, sizeof lf, mp__stats_largest_free(pool)));
}

static bool mp__is_oom(mp_status_t st) {
  return st == MP_ENOMEM || st == MP_ELIMIT;
}

/* Grows until the cache serves or growing fails; returns the block. */
static mp_status_t mp__grow_and_search(mp_pool_t *pool, size_t size,
                                       uint32_t sidx, mp__block_t **out) {
  /* Only growths this thread made count: waiting for another thread's
   * grow or release is progress too, and is followed by a fresh look. */
  for (int grown = 0; grown < 8;) {
    mp_status_t st = mp__segment_grow(pool, size, sidx);
    if (st != MP_OK)
      return st;
    mp__block_t *f = pool->fresh;
    pool->fresh = NULL;
    grown += f != NULL;
    if ((*out = mp__search(pool, size, sidx)) != NULL)
      return MP_OK;
    /* The search looks at a bounded number of candidates; the block that
     * received the new memory is one more, and fits by construction. */
    if (f != NULL && (f->flags & MP__B_FREE) && f->size >= size &&
        (mp__split_allowed(pool, f, size) || mp__whole_ok(pool, f, size)) &&
        mp__deps_safe(pool, f, sidx, false)) {
      *out = f;
      return MP_OK;
    }
  }
  return MP_ENOMEM;
}

mp_status_t mp__pool_take(mp_pool_t *pool, size_t size, uint32_t sidx,
                          mp__block_t **out) {
  mp__block_t *b = mp__search_patiently(pool, size, sidx);
  if (b != NULL)
    goto got;
  mp_status_t st = mp__grow_and_search(pool, size, sidx, &b);
  if (st == MP_OK)
    goto got;
  if (!mp__is_oom(st))
    return st;
  /* Rung: reclaim blocks whose streams have moved on. */
  mp__streams_poll(pool, true);
  if ((b = mp__search(pool, size, sidx)) != NULL)
    goto got;
  /* Rung: synchronize, give back every free segment, grow again. */
  if (pool->st.free_bytes > 0 || pool->nstreams > 1) {
    pool->st.alloc_retry_count++;
    if (mp__pool_sync(pool) == MP_OK) {
      if ((b = mp__search(pool, size, sidx)) != NULL)
        goto got;
      mp__segment_trim(pool, 0);
      st = mp__grow_and_search(pool, size, sidx, &b);
      if (st == MP_OK)
        goto got;
      if (!mp__is_oom(st))
        return st;
    }
  }
  /* Rung: defragment movable blocks (it synchronizes the device: not while
   * a stream of the pool is captured). */
  if ((pool->cfg.flags & MP_POOL_DEFRAG_ON_OOM) && pool->ncapturing == 0) {
    mp_stream_t s = pool->streams[sidx].s;
    pthread_mutex_unlock(&pool->lock);
    size_t moved = mp__pool_defrag_on_oom(pool, size, s);
    pthread_mutex_lock(&pool->lock);
    if (moved > 0) {
      if ((b = mp__search(pool, size, sidx)) != NULL)
        goto got;
      st = mp__grow_and_search(pool, size, sidx, &b);
      if (st == MP_OK)
        goto got;
    }
  }
  return mp__oom(pool, st == MP_ELIMIT ? MP_ELIMIT : MP_ENOMEM, size);
got:
  *out = mp__take_block(pool, b, size);
  return MP_OK;
}

/* Puts a taken, never-live block back. */
static void mp__untake(mp_pool_t *pool, mp__block_t *b) {
  pool->st.free_blocks++;
  b = mp__block_coalesce(pool, b);
  mp__index_insert(pool, b);
}

void mp__block_make_live(mp_pool_t *pool, mp__block_t *b, size_t requested,
                         uint32_t sidx) {
  b->flags = 0;
  b->requested = requested;
  b->sidx = sidx;
  pool->streams[sidx].refs++;
  b->ndeps = 0;
  b->handle = NULL;
  b->child = NULL;
  mp__map_insert(pool, b); /* room was reserved before the take */
  pool->st.allocated_bytes += b->size;
  pool->st.free_bytes -= b->size;
  pool->st.requested_bytes += requested;
  pool->st.live_blocks++;
  pool->st.alloc_count++;
  mp__stats_peaks(pool);
  MP__HIST(pool, MP__H_ALLOC, b->addr, b->size, MP__HIST_STREAM(pool, sidx));
}

void mp__block_release(mp_pool_t *pool, mp__block_t *b) {
  if (MP__UNLIKELY(pool->hist.ev != NULL))
    mp__history_free(pool, b->addr, b->size, MP__HIST_STREAM(pool, b->sidx));
  pool->st.allocated_bytes -= b->size;
  pool->st.free_bytes += b->size;
  pool->st.requested_bytes -= b->requested;
  pool->st.live_blocks--;
  pool->st.free_count++;
  b->requested = 0;
  b->handle = NULL;
  b->child = NULL;
  mp__deps_on_free(pool, b);
  b->flags &= MP__B_SYNC;
  pool->st.free_blocks++;
  b = mp__block_coalesce(pool, b);
  mp__index_insert(pool, b);
}

/* ---- create / destroy --------------------------------------------------- */

mp_status_t mp__pool_new(mp_device_t *dev, const mp_pool_config_t *cfg,
                         mp_pool_t **out) {
  mp_pool_t *pool = calloc(1, sizeof *pool);
  if (pool == NULL)
    return mp__fail(MP_ENOMEM, "out of host memory creating a pool");
  if (pthread_mutex_init(&pool->lock, NULL) != 0) {
    free(pool);
    return mp__fail(MP_ENOMEM, "cannot create the pool's lock");
  }
  pthread_cond_init(&pool->idle_cv, NULL);
  pool->dev = dev;
  pool->cfg = *cfg;
  if (pool->cfg.align == 0)
    pool->cfg.align = MP__DEFAULT_ALIGN;
  if (pool->cfg.segment_bytes == 0)
    pool->cfg.segment_bytes = MP__DEFAULT_SEGMENT;
  pool->cfg.segment_bytes =
      (pool->cfg.segment_bytes + pool->cfg.align - 1) & ~(pool->cfg.align - 1);
  pool->align_log2 = mp__log2(pool->cfg.align);
  pool->sync_gen = 1;
  pool->sync_done = 1;
  mp_status_t st = mp__history_init(pool);
  if (st == MP_OK) {
    st = mp__device_watch(dev, mp__stream_gone, pool);
    if (st != MP_OK)
      mp__history_release(pool);
  }
  if (st != MP_OK) {
    pthread_cond_destroy(&pool->idle_cv);
    pthread_mutex_destroy(&pool->lock);
    free(pool);
    return st;
  }
  *out = pool;
  return MP_OK;
}

void mp__pool_free_host(mp_pool_t *pool) {
  mp__device_unwatch(pool->dev, mp__stream_gone, pool);
  mp__history_release(pool);
  mp__streams_release(pool);
  mp__rec_release_all(pool);
  mp__index_release(pool);
  free(pool->map);
  free(pool->routes);
  free(pool->granges);
  pthread_cond_destroy(&pool->idle_cv);
  pthread_mutex_destroy(&pool->lock);
  free(pool);
}

/* The cap that max_bytes or max_fraction (of the device's memory) give,
 * else the device's size, else none. */
static mp_status_t mp__pool_cap_for(const mp_pool_t *pool, size_t max_bytes,
                                    double fraction, size_t *cap,
                                    bool *is_max) {
  size_t total = 0;
  bool told = mp_device_mem_info(pool->dev, NULL, &total) == MP_OK && total > 0;
  *is_max = max_bytes != 0 || fraction > 0;
  if (max_bytes != 0) {
    *cap = max_bytes;
  } else if (fraction > 0) {
    if (!told)
      return mp__fail(MP_EINVAL, "pool config: max_fraction needs the "
                                 "device's size, which it does not tell");
    *cap = (size_t)((double)total * fraction) & ~(pool->cfg.align - 1);
  } else {
    *cap = told ? total : SIZE_MAX;
  }
  return MP_OK;
}

mp_status_t mp_pool_set_max_fraction(mp_pool_t *pool, double fraction) {
  if (pool == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_set_max_fraction: pool is NULL");
  if (!(fraction >= 0 && fraction <= 1))
    return mp__fail(MP_EINVAL, "mp_pool_set_max_fraction: %g is not in [0, 1]",
                    fraction);
  if (pool->parent != NULL)
    return mp__fail(MP_EINVAL,
                    "mp_pool_set_max_fraction: a %s pool draws "
                    "from its parent's cap",
                    pool->graph ? "graph" : "child");
  size_t cap = 0;
  bool is_max = false;
  mp_status_t st = mp__pool_cap_for(pool, 0, fraction, &cap, &is_max);
  if (st != MP_OK)
    return st;
  pthread_mutex_lock(&pool->lock);
  pool->cap = cap;
  pool->cap_is_max = is_max;
  pool->cfg.max_bytes = 0;
  pool->cfg.max_fraction = fraction;
  pthread_mutex_unlock(&pool->lock);
  return MP_OK;
}

mp_status_t mp_pool_create(mp_device_t *dev, const mp_pool_config_t *cfg,
                           mp_pool_t **out) {
  if (out == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_create: out is NULL");
  if (dev == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_create: device is NULL");
  mp_pool_config_t c;
  if (cfg == NULL) {
    mp_pool_config_init(&c);
    cfg = &c;
  }
  mp_status_t st = mp__config_validate(cfg);
  if (st != MP_OK)
    return st;
  mp_pool_t *pool;
  if ((st = mp__pool_new(dev, cfg, &pool)) != MP_OK)
    return st;
  if ((st = mp__pool_cap_for(pool, cfg->max_bytes, cfg->max_fraction,
                             &pool->cap, &pool->cap_is_max)) != MP_OK) {
    mp__pool_free_host(pool);
    return st;
  }
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
  }
  size_t g = 0;
  if (cfg->flags & MP_POOL_VIRTUAL) {
    /* A device without virtual memory is not a failure of this call: keep
     * the caller's last error as it was. */
    char saved[256];
    snprintf(saved, sizeof saved, "%s", mp_last_error());
    if (mp__device_vm_granularity(dev, &g) == MP_OK && g != 0 &&
        (g & (g - 1)) == 0)
      pool->granule = g < pool->cfg.align ? pool->cfg.align : g;
    else
      mp__fail(MP_OK, "%s", saved);
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
  *out = pool;
  return MP_OK;
}

mp_status_t mp_pool_destroy(mp_pool_t *pool) {
  if (pool == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_destroy: pool is NULL");
  if (pool->graph)
    return mp_pool_graph_release(pool);
  pthread_mutex_lock(&pool->lock);
  if (pool->children > 0) {
    size_t n = pool->children;
    pthread_mutex_unlock(&pool->lock);
    return mp__fail(MP_EBUSY, "mp_pool_destroy: %zu child pool%s still live", n,
                    n == 1 ? "" : "s");
  }
  mp__pool_wait_sync(pool);
  mp__handle_retire_all(pool);
  mp__pool_pause_release(pool);
  mp__export_release_all(pool);
  /* The streams that used the pool must be done before memory goes back:
   * an event on each, not a device synchronize (another thread may be
   * capturing a graph). */
  mp__sync_set_t set = {0};
  if (pool->nstreams > 0)
    mp__streams_sync_events(pool, &set);
  pthread_mutex_unlock(&pool->lock);
  if (pool->nstreams > 0)
    mp__sync_set_wait(pool->dev, &set);
  pthread_mutex_lock(&pool->lock);
  mp__sync_set_release(pool, &set);
  pthread_mutex_unlock(&pool->lock);
  if (pool->parent != NULL) {
    mp_pool_t *parent = pool->parent;
    pthread_mutex_lock(&parent->lock);
    mp__block_t *b = pool->parent_block;
    mp__map_remove(parent, b);
    mp__block_release(parent, b);
    parent->children--;
    pthread_mutex_unlock(&parent->lock);
    for (mp__segment_t *s = pool->segs; s != NULL;) {
      mp__segment_t *n = s->next;
      free(s);
      s = n;
    }
  } else {
    mp__segment_release_all(pool);
  }
  mp__pool_free_host(pool);
  return MP_OK;
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
  pthread_mutex_lock(&pool->lock);
  mp__pool_wait_idle(pool); /* no map in flight misses the new peer */
  unsigned n = atomic_load(&pool->npeers);
  mp_status_t st = MP_OK;
  for (unsigned i = 0; i < n; i++)
    if (mp__device_ordinal(pool->peers[i]) == mp__device_ordinal(peer))
      goto out; /* already */
  if (n == sizeof pool->peers / sizeof *pool->peers) {
    st = mp__fail(MP_ENOMEM, "mp_pool_set_access: at most %u peers",
                  (unsigned)(sizeof pool->peers / sizeof *pool->peers));
    goto out;
  }
  /* The chunks mapped now, then the peer for every later map. */
  mp__segment_t *v = pool->vseg;
  for (size_t i = 0; v != NULL && !pool->paused && i < v->nchunks; i++)
    if ((st = mp__device_vm_access(pool->dev, (void *)v->chunks[i].addr,
                                   v->chunks[i].size, peer)) != MP_OK)
      goto out;
  pool->peers[n] = peer;
  atomic_store_explicit(&pool->npeers, n + 1, memory_order_release);
out:
  pthread_mutex_unlock(&pool->lock);
  return st;
}

mp_status_t mp_pool_mem_info(mp_pool_t *pool, size_t *free_bytes,
                             size_t *total_bytes) {
  if (pool == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_mem_info: pool is NULL");
  size_t f = 0, t = 0;
  mp_status_t st = mp_device_mem_info(pool->dev, &f, &t);
  if (st != MP_OK)
    return st;
  pthread_mutex_lock(&pool->lock);
  /* Paused: nothing reserved while the live blocks still count. */
  size_t idle = pool->st.reserved_bytes > pool->st.allocated_bytes
                    ? pool->st.reserved_bytes - pool->st.allocated_bytes
                    : 0;
  size_t used = pool->st.allocated_bytes;
  size_t cap = pool->cap_is_max ? pool->cap : SIZE_MAX;
  pthread_mutex_unlock(&pool->lock);
  f = f > SIZE_MAX - idle ? SIZE_MAX : f + idle;
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
  pthread_mutex_lock(&pool->lock);
  bool in = mp__segment_containing(pool, (uintptr_t)ptr) != NULL;
  pthread_mutex_unlock(&pool->lock);
  return in;
}

mp_device_t *mp_pool_device(const mp_pool_t *pool) {
  return pool ? pool->dev : NULL;
}

/* ---- alloc / free ------------------------------------------------------- */

mp_status_t mp__pool_alloc_locked(mp_pool_t *pool, size_t bytes, mp_stream_t s,
                                  void **out) {
  uint32_t sidx;
  mp_status_t st = mp__pool_paused(pool, "allocation");
  if (MP__UNLIKELY(pool->nheld > 0) && st == MP_OK)
    mp__export_reap(pool);
  if (st == MP_OK)
    st = mp__stream_index(pool, s, &sidx);
  if (st != MP_OK)
    return st;
  size_t size;
  if (!mp__pool_round(pool, bytes, &size) || size > pool->cap) {
    size_t asked = bytes;
    return mp__oom(pool, pool->cap_is_max ? MP_ELIMIT : MP_ENOMEM, asked);
  }
  mp__block_t *b;
  if ((st = mp__pool_take(pool, size, sidx, &b)) != MP_OK)
    return st;
  if (!mp__map_reserve(pool, 1)) {
    mp__untake(pool, b);
    return mp__fail(MP_ENOMEM, "out of host memory for the block map");
  }
  mp__block_make_live(pool, b, bytes, sidx);
  *out = (void *)b->addr;
  return MP_OK;
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
  MP__HIST_ENTRY(pool);
  pthread_mutex_lock(&pool->lock);
  if (MP__UNLIKELY(pool->nroutes > 0)) {
    mp_pool_t *g = mp__graph_route(pool, s);
    if (g != NULL) {
      pthread_mutex_unlock(&pool->lock);
      return mp_pool_alloc(g, bytes, s, out);
    }
  }
  mp_status_t st = mp__pool_alloc_locked(pool, bytes, s, out);
  if (mp__pool_oom_retry(pool, st, bytes))
    st = mp__pool_alloc_locked(pool, bytes, s, out);
  pthread_mutex_unlock(&pool->lock);
  return st;
}

bool mp__pool_oom_retry(mp_pool_t *pool, mp_status_t st, size_t bytes) {
  if ((st != MP_ENOMEM && st != MP_ELIMIT) || pool->oom_fn == NULL)
    return false;
  mp_pool_oom_handler_t fn = pool->oom_fn;
  void *ctx = pool->oom_ctx;
  char why[256];
  snprintf(why, sizeof why, "%s", mp_last_error());
  pthread_mutex_unlock(&pool->lock);
  int again = fn(pool, bytes, st, ctx);
  pthread_mutex_lock(&pool->lock);
  if (!again)
    mp__fail(st, "%s", why); /* the failure, not what the handler did */
  return again != 0;
}

mp_status_t mp_pool_set_oom_handler(mp_pool_t *pool, mp_pool_oom_handler_t fn,
                                    void *ctx) {
  if (pool == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_set_oom_handler: pool is NULL");
  pthread_mutex_lock(&pool->lock);
  pool->oom_fn = fn;
  pool->oom_ctx = fn != NULL ? ctx : NULL;
  pthread_mutex_unlock(&pool->lock);
  return MP_OK;
}

/* Looks up a live block for a caller's pointer, with a message naming what
 * is wrong with it. movable_ok: a movable block's current pointer is
 * accepted (record_stream), not only raw blocks (free). */
mp_status_t mp__pool_find_live(mp_pool_t *pool, const char *fn, void *ptr,
                               bool movable_ok, mp__block_t **out,
                               size_t *slot) {
  uintptr_t p = (uintptr_t)ptr;
  mp__block_t *b = mp__map_lookup(pool, p, slot);
  if (b == NULL) {
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
  if (b->flags & MP__B_CHILD)
    return mp__fail(MP_EINVAL,
                    "%s: %p is a child pool's range: destroy the child", fn,
                    ptr);
  if ((b->flags & MP__B_MOVABLE) && !movable_ok)
    return mp__fail(MP_EINVAL, "%s: %p is a movable block: use mp_handle_free",
                    fn, ptr);
  if (MP__UNLIKELY(b->flags & MP__B_HELD))
    return mp__fail(MP_EINVAL,
                    "%s: %p was freed already (held until the processes "
                    "that imported it let go)",
                    fn, ptr);
  *out = b;
  return MP_OK;
}

bool mp__pool_block_of(mp_pool_t *pool, const void *ptr, void **base,
                       size_t *size) {
  uintptr_t p = (uintptr_t)ptr;
  bool found = false;
  pthread_mutex_lock(&pool->lock);
  mp_pool_t *g = pool->ngranges ? mp__graph_owner(pool, p) : NULL;
  mp__segment_t *seg = g == NULL ? mp__segment_containing(pool, p) : NULL;
  for (mp__block_t *x = seg ? seg->first : NULL; x != NULL; x = x->next)
    if (p >= x->addr && p - x->addr < x->size) {
      found = !(x->flags & (MP__B_FREE | MP__B_HOLE | MP__B_CHILD));
      *base = (void *)x->addr;
      *size = x->size;
      break;
    }
  pthread_mutex_unlock(&pool->lock);
  return g != NULL ? mp__pool_block_of(g, ptr, base, size) : found;
}

mp_status_t mp_pool_record_stream(mp_pool_t *pool, void *ptr, mp_stream_t s) {
  if (pool == NULL || ptr == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_record_stream: %s is NULL",
                    pool == NULL ? "pool" : "ptr");
  pthread_mutex_lock(&pool->lock);
  if (MP__UNLIKELY(pool->ngranges > 0)) {
    mp_pool_t *g = mp__graph_owner(pool, (uintptr_t)ptr);
    if (g != NULL) {
      pthread_mutex_unlock(&pool->lock);
      return mp_pool_record_stream(g, ptr, s);
    }
  }
  mp__block_t *b = NULL; /* set when mp__find_live succeeds */
  uint32_t sidx;
  size_t slot;
  mp_status_t st = mp__pool_paused(pool, "mp_pool_record_stream");
  if (st == MP_OK)
    st =
        mp__pool_find_live(pool, "mp_pool_record_stream", ptr, true, &b, &slot);
  if (st == MP_OK)
    st = mp__stream_index(pool, s, &sidx);
  if (st == MP_OK)
    mp__stream_add_use(pool, b, sidx);
  pthread_mutex_unlock(&pool->lock);
  return st;
}

/* The frees: ordered on the block's own stream, also on s, or after every
 * stream the pool knows. */
typedef enum { MP__FREE_OWN, MP__FREE_ON, MP__FREE_ALL } mp__free_how_t;

static mp_status_t mp__pool_free_as(mp_pool_t *pool, void *ptr,
                                    mp__free_how_t how, mp_stream_t s,
                                    const char *fn) {
  if (ptr == NULL)
    return MP_OK;
  pthread_mutex_lock(&pool->lock);
  if (MP__UNLIKELY(pool->ngranges > 0)) {
    mp_pool_t *g = mp__graph_owner(pool, (uintptr_t)ptr);
    if (g != NULL) {
      pthread_mutex_unlock(&pool->lock);
      return mp__pool_free_as(g, ptr, how, s, fn);
    }
  }
  mp__block_t *b = NULL; /* set when mp__find_live succeeds */
  uint32_t sidx = 0;
  size_t slot;
  mp_status_t st = mp__pool_paused(pool, fn);
  if (st == MP_OK)
    st = mp__pool_find_live(pool, fn, ptr, false, &b, &slot);
  if (st == MP_OK && how == MP__FREE_ON)
    st = mp__stream_index(pool, s, &sidx);
  if (st == MP_OK) {
    if (how == MP__FREE_ON)
      mp__stream_add_use(pool, b, sidx);
    else if (how == MP__FREE_ALL)
      mp__stream_use_all(pool, b);
    if (MP__UNLIKELY(b->flags & MP__B_EXPORTED) && mp__export_hold(pool, b)) {
      /* imported elsewhere: released when its leases close */
    } else {
      mp__map_remove_slot(pool, slot);
      /* Before b joins its free neighbours: the new block's own stream has
       * not reached the free yet, and merged in it would hold them back. */
      mp__segment_release_above(pool);
      mp__block_release(pool, b);
    }
  }
  bool last = MP__UNLIKELY(pool->graph) && mp__graph_take_last(pool);
  pthread_mutex_unlock(&pool->lock);
  mp__graph_finish_if(pool, last);
  return st;
}

mp_status_t mp_pool_free(mp_pool_t *pool, void *ptr) {
  if (MP__UNLIKELY(pool == NULL))
    return mp__fail(MP_EINVAL, "mp_pool_free: pool is NULL");
  MP__HIST_ENTRY(pool);
  return mp__pool_free_as(pool, ptr, MP__FREE_OWN, NULL, "mp_pool_free");
}

mp_status_t mp__pool_free_on(mp_pool_t *pool, void *ptr, mp_stream_t s,
                             const char *fn) {
  return mp__pool_free_as(pool, ptr, MP__FREE_ON, s, fn);
}

mp_status_t mp_pool_free_after_all(mp_pool_t *pool, void *ptr) {
  if (MP__UNLIKELY(pool == NULL))
    return mp__fail(MP_EINVAL, "mp_pool_free_after_all: pool is NULL");
  MP__HIST_ENTRY(pool);
  return mp__pool_free_as(pool, ptr, MP__FREE_ALL, NULL,
                          "mp_pool_free_after_all");
}

mp_status_t mp_pool_add_stream(mp_pool_t *pool, mp_stream_t s) {
  if (pool == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_add_stream: pool is NULL");
  pthread_mutex_lock(&pool->lock);
  uint32_t sidx;
  mp_status_t st = mp__pool_paused(pool, "mp_pool_add_stream");
  if (st == MP_OK)
    st = mp__stream_index(pool, s, &sidx);
  pthread_mutex_unlock(&pool->lock);
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
  size_t total = 0;
  bool overflow = false;
  for (size_t i = 0; i < count && !overflow; i++) {
    size_t r;
    overflow = !mp__pool_round(pool, sizes[i], &r) || total > SIZE_MAX - r;
    total += overflow ? 0 : r;
  }
  MP__HIST_ENTRY(pool);
  pthread_mutex_lock(&pool->lock);
  mp_status_t pst = mp__pool_paused(pool, "mp_pool_alloc_contiguous");
  if (pst != MP_OK) {
    pthread_mutex_unlock(&pool->lock);
    return pst;
  }
  if (overflow) {
    /* As mp_pool_alloc does for a size that cannot be rounded. */
    mp_status_t st =
        mp__oom(pool, pool->cap_is_max ? MP_ELIMIT : MP_ENOMEM, SIZE_MAX);
    pthread_mutex_unlock(&pool->lock);
    return st;
  }
  uint32_t sidx;
  mp__block_t *b = NULL;
  mp__block_t *recs = NULL;
  mp_status_t st = mp__stream_index(pool, s, &sidx);
  if (st == MP_OK && total > pool->cap)
    st = mp__oom(pool, pool->cap_is_max ? MP_ELIMIT : MP_ENOMEM, total);
  /* Records for the pieces first, so that nothing can fail once the block
   * is cut. */
  for (size_t i = 1; st == MP_OK && i < count; i++) {
    mp__block_t *r = mp__rec_new(pool);
    if (r == NULL) {
      st = mp__fail(MP_ENOMEM, "out of host memory for block records");
      break;
    }
    r->next_rec = recs;
    recs = r;
  }
  if (st == MP_OK)
    st = mp__pool_take(pool, total, sidx, &b);
  if (st == MP_OK && !mp__map_reserve(pool, count)) {
    mp__untake(pool, b);
    st = mp__fail(MP_ENOMEM, "out of host memory for the block map");
  }
  if (st != MP_OK) {
    while (recs != NULL) {
      mp__block_t *n = recs->next_rec;
      mp__rec_free(pool, recs);
      recs = n;
    }
    pthread_mutex_unlock(&pool->lock);
    return st;
  }
  /* b may exceed total when max_split kept it whole: the last piece gets the
   * slack. */
  mp__block_t *cur = b;
  for (size_t i = 0; i < count; i++) {
    size_t r = 0;
    mp__pool_round(pool, sizes[i], &r);
    out[i] = (void *)cur->addr;
    if (i + 1 < count) {
      mp__block_t *rest = recs;
      recs = recs->next_rec;
      rest->addr = cur->addr + r;
      rest->size = cur->size - r;
      cur->size = r;
      mp__block_link(cur->seg, cur, rest);
      mp__block_make_live(pool, cur, sizes[i], sidx);
      cur = rest;
    } else {
      mp__block_make_live(pool, cur, sizes[i], sidx);
    }
  }
  pthread_mutex_unlock(&pool->lock);
  return MP_OK;
}

mp_status_t mp_pool_trim(mp_pool_t *pool, size_t keep_bytes) {
  if (pool == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_trim: pool is NULL");
  MP__HIST_ENTRY(pool);
  pthread_mutex_lock(&pool->lock);
  mp_status_t st = mp__pool_paused(pool, "mp_pool_trim");
  if (st == MP_OK && pool->nexports > 0)
    mp__export_reap(pool);
  if (st == MP_OK && pool->st.free_bytes > keep_bytes && pool->parent == NULL) {
    st = mp__pool_sync(pool);
    if (st == MP_OK)
      mp__segment_trim(pool, keep_bytes);
  }
  pthread_mutex_unlock(&pool->lock);
  return st;
}

/* ---- child pools -------------------------------------------------------- */

mp_status_t mp_pool_create_child(mp_pool_t *parent, size_t bytes,
                                 mp_pool_t **out) {
  if (parent == NULL || out == NULL || bytes == 0)
    return mp__fail(MP_EINVAL, "mp_pool_create_child: %s",
                    parent == NULL ? "parent is NULL"
                    : out == NULL  ? "out is NULL"
                                   : "0 bytes");
  mp_pool_config_t cfg = parent->cfg;
  cfg.flags &= ~(unsigned)MP_POOL_VIRTUAL;
  cfg.max_bytes = 0;
  /* max_split keeps big free blocks whole for requests that need them, and
   * lets reclaim and trim give them back; a child's range is fixed and goes
   * back only whole, so under the limit its one free block could never be
   * carved for a small request. */
  cfg.max_split = 0;
  mp_pool_t *child;
  mp_status_t st = mp__pool_new(parent->dev, &cfg, &child);
  if (st != MP_OK)
    return st;
  mp__segment_t *seg = calloc(1, sizeof *seg);
  mp__block_t *rec = mp__rec_new(child);
  if (seg == NULL || rec == NULL) {
    free(seg);
    mp__pool_free_host(child);
    return mp__fail(MP_ENOMEM, "out of host memory creating a child pool");
  }
  void *base = NULL;
  pthread_mutex_lock(&parent->lock);
  st = mp__pool_alloc_locked(parent, bytes, NULL, &base);
  if (st == MP_OK) {
    mp__block_t *b = mp__map_find(parent, (uintptr_t)base);
    b->flags |= MP__B_CHILD;
    b->child = child;
    parent->children++;
    child->parent_block = b;
    seg->base = b->addr;
    seg->size = seg->span = b->size;
  }
  pthread_mutex_unlock(&parent->lock);
  if (st != MP_OK) {
    free(seg);
    mp__pool_free_host(child);
    return st;
  }
  child->parent = parent;
  child->cap = seg->size;
  child->cap_is_max = true;
  child->cfg.max_bytes = seg->size;
  seg->kind = MP__SEG_RANGE;
  child->segs = seg;
  child->st.reserved_bytes = child->st.peak_reserved_bytes = seg->size;
  child->st.free_bytes = seg->size;
  child->st.segment_count = 1;
  rec->addr = seg->base;
  rec->size = seg->size;
  mp__block_link(seg, NULL, rec);
  mp__index_insert(child, rec);
  child->st.free_blocks = 1;
  *out = child;
  return MP_OK;
}
