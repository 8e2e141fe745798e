/* handle.c - movable-block handles that can be told stale.
 *
 * A handle names a slot of one process-wide table, never the block record
 * itself: records are reused as soon as a block is freed, so a record
 * pointer kept after mp_handle_free would silently name the next movable
 * block to get that record. A slot holds (generation, pool, block); the
 * handle's value packs (slot index + 1, generation), and freeing the block
 * bumps the slot's generation, so every copy of the old handle is stale from
 * then on: mp_handle_ptr gives NULL and mp_handle_free MP_EINVAL, however
 * often the slot has been reused since (until 2^32 reuses of one slot).
 *
 * Slots live in chunks that are never freed or moved, so a stale handle's
 * slot can always be read. The table grows under its own mutex, taken only
 * inside a pool lock (pool lock -> table lock, never the other way). A
 * slot's generation and pool change only under its pool's lock, so a reader
 * that finds the generation unchanged under that lock reads a block record
 * that defragmentation is not rewriting (mp_handle_ptr takes the lock). */
#include <stdatomic.h>
#include <stdlib.h>

#include "pool_internal.h"

#define MP__SLOT_CHUNK_LOG2 12
#define MP__SLOT_CHUNK      (1u << MP__SLOT_CHUNK_LOG2)
#define MP__SLOT_CHUNKS     4096u /* 16M handles live at once */

typedef struct mp__hslot {
  _Atomic uint32_t gen;
  uint32_t idx;              /* its own index */
  uint32_t next_free;        /* index + 1 of the next free slot; 0: none */
  _Atomic(mp_pool_t *) pool; /* NULL while the slot is free */
  mp__block_t *block;
} mp__hslot_t;

static struct {
  pthread_mutex_t lock;
  _Atomic(mp__hslot_t *) chunks[MP__SLOT_CHUNKS];
  uint32_t used;      /* slots ever handed out */
  uint32_t free_head; /* index + 1; 0: none */
} mp__handles = {.lock = PTHREAD_MUTEX_INITIALIZER};

_Static_assert(sizeof(uintptr_t) >= 8, "handles pack 64 bits");

static mp__hslot_t *mp__slot_at(uint32_t idx) {
  if (idx >= MP__SLOT_CHUNKS * MP__SLOT_CHUNK)
    return NULL;
  mp__hslot_t *c = atomic_load_explicit(
      &mp__handles.chunks[idx >> MP__SLOT_CHUNK_LOG2], memory_order_acquire);
  return c ? &c[idx & (MP__SLOT_CHUNK - 1)] : NULL;
}

/* The slot a handle names and the generation it was made with; NULL for a
 * value no handle ever had. */
static mp__hslot_t *mp__slot_of(const mp_handle_t *h, uint32_t *gen) {
  uintptr_t v = (uintptr_t)h;
  uint64_t idx1 = (uint64_t)v >> 32;
  *gen = (uint32_t)v;
  return idx1 == 0 ? NULL : mp__slot_at((uint32_t)(idx1 - 1));
}

/* Takes a free slot (growing the table), before the block is allocated:
 * a refusal then leaves no allocation to undo. Under pool->lock. */
static mp_status_t mp__handle_reserve(uint32_t *idx) {
  pthread_mutex_lock(&mp__handles.lock);
  if (mp__handles.free_head != 0) {
    *idx = mp__handles.free_head - 1;
    mp__handles.free_head = mp__slot_at(*idx)->next_free;
    pthread_mutex_unlock(&mp__handles.lock);
    return MP_OK;
  }
  uint32_t i = mp__handles.used, c = i >> MP__SLOT_CHUNK_LOG2;
  if (c >= MP__SLOT_CHUNKS) {
    pthread_mutex_unlock(&mp__handles.lock);
    return mp__fail(MP_ENOMEM, "mp_pool_alloc_movable: %u handles are live", i);
  }
  if (atomic_load_explicit(&mp__handles.chunks[c], memory_order_relaxed) ==
      NULL) {
    mp__hslot_t *chunk = mp__host_calloc(MP__SLOT_CHUNK, sizeof *chunk);
    if (chunk == NULL) {
      pthread_mutex_unlock(&mp__handles.lock);
      return mp__fail(MP_ENOMEM, "out of host memory for handles");
    }
    atomic_store_explicit(&mp__handles.chunks[c], chunk, memory_order_release);
  }
  mp__handles.used++;
  mp__slot_at(i)->idx = i;
  *idx = i;
  pthread_mutex_unlock(&mp__handles.lock);
  return MP_OK;
}

/* Puts a reserved slot, never bound, back on the free list. */
static void mp__handle_unreserve(uint32_t idx) {
  pthread_mutex_lock(&mp__handles.lock);
  mp__slot_at(idx)->next_free = mp__handles.free_head;
  mp__handles.free_head = idx + 1;
  pthread_mutex_unlock(&mp__handles.lock);
}

/* Binds reserved slot idx to b. Under pool->lock. */
static void mp__handle_bind(mp_pool_t *pool, mp__block_t *b, uint32_t idx,
                            mp_handle_t **out) {
  pthread_mutex_lock(&mp__handles.lock);
  mp__hslot_t *s = mp__slot_at(idx);
  s->idx = idx;
  s->next_free = 0;
  s->block = b;
  atomic_store_explicit(&s->pool, pool, memory_order_release);
  uint32_t gen = atomic_load_explicit(&s->gen, memory_order_relaxed);
  pthread_mutex_unlock(&mp__handles.lock);
  b->handle = s;
  *out = (mp_handle_t *)(uintptr_t)(((uint64_t)idx + 1) << 32 | gen);
}

/* Under pool->lock: every copy of b's handle is stale from now on. */
void mp__handle_retire(mp_pool_t *pool, mp__block_t *b) {
  (void)pool;
  mp__hslot_t *s = b->handle;
  atomic_fetch_add_explicit(&s->gen, 1, memory_order_release);
  atomic_store_explicit(&s->pool, NULL, memory_order_relaxed);
  s->block = NULL;
  b->handle = NULL;
  pthread_mutex_lock(&mp__handles.lock);
  s->next_free = mp__handles.free_head;
  mp__handles.free_head = s->idx + 1;
  pthread_mutex_unlock(&mp__handles.lock);
}

/* The pool of a handle that was live when looked at, locked, with its
 * block; NULL (nothing locked) for a stale or foreign handle. */
static mp__block_t *mp__handle_lock(const mp_handle_t *h, mp_pool_t **pool) {
  uint32_t gen;
  mp__hslot_t *s = mp__slot_of(h, &gen);
  if (s == NULL || atomic_load_explicit(&s->gen, memory_order_acquire) != gen)
    return NULL;
  mp_pool_t *p = atomic_load_explicit(&s->pool, memory_order_acquire);
  if (p == NULL)
    return NULL;
  mp__pool_lock(p);
  if (atomic_load_explicit(&s->gen, memory_order_relaxed) != gen ||
      atomic_load_explicit(&s->pool, memory_order_relaxed) != p) {
    mp__pool_unlock(p);
    return NULL;
  }
  *pool = p;
  return s->block;
}

/* The claim of a movable block in a pool with arenas: bound to its
 * reserved slot (ctx) and marked movable, under the lock of the arena it
 * became live in (mp__arena_claim_t), so that a raw free of its address
 * (a stale pointer) never meets it unmarked. */
typedef struct mp__movable_claim {
  uint32_t idx;
  mp_handle_t **out;
} mp__movable_claim_t;

static mp_status_t mp__movable_claim(mp_pool_t *a, void *const *p, void *ctx) {
  mp__movable_claim_t *c = ctx;
  mp__block_t *b = mp__map_find(a, (uintptr_t)*p);
  mp__handle_bind(a, b, c->idx, c->out);
  b->flags |= MP__B_MOVABLE;
  return MP_OK;
}

/* mp_pool_alloc_movable on a pool with arenas: the block through the
 * arenas' whole path (the calling thread's arena, a loan, their
 * out-of-memory path), marked movable in the arena holding it, whose pool
 * the handle names, before that arena's lock is dropped. */
static mp_status_t mp__movable_in_arenas(mp_pool_t *pool, size_t bytes,
                                         mp_stream_t s, mp_handle_t **out) {
  mp__movable_claim_t c = {.out = out};
  mp_status_t st = mp__handle_reserve(&c.idx);
  if (st != MP_OK)
    return st;
  void *p = NULL;
  mp_pool_t *a = NULL;
  st = mp__arena_alloc_any(pool, bytes, s, &p, &a, mp__movable_claim, &c);
  if (st != MP_OK)
    mp__handle_unreserve(c.idx);
  return st;
}

/* Nor from a stream that allocates to a graph pool: the graph's replays
 * use the block at its address, and defragmentation would move it. */
static mp_status_t mp__movable_routed(void) {
  return mp__fail(MP_EINVAL, "mp_pool_alloc_movable: the stream allocates to "
                             "a graph pool, which holds no movable blocks");
}

mp_status_t mp_pool_alloc_movable(mp_pool_t *pool, size_t bytes, mp_stream_t s,
                                  mp_handle_t **out) {
  if (pool == NULL || out == NULL)
    return mp__fail(MP_EINVAL, "mp_pool_alloc_movable: %s is NULL",
                    pool == NULL ? "pool" : "out");
  /* A graph pool goes with its last block, which only mp_pool_free and
   * mp_pool_graph_release see (graph.c), not mp_handle_free. */
  if (pool->graph)
    return mp__fail(MP_EINVAL, "mp_pool_alloc_movable: a graph pool holds no "
                               "movable blocks");
  if (bytes == 0) {
    *out = NULL;
    return MP_OK;
  }
  MP__HIST_ENTRY(pool);
  if (pool->arenas != NULL)
    return mp_pool_graph_of(pool, s) != NULL
               ? mp__movable_routed()
               : mp__movable_in_arenas(pool, bytes, s, out);
  /* One locked step: nobody can free the block as a raw pointer before it
   * is marked movable. */
  mp__pool_lock(pool);
  if (MP__UNLIKELY(pool->nroutes > 0) && mp__graph_route(pool, s) != NULL) {
    mp__pool_unlock(pool);
    return mp__movable_routed();
  }
  uint32_t idx = 0;
  mp_status_t st = mp__handle_reserve(&idx);
  if (st != MP_OK) {
    mp__pool_unlock(pool);
    return st;
  }
  void *p;
  st = mp__pool_alloc_locked(pool, bytes, s, &p);
  if (mp__pool_oom_retry(pool, st, bytes))
    st = mp__pool_alloc_locked(pool, bytes, s, &p);
  if (st == MP_OK) {
    mp__block_t *b = mp__map_find(pool, (uintptr_t)p);
    mp__handle_bind(pool, b, idx, out);
    b->flags |= MP__B_MOVABLE;
  } else {
    mp__handle_unreserve(idx);
  }
  mp__pool_unlock(pool);
  return st;
}

void *mp_handle_ptr(const mp_handle_t *h) {
  mp_pool_t *pool;
  mp__block_t *b = mp__handle_lock(h, &pool);
  if (b == NULL)
    return NULL;
  void *p = (void *)b->addr;
  mp__pool_unlock(pool);
  return p;
}

mp_status_t mp_handle_free(mp_handle_t *h) {
  if (h == NULL)
    return MP_OK;
  mp_pool_t *pool;
  mp__block_t *b = mp__handle_lock(h, &pool);
  if (b == NULL)
    return mp__fail(MP_EINVAL,
                    "mp_handle_free: %p is not a live movable handle (freed "
                    "already, or its pool destroyed)",
                    (void *)h);
  mp_status_t st = mp__pool_paused(pool, "mp_handle_free");
  if (st != MP_OK) {
    mp__pool_unlock(pool);
    return st;
  }
  /* The free's events (and a release_threshold's segment events) start
   * their stacks at this call's caller, as mp_pool_free's do. */
  MP__HIST_ENTRY(pool);
  mp__handle_retire(pool, b);
  mp__map_remove(pool, b);
  /* A free like mp_pool_free's: release_threshold looks first. */
  mp__segment_release_above(pool);
  mp__block_release(pool, b);
  mp__pool_unlock(pool);
  return MP_OK;
}

void mp__handle_retire_all(mp_pool_t *pool) {
  for (mp__segment_t *seg = pool->segs; seg != NULL; seg = seg->next)
    for (mp__block_t *b = seg->first; b != NULL; b = b->next)
      if ((b->flags & (MP__B_FREE | MP__B_MOVABLE)) == MP__B_MOVABLE &&
          b->handle != NULL)
        mp__handle_retire(pool, b);
}
