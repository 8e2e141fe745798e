/* segment.c - where a pool's memory comes from and how it goes back.
 *
 * Sources: a pool draws from its device, or (a child pool) from a range its
 * parent handed out; a child never grows. From the device, memory comes in
 * one of two shapes:
 *  - virtual (MP_POOL_VIRTUAL, device with virtual memory): one address range
 *    reserved once; growth maps a chunk at the top of the mapped prefix, so
 *    the new memory coalesces with a free block below it. A chunk is exactly
 *    one vm_map call (CUDA cannot unmap part of a mapping); trim unmaps whole
 *    chunks from the top while they lie inside the free tail block.
 *  - plain: one mp_device_alloc per segment; trim frees wholly free ones.
 *
 * Growth policy (keeps reserved close to live): a request that the cache
 * cannot serve maps max(what is missing above the free tail, segment_bytes,
 * reserved/128 capped at 16 MiB) rounded up to the granule; plain segments
 * are segment_bytes for requests up to segment_bytes/2 and the request
 * rounded up to 2 MiB otherwise. Near the cap, growth falls back to the
 * exact need. The minimum step bounds device calls (at most a few hundred
 * on the traces in ../shared/traces), the 1/128 bounds over-reservation to
 * under 1% (tuned on those traces with bench_pool_traces).
 *
 * Locking: every device call here runs with the pool lock dropped and the
 * pool marked inflight; only one grow or release is in flight at a time.
 * Invariant: reserved_bytes equals the sum of segment sizes, and a virtual
 * segment's chunks tile [base, base + size). */
#include <stdlib.h>
#include <string.h>

#include "pool_internal.h"

static size_t mp__round_up(size_t v, size_t to) {
  return (v + to - 1) / to * to;
}

void mp__pool_wait_idle(mp_pool_t *pool) {
  while (pool->inflight)
    pthread_cond_wait(&pool->idle_cv, &pool->lock);
}

static void mp__begin_device(mp_pool_t *pool) {
  pool->inflight = true;
  pthread_mutex_unlock(&pool->lock);
}

static void mp__end_device(mp_pool_t *pool) {
  pthread_mutex_lock(&pool->lock);
  pool->inflight = false;
  pthread_cond_broadcast(&pool->idle_cv);
}

mp__segment_t *mp__segment_containing(const mp_pool_t *pool, uintptr_t p) {
  for (mp__segment_t *s = pool->segs; s != NULL; s = s->next)
    if (p >= s->base && p < s->base + s->size)
      return s;
  return NULL;
}

static void mp__seg_push(mp_pool_t *pool, mp__segment_t *s) {
  s->prev = NULL;
  s->next = pool->segs;
  if (pool->segs)
    pool->segs->prev = s;
  pool->segs = s;
}

static void mp__seg_unlink(mp_pool_t *pool, mp__segment_t *s) {
  if (s->prev)
    s->prev->next = s->next;
  else
    pool->segs = s->next;
  if (s->next)
    s->next->prev = s->prev;
}

static void mp__reserved_add(mp_pool_t *pool, size_t bytes) {
  pool->st.reserved_bytes += bytes;
  pool->st.free_bytes += bytes;
  mp__stats_peaks(pool);
}

static void mp__reserved_sub(mp_pool_t *pool, size_t bytes) {
  pool->st.reserved_bytes -= bytes;
  pool->st.free_bytes -= bytes;
}

/* Grows the free tail of seg (or adds a free block) by bytes at its top. A
 * free tail that stream sidx may not use yet is left apart, or the new
 * memory would inherit its wait (UINT32_MAX: merge regardless). */
static void mp__tail_extend(mp_pool_t *pool, mp__segment_t *seg, uintptr_t addr,
                            size_t bytes, mp__block_t *rec, uint32_t sidx) {
  mp__block_t *t = seg->last;
  bool adjacent =
      t != NULL && (t->flags & MP__B_FREE) && t->addr + t->size == addr;
  if (adjacent && sidx != UINT32_MAX && !mp__deps_safe(pool, t, sidx, false)) {
    rec->flags |= MP__B_UNMERGED;
    adjacent = false;
  }
  if (adjacent) {
    mp__index_remove(pool, t);
    t->size += bytes;
    mp__index_insert(pool, t);
    mp__rec_free(pool, rec);
    pool->fresh = t;
    return;
  }
  rec->addr = addr;
  rec->size = bytes;
  mp__block_link(seg, seg->last, rec);
  mp__index_insert(pool, rec);
  pool->st.free_blocks++;
  pool->fresh = rec;
}

static mp_status_t mp__limit(mp_pool_t *pool) {
  return pool->cap_is_max ? MP_ELIMIT : MP_ENOMEM;
}

/* Reserves the virtual range on first use; false: use plain segments. */
static bool mp__vseg_ready(mp_pool_t *pool) {
  if (pool->vseg != NULL)
    return true;
  if (pool->vm_failed || pool->granule == 0)
    return false;
  size_t va = pool->cap;
  if (va > ((size_t)1 << 42))
    va = (size_t)1 << 42;
  va = mp__round_up(va, pool->granule);
  mp__segment_t *s = calloc(1, sizeof *s);
  if (s == NULL)
    return false;
  void *base = NULL;
  mp__begin_device(pool);
  mp_status_t st = mp__device_vm_reserve(pool->dev, va, &base);
  mp__end_device(pool);
  if (st != MP_OK) {
    free(s);
    pool->vm_failed = true;
    return false;
  }
  s->base = (uintptr_t)base;
  s->va_size = va;
  s->kind = MP__SEG_VIRTUAL;
  mp__seg_push(pool, s);
  pool->vseg = s;
  return true;
}

static mp_status_t mp__grow_virtual(mp_pool_t *pool, size_t size,
                                    uint32_t sidx) {
  mp__segment_t *v = pool->vseg;
  mp__block_t *t = v->last;
  size_t tail = 0;
  if (t != NULL && (t->flags & MP__B_FREE) &&
      mp__deps_safe(pool, t, sidx, false))
    tail = t->size;
  size_t need = mp__round_up(size - (tail < size ? tail : 0), pool->granule);
  if (need == 0)
    need = pool->granule;
  size_t step = pool->st.reserved_bytes / 128;
  if (step > ((size_t)16 << 20))
    step = (size_t)16 << 20;
  if (step < pool->cfg.segment_bytes)
    step = pool->cfg.segment_bytes;
  size_t grow = mp__round_up(need > step ? need : step, pool->granule);
  size_t room = pool->cap > pool->st.reserved_bytes
                    ? pool->cap - pool->st.reserved_bytes
                    : 0;
  if (grow > room)
    grow = need;
  if (grow > room)
    return mp__limit(pool);
  if (v->size + grow > v->va_size)
    return MP_ENOTSUP; /* range exhausted: the caller goes plain */
  if (v->nchunks == v->chunk_cap) {
    size_t cap = v->chunk_cap ? v->chunk_cap * 2 : 16;
    mp__chunk_t *c = realloc(v->chunks, cap * sizeof *c);
    if (c == NULL)
      return mp__fail(MP_ENOMEM, "out of host memory for chunk records");
    v->chunks = c;
    v->chunk_cap = cap;
  }
  mp__block_t *rec = mp__rec_new(pool);
  if (rec == NULL)
    return mp__fail(MP_ENOMEM, "out of host memory for block records");
  uintptr_t at = v->base + v->size;
  mp__begin_device(pool);
  mp_status_t st = mp__device_vm_map(pool->dev, (void *)at, grow);
  mp__end_device(pool);
  if (st != MP_OK) {
    mp__rec_free(pool, rec);
    return st;
  }
  v->chunks[v->nchunks].addr = at;
  v->chunks[v->nchunks].size = grow;
  v->nchunks++;
  v->size += grow;
  pool->st.device_alloc_count++;
  pool->st.segment_count++;
  mp__reserved_add(pool, grow);
  mp__tail_extend(pool, v, at, grow, rec, sidx);
  return MP_OK;
}

static mp_status_t mp__grow_plain(mp_pool_t *pool, size_t size) {
  size_t bytes = size <= pool->cfg.segment_bytes / 2
                     ? pool->cfg.segment_bytes
                     : mp__round_up(size, MP__LARGE_ROUND);
  if (bytes < size)
    bytes = size;
  size_t room = pool->cap > pool->st.reserved_bytes
                    ? pool->cap - pool->st.reserved_bytes
                    : 0;
  if (bytes > room)
    bytes = size;
  if (bytes > room)
    return mp__limit(pool);
  mp__segment_t *s = calloc(1, sizeof *s);
  mp__block_t *rec = mp__rec_new(pool);
  if (s == NULL || rec == NULL) {
    free(s);
    if (rec)
      mp__rec_free(pool, rec);
    return mp__fail(MP_ENOMEM, "out of host memory for a segment record");
  }
  void *p = NULL;
  mp__begin_device(pool);
  mp_status_t st = mp_device_alloc(pool->dev, bytes, &p);
  mp__end_device(pool);
  if (st != MP_OK) {
    free(s);
    mp__rec_free(pool, rec);
    return st;
  }
  s->base = (uintptr_t)p;
  s->size = bytes;
  s->kind = MP__SEG_PLAIN;
  mp__seg_push(pool, s);
  pool->st.device_alloc_count++;
  pool->st.segment_count++;
  mp__reserved_add(pool, bytes);
  mp__tail_extend(pool, s, s->base, bytes, rec, UINT32_MAX);
  return MP_OK;
}

mp_status_t mp__segment_grow(mp_pool_t *pool, size_t size, uint32_t sidx) {
  pool->fresh = NULL;
  if (pool->parent != NULL)
    return MP_ELIMIT; /* a child pool never grows */
  if (pool->inflight) {
    /* Someone else is growing or releasing: wait, then let the caller look
     * at the cache again. */
    mp__pool_wait_idle(pool);
    return MP_OK;
  }
  if ((pool->cfg.flags & MP_POOL_VIRTUAL) && mp__vseg_ready(pool)) {
    mp_status_t st = mp__grow_virtual(pool, size, sidx);
    if (st != MP_ENOTSUP)
      return st;
  }
  return mp__grow_plain(pool, size);
}

/* True when free block b can be given back now: no work pending on it. */
static bool mp__releasable(mp_pool_t *pool, mp__block_t *b) {
  return (b->flags & MP__B_FREE) && mp__deps_safe(pool, b, UINT32_MAX, false);
}

static bool mp__trim_plain_one(mp_pool_t *pool) {
  for (mp__segment_t *s = pool->segs; s != NULL; s = s->next) {
    if (s->kind != MP__SEG_PLAIN || s->first != s->last ||
        !mp__releasable(pool, s->first))
      continue;
    mp__block_t *b = s->first;
    mp__index_remove(pool, b);
    mp__seg_unlink(pool, s);
    mp__begin_device(pool);
    mp_status_t st = mp_device_free(pool->dev, (void *)s->base);
    mp__end_device(pool);
    if (st != MP_OK) {
      /* Keep it: the pool still owns the memory. */
      mp__seg_push(pool, s);
      mp__index_insert(pool, b);
      return false;
    }
    pool->st.free_blocks--;
    mp__rec_free(pool, b);
    pool->st.device_free_count++;
    pool->st.segment_count--;
    mp__reserved_sub(pool, s->size);
    free(s);
    return true;
  }
  return false;
}

static bool mp__trim_virtual_one(mp_pool_t *pool) {
  mp__segment_t *v = pool->vseg;
  if (v == NULL || v->nchunks == 0)
    return false;
  mp__block_t *t = v->last;
  mp__chunk_t c = v->chunks[v->nchunks - 1];
  if (t == NULL || !mp__releasable(pool, t) || c.addr < t->addr)
    return false;
  mp__index_remove(pool, t);
  t->size -= c.size;
  if (t->size == 0) {
    mp__block_unlink(v, t);
    pool->st.free_blocks--;
    mp__rec_free(pool, t);
    t = NULL;
  } else {
    mp__index_insert(pool, t);
  }
  v->nchunks--;
  v->size -= c.size;
  mp__reserved_sub(pool, c.size);
  mp__begin_device(pool);
  mp_status_t st = mp__device_vm_unmap(pool->dev, (void *)c.addr, c.size);
  mp__end_device(pool);
  if (st != MP_OK) {
    /* Still mapped: take it back as free memory at the top. */
    v->chunks[v->nchunks++] = c;
    v->size += c.size;
    mp__reserved_add(pool, c.size);
    mp__block_t *rec = mp__rec_new(pool);
    if (rec != NULL)
      mp__tail_extend(pool, v, c.addr, c.size, rec, UINT32_MAX);
    return false;
  }
  pool->st.device_free_count++;
  pool->st.segment_count--;
  return true;
}

void mp__segment_trim(mp_pool_t *pool, size_t keep) {
  if (pool->parent != NULL)
    return; /* a child's range goes back only when it is destroyed */
  mp__pool_wait_idle(pool);
  mp__block_merge_deferred(pool);
  while (pool->st.free_bytes > keep) {
    if (!mp__trim_virtual_one(pool) && !mp__trim_plain_one(pool))
      break;
  }
}

void mp__segment_release_all(mp_pool_t *pool) {
  mp__segment_t *s = pool->segs;
  while (s != NULL) {
    mp__segment_t *next = s->next;
    if (s->kind == MP__SEG_PLAIN) {
      mp_device_free(pool->dev, (void *)s->base);
      pool->st.device_free_count++;
    } else if (s->kind == MP__SEG_VIRTUAL) {
      for (size_t i = s->nchunks; i-- > 0;) {
        mp__device_vm_unmap(pool->dev, (void *)s->chunks[i].addr,
                            s->chunks[i].size);
        pool->st.device_free_count++;
      }
      mp__device_vm_release(pool->dev, (void *)s->base, s->va_size);
      free(s->chunks);
    }
    free(s);
    s = next;
  }
  pool->segs = NULL;
  pool->vseg = NULL;
}
