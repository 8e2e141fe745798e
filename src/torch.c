/* torch.c - PyTorch's pluggable-allocator entry points (mempool/torch.h).
 *
 * malloc and free go to the default pool of the device PyTorch names (one
 * pool per device, src/default.c). PyTorch frees a block with the stream it
 * was allocated on; a different stream is recorded on the block first, so
 * the block is reused elsewhere only after the work on both streams is done.
 *
 * Graph capture: PyTorch names a capture's private pool by a MempoolId_t
 * and a stream filter (beginAllocateToPool). Each id gets one graph pool of
 * the device's pool (mp_pool_graph_create), counted in uses: one per begin,
 * one less per release_pool; the last release releases it (at the end of
 * its capture if one is open: PyTorch's releasePool only lowers the use
 * count, and the capture allocates to the pool until its end). While a begin
 * is open, an allocation or free on a stream its filter accepts first
 * routes that stream to the graph pool (mp_pool_graph_begin), so the pool
 * never records on the capturing stream; end_allocate_to_pool ends the
 * routes. A program that cannot set these hooks (Python sets only malloc
 * and free) still captures correctly: while no begin hook was ever called,
 * a stream the device reports capturing is routed to a graph pool of its
 * capture's own (one per capture id: a stream that joined the capture is
 * routed to the pool of the stream it joined), ended at the first call
 * (here or mp_torch_reset) that finds the stream no longer captured by
 * that capture (for the per-thread stream, a call of its own thread: the
 * handle names each caller's stream), and released at the first
 * mp_torch_reset after its graph and the graph's executables are destroyed
 * (a user object the graph holds tells, mp__tpool_watch; where the device
 * cannot tell, never). A capture is told by its id: one begun right after
 * on the same stream is another graph, which must not reuse what the first
 * one's replays use. An allocation on a stream that belongs to a capture
 * but cannot be routed to its pool (no host memory for its entry, more
 * room for one more of its streams) fails instead of taking memory the pool
 * would hand others while replays use it.
 *
 * History stacks (history_stacks=1): each hook marks its caller, PyTorch's
 * code, and calls the pools without their own mark, so that an event's
 * stack starts there, not at this file's frames (pool_internal.h,
 * mp__pool_alloc_marked).
 *
 * Invariant: a pointer returned by mp_torch_malloc is a live block of a
 * default pool (or of one of its graph pools), and only mp_torch_free (or
 * mp_free) ends it; every route begun here is ended here exactly once. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "pool/pool_internal.h"

/* Whether an automatic entry's graph is gone: set from the driver's thread
 * once the graph and its executables are destroyed; two references, the
 * entry's and the driver's. */
typedef struct mp__tgone {
  atomic_uint refs;
  atomic_bool gone;
} mp__tgone_t;

static void mp__tgone_drop(mp__tgone_t *g) {
  if (g != NULL && atomic_fetch_sub(&g->refs, 1) == 1)
    free(g);
}

/* The driver's call: no device call, no lock. */
static void mp__tgone_set(void *p) {
  mp__tgone_t *g = p;
  atomic_store(&g->gone, true);
  mp__tgone_drop(g);
}

typedef struct mp__tpool {
  bool used;
  bool automatic;    /* made for a capture seen without the hooks */
  bool open;         /* between begin and end */
  uint64_t capture;  /* automatic: the id of its capture (0: not told) */
  mp__tgone_t *gone; /* automatic: its graph's end (NULL: cannot be told) */
  int device;
  mp_torch_pool_id_t id;
  mp_pool_t *parent, *graph;
  unsigned uses;
  mp_torch_stream_filter_t filter;
  void *ctx;
  void (*drop)(void *);
  /* The streams routed, each with the per-thread stream's thread (0 for
   * an explicit handle); the room stays with the entry when reused. */
  struct mp__troute {
    mp_stream_t s;
    uint64_t owner;
  } * routes;
  unsigned nstreams, room;
} mp__tpool_t;

static struct {
  pthread_mutex_t lock;
  /* The entries, each allocated once and reused when released (pointers
   * to them stay valid); grown as private pools come, without a limit (a
   * program capturing graphs without a shared pool= makes one each). */
  mp__tpool_t **pools;
  size_t npools, cap;
  atomic_uint open;   /* entries open (begun, or automatic and routed) */
  atomic_bool hooked; /* a begin hook was called: no automatic capture */
  /* The default pools PyTorch set a memory fraction of 0 on: it allows 0
   * bytes, and mp_torch_malloc serves them nothing (see
   * mp_torch_memory_fraction_ex); at most one per default pool (64
   * devices' and the default one, src/default.c). nzero: how many, read
   * without the lock so that malloc looks further only when some are. */
  mp_pool_t *zero[65];
  atomic_uint nzero;
  /* Frees a paused default pool refused (mp__torch_defer): kept until
   * the pool takes them. ndeferred is read without the lock, so that the
   * hooks look further only when some are. */
  struct mp__tdeferred {
    mp_pool_t *pool;
    void *ptr;
    mp_stream_t stream;
  } * deferred;
  size_t deferred_cap;
  atomic_size_t ndeferred;
} mp__t = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Whether PyTorch's memory fraction of pool is 0. */
static bool mp__torch_zero(mp_pool_t *pool) {
  if (atomic_load_explicit(&mp__t.nzero, memory_order_acquire) == 0)
    return false;
  bool zero = false;
  pthread_mutex_lock(&mp__t.lock);
  for (unsigned i = 0; i < atomic_load(&mp__t.nzero) && !zero; i++)
    zero = mp__t.zero[i] == pool;
  pthread_mutex_unlock(&mp__t.lock);
  return zero;
}

/* Marks (on) or clears pool's fraction of 0. Under the lock. */
static void mp__torch_set_zero(mp_pool_t *pool, bool on) {
  unsigned n = atomic_load(&mp__t.nzero), i = 0;
  while (i < n && mp__t.zero[i] != pool)
    i++;
  if (on && i == n && n < sizeof mp__t.zero / sizeof mp__t.zero[0]) {
    mp__t.zero[n] = pool;
    atomic_store_explicit(&mp__t.nzero, n + 1, memory_order_release);
  } else if (!on && i < n) {
    mp__t.zero[i] = mp__t.zero[n - 1];
    atomic_store_explicit(&mp__t.nzero, n - 1, memory_order_release);
  }
}

/* ---- streams forgotten since ------------------------------------------- */

/* The stream handles forgotten (mp_stream_forget: mp_stream_destroy, the
 * LD_PRELOAD shim's cuStreamDestroy hook) on a default pool's device and
 * not named to mp_torch_malloc since. PyTorch passes the free hook the
 * stream current at the allocation, destroyed or not: a destroyed stream's
 * handle is undefined behaviour to pass to the driver at all (cuda.h; an
 * H200 died in cuEventRecord and cuStreamIsCapturing given one,
 * tests/fakecuda/fakecuda.c), and the pools, which forgot it, would meet it
 * as a new stream and ask the driver about it. So the free of a block on
 * such a handle never names it: the block is freed on its own stream (its
 * pool still waits for what the stream had queued, mp_stream_forget). A
 * handle mp_torch_malloc is given again is a live stream again (the
 * driver may give a new stream the handle). At most MP__TDEAD are kept,
 * the oldest dropped first (each hook looks through them while any are
 * kept). What no forget tells (a stream the program
 * destroys itself without the shim or mp_stream_forget) cannot be known
 * here: its handle stays undefined behaviour to pass (device.h). */
#define MP__TDEAD 64
static struct {
  pthread_mutex_t lock; /* a leaf: taken inside the device's forget */
  mp_stream_t dead[MP__TDEAD];
  unsigned head, n;  /* the ring: the oldest at head */
  atomic_uint count; /* n, read without the lock */
  /* The devices watched (a default pool's, one per device and the
   * default one's), each once; set under watch_lock, read without it. */
  pthread_mutex_t watch_lock;
  _Atomic(mp_device_t *) watched[MP__DEFAULT_DEVICES + 1];
  atomic_uint nwatched;
} mp__td = {.lock = PTHREAD_MUTEX_INITIALIZER,
            .watch_lock = PTHREAD_MUTEX_INITIALIZER};

/* The slot of s in the ring, or MP__TDEAD. Under the lock. */
static unsigned mp__td_find(mp_stream_t s) {
  for (unsigned k = 0; k < mp__td.n; k++) {
    unsigned i = (mp__td.head + k) % MP__TDEAD;
    if (mp__td.dead[i] == s)
      return i;
  }
  return MP__TDEAD;
}

static bool mp__td_dead(mp_stream_t s, bool live);

/* The device's watcher (backend.h: on the forgetting thread, no pool lock
 * held): s is kept as forgotten. Not a set-aside around a destroy the
 * driver may refuse (the LD_PRELOAD shim's cuStreamDestroy of a stream
 * being captured, mp__stream_set_aside), nor its give-back once refused:
 * the handle is still a live stream's, which a free must wait for and
 * route to its capture (it was kept as destroyed: a free on it was made
 * on the block's own stream, not after the stream's work, and said the
 * stream was destroyed); a destroy that succeeds is told again after. */
static void mp__td_forgotten(void *ctx, mp_stream_t s) {
  (void)ctx;
  if (mp__stream_forget_keeps_handle()) {
    (void)mp__td_dead(s, true); /* a live stream's */
    return;
  }
  pthread_mutex_lock(&mp__td.lock);
  if (mp__td_find(s) == MP__TDEAD) {
    if (mp__td.n == MP__TDEAD) { /* the oldest goes */
      mp__td.head = (mp__td.head + 1) % MP__TDEAD;
      mp__td.n--;
    }
    mp__td.dead[(mp__td.head + mp__td.n++) % MP__TDEAD] = s;
    atomic_store_explicit(&mp__td.count, mp__td.n, memory_order_release);
  }
  pthread_mutex_unlock(&mp__td.lock);
}

/* Whether s was forgotten and not given to mp_torch_malloc since; live:
 * it is being given (a live stream from now on: no longer kept). */
static bool mp__td_dead(mp_stream_t s, bool live) {
  if (s == NULL ||
      atomic_load_explicit(&mp__td.count, memory_order_acquire) == 0)
    return false;
  pthread_mutex_lock(&mp__td.lock);
  unsigned i = mp__td_find(s);
  bool dead = i != MP__TDEAD;
  if (dead && live) { /* the last one moves into its slot */
    unsigned last = (mp__td.head + mp__td.n - 1) % MP__TDEAD;
    mp__td.dead[i] = mp__td.dead[last];
    mp__td.n--;
    atomic_store_explicit(&mp__td.count, mp__td.n, memory_order_release);
  }
  pthread_mutex_unlock(&mp__td.lock);
  return dead;
}

/* Has pool's device tell its forgets (mp__td_forgotten), once per device;
 * without host memory for it, not (its forgets go untold, as before). */
static void mp__td_watch(mp_pool_t *pool) {
  mp_device_t *dev = mp_pool_device(pool);
  unsigned n = atomic_load_explicit(&mp__td.nwatched, memory_order_acquire);
  for (unsigned i = 0; i < n; i++)
    if (atomic_load_explicit(&mp__td.watched[i], memory_order_relaxed) == dev)
      return;
  pthread_mutex_lock(&mp__td.watch_lock);
  n = atomic_load_explicit(&mp__td.nwatched, memory_order_relaxed);
  bool seen = false;
  for (unsigned i = 0; i < n && !seen; i++)
    seen =
        atomic_load_explicit(&mp__td.watched[i], memory_order_relaxed) == dev;
  if (!seen && n < sizeof mp__td.watched / sizeof mp__td.watched[0]) {
    mp__error_saved_t e;
    mp__error_save(&e);
    if (mp__device_watch(dev, mp__td_forgotten, NULL) == MP_OK) {
      atomic_store_explicit(&mp__td.watched[n], dev, memory_order_relaxed);
      atomic_store_explicit(&mp__td.nwatched, n + 1, memory_order_release);
    }
    mp__error_restore(&e);
  }
  pthread_mutex_unlock(&mp__td.watch_lock);
}

static mp__tpool_t *mp__tpool_find(int device, mp_torch_pool_id_t id) {
  for (size_t i = 0; i < mp__t.npools; i++) {
    mp__tpool_t *t = mp__t.pools[i];
    if (t->used && !t->automatic && t->device == device &&
        t->id.first == id.first && t->id.second == id.second)
      return t;
  }
  return NULL;
}

/* An entry not in use: a released one, else a new one (the table grown
 * for it); NULL (error set) without host memory. Under the lock. */
static mp__tpool_t *mp__tpool_slot(void) {
  for (size_t i = 0; i < mp__t.npools; i++)
    if (!mp__t.pools[i]->used)
      return mp__t.pools[i];
  if (mp__t.npools == mp__t.cap) {
    size_t cap = mp__t.cap ? 2 * mp__t.cap : 8;
    mp__tpool_t **p = mp__host_realloc(mp__t.pools, cap * sizeof *p);
    if (p == NULL) {
      mp__fail(MP_ENOMEM, "torch: out of host memory for a private pool");
      return NULL;
    }
    mp__t.pools = p;
    mp__t.cap = cap;
  }
  mp__tpool_t *t = mp__host_calloc(1, sizeof *t);
  if (t == NULL) {
    mp__fail(MP_ENOMEM, "torch: out of host memory for a private pool");
    return NULL;
  }
  mp__t.pools[mp__t.npools++] = t;
  return t;
}

/* A new entry with a graph pool of parent, or NULL (error set). */
static mp__tpool_t *mp__tpool_new(mp_pool_t *parent, int device) {
  mp__tpool_t *t = mp__tpool_slot();
  if (t == NULL || mp_pool_graph_create(parent, &t->graph) != MP_OK)
    return NULL;
  t->used = true;
  t->parent = parent;
  t->device = device;
  return t;
}

/* Whether t routes s as the calling thread names it: the per-thread
 * handle (an owner) names the caller's own stream only. */
static bool mp__tpool_routes(const mp__tpool_t *t, mp_stream_t s) {
  for (unsigned k = 0; k < t->nstreams; k++)
    if (t->routes[k].s == s &&
        (t->routes[k].owner == 0 || t->routes[k].owner == mp__self()))
      return true;
  return false;
}

/* Routes s to t's graph pool; false (error set) if it cannot. */
static bool mp__tpool_route(mp__tpool_t *t, mp_stream_t s) {
  uint64_t owner = 0;
  if (t->nstreams == t->room) {
    unsigned room = t->room ? 2 * t->room : 8;
    struct mp__troute *r = mp__host_realloc(t->routes, room * sizeof *r);
    if (r == NULL) {
      mp__fail(MP_ENOMEM, "torch: out of host memory for a stream of a "
                          "private pool");
      return false;
    }
    t->routes = r;
    t->room = room;
  }
  if (mp__graph_begin_owned(t->parent, t->graph, s, &owner) != MP_OK)
    return false;
  t->routes[t->nstreams++] = (struct mp__troute){s, owner};
  return true;
}

/* Ends every route of t, whichever thread routed it (from here the
 * per-thread handle would name the caller's stream). */
static void mp__tpool_end(mp__tpool_t *t) {
  for (unsigned k = 0; k < t->nstreams; k++)
    (void)mp__graph_end_owned(t->parent, t->routes[k].s, t->routes[k].owner);
  t->nstreams = 0;
  if (t->open)
    atomic_fetch_sub(&mp__t.open, 1);
  t->open = false;
  if (t->drop != NULL)
    t->drop(t->ctx);
  t->filter = NULL;
  t->drop = NULL;
  t->ctx = NULL;
}

/* The ranges going back are frees in the parent's history, with the stack
 * of the hook's caller (marked by the hook). */
static void mp__tpool_release(mp__tpool_t *t) {
  mp__tpool_end(t);
  (void)mp__graph_release(t->graph);
  mp__tgone_drop(t->gone);
  struct mp__troute *routes = t->routes;
  unsigned room = t->room;
  memset(t, 0, sizeof *t);
  t->routes = routes;
  t->room = room;
}

/* Has t (automatic) told when the graph its stream is being captured into
 * goes; where the device cannot tell, t->gone stays NULL. That is no
 * failure of the allocation, which goes on: the caller's last error stays
 * as it was across the refusal (status.h: a success does not replace it),
 * and across a host allocation that fails. */
static void mp__tpool_watch(mp__tpool_t *t, mp_stream_t s) {
  mp__error_kept_t was;
  mp__error_keep(&was);
  mp__tgone_t *g = mp__host_alloc(sizeof *g);
  if (g != NULL) {
    atomic_init(&g->refs, 2);
    atomic_init(&g->gone, false);
    if (mp__device_capture_on_release(mp_pool_device(t->parent), s,
                                      mp__tgone_set, g) == MP_OK)
      t->gone = g;
    else
      free(g);
  }
  mp__error_give_back(&was);
}

/* Whether t is an automatic entry whose capture ended and whose graph, with
 * every executable made from it, is destroyed: its graph pool is nobody's. */
static bool mp__tpool_done(const mp__tpool_t *t) {
  return t->used && t->automatic && !t->open && t->gone != NULL &&
         atomic_load(&t->gone->gone);
}

/* Whether stream k of t may still be captured: another thread's
 * per-thread stream cannot be asked from here (the handle names the
 * caller's own), so it is while its route lasts (its thread's next call
 * tells; the route goes when the thread exits). */
static bool mp__tpool_capturing(const mp__tpool_t *t, unsigned k) {
  if (t->routes[k].owner != 0 && t->routes[k].owner != mp__self())
    return mp__graph_routed_owned(t->parent, t->routes[k].s,
                                  t->routes[k].owner);
  uint64_t id = 0;
  return mp__device_stream_capture_id(mp_pool_device(t->parent), t->routes[k].s,
                                      &id) == 1 &&
         id == t->capture;
}

/* An automatic entry whose stream is no longer captured by its capture
 * (or cannot be told; a new capture of the stream is another graph's)
 * stops routing; its graph pool stays pinned until mp_torch_reset.
 * Under the lock. */
static void mp__tpool_auto_check(mp__tpool_t *t) {
  if (!t->used || !t->automatic || !t->open)
    return;
  for (unsigned k = 0; k < t->nstreams; k++)
    if (mp__tpool_capturing(t, k))
      return;
  mp__tpool_end(t);
}

/* Before pool serves or frees on stream: the stream allocates to the
 * capture it belongs to, if any (see the top). False (error set) when it
 * belongs to one but cannot be routed to its pool: served from the pool
 * itself, the capture's memory would go to others once freed while
 * replays still use it. */
static bool mp__torch_capture_route(mp_pool_t *pool, int device,
                                    mp_stream_t stream) {
  bool hooked = atomic_load_explicit(&mp__t.hooked, memory_order_relaxed);
  if (hooked && atomic_load_explicit(&mp__t.open, memory_order_acquire) == 0)
    return true;
  uint64_t capture = 0;
  int capturing = hooked ? 0
                         : mp__device_stream_capture_id(mp_pool_device(pool),
                                                        stream, &capture);
  /* The driver failed the question with its own error (a kernel's fault,
   * recorded): no answer, and the stream may be captured. Served from the
   * pool, a capture's memory would go to others once freed while replays
   * use it; the allocation says the driver's error. */
  if (capturing == -2)
    return false;
  if (capturing == 0 && atomic_load(&mp__t.open) == 0)
    return true;
  bool ok = true;
  pthread_mutex_lock(&mp__t.lock);
  mp__tpool_t *mine = NULL, *joined = NULL;
  for (size_t i = 0; i < mp__t.npools; i++) {
    mp__tpool_t *t = mp__t.pools[i];
    if (!t->used || !t->open || t->device != device)
      continue;
    if (t->automatic) {
      mp__tpool_auto_check(t); /* its capture ended: the pool stays pinned */
      if (t->open && mp__tpool_routes(t, stream))
        mine = t;
      else if (t->open && capturing == 1 && capture != 0 &&
               t->capture == capture)
        joined = t;
    } else if (!mp__tpool_routes(t, stream) && t->filter(stream, t->ctx)) {
      ok = mp__tpool_route(t, stream) && ok;
    }
  }
  /* A stream that joined a routed capture (it waited on an event recorded
   * there: the Programming Guide, "Cross-stream Dependencies and Events")
   * reports that capture's id (cuStreamGetCaptureInfo) and allocates to
   * its pool, as under PyTorch's own allocator: the filter of
   * CUDAGraph::capture_begin takes every stream whose capture is active
   * with the capture's id. A pool of its own served the graph too, but
   * kept apart memory the capture's streams could share. */
  if (mine == NULL && joined != NULL) {
    mine = joined;
    ok = mp__tpool_route(joined, stream) && ok;
  }
  if (capturing == 1 && mine == NULL) {
    mine = mp__tpool_new(pool, device);
    ok = mine != NULL;
    if (mine != NULL) {
      mine->automatic = mine->open = true;
      mine->capture = capture;
      atomic_fetch_add(&mp__t.open, 1);
      ok = mp__tpool_route(mine, stream);
      if (ok)
        mp__tpool_watch(mine, stream);
      else
        mp__tpool_release(mine); /* never routed: nobody's */
    }
  }
  /* A refused route of a stream that allocates to a graph pool already
   * (two filters taking it) is no loss. */
  if (!ok && mp_pool_graph_of(pool, stream) != NULL)
    ok = true;
  pthread_mutex_unlock(&mp__t.lock);
  return ok;
}

static void mp__torch_drain(void *ra);

void *mp_torch_malloc(ssize_t size, int device, mp_stream_t stream) {
  mp__torch_drain(__builtin_return_address(0));
  if (size <= 0) {
    mp__fail(MP_EINVAL, "mp_torch_malloc: size %zd is not positive", size);
    return NULL;
  }
  mp_pool_t *pool = mp__default_pool_for(device);
  if (pool == NULL)
    return NULL; /* mp_last_error() says why */
  if (mp__torch_zero(pool)) {
    mp__fail(MP_ELIMIT,
             "mp_torch_malloc: %zd bytes on device %d, whose memory "
             "fraction is 0 (set_per_process_memory_fraction): no memory "
             "is allowed",
             size, device);
    return NULL;
  }
  mp__td_watch(pool);
  (void)mp__td_dead(stream, true); /* named here: a live stream */
  if (!mp__torch_capture_route(pool, device, stream))
    return NULL; /* mp_last_error() says why */
  void *ptr = NULL;
  MP__HIST_ENTRY(pool);
  if (mp__pool_alloc_marked(pool, (size_t)size, stream, &ptr) != MP_OK)
    return NULL;
  return ptr;
}

/* Whether pool is paused (mp_pool_pause; with arenas, the pool's own flag
 * covers them all, arena.c). */
static bool mp__torch_paused(mp_pool_t *pool) {
  mp__pool_lock(pool);
  bool paused = pool->paused;
  mp__pool_unlock(pool);
  return paused;
}

/* A free the paused pool refused is kept for later: the hook cannot fail
 * and PyTorch forgets the pointer, so refused it would stay live for good
 * (an engine's sleep mode pauses the pool while the program's tensors may
 * still go). The same pointer kept already (a double free while paused)
 * is not kept twice: refused, mp_last_error() says so. */
static void mp__torch_defer(mp_pool_t *pool, void *ptr, mp_stream_t stream) {
  pthread_mutex_lock(&mp__t.lock);
  size_t n = atomic_load_explicit(&mp__t.ndeferred, memory_order_relaxed);
  bool twice = false;
  for (size_t i = 0; i < n && !twice; i++)
    twice = mp__t.deferred[i].pool == pool && mp__t.deferred[i].ptr == ptr;
  if (!twice && n == mp__t.deferred_cap) {
    size_t cap = n ? 2 * n : 16;
    struct mp__tdeferred *v = mp__host_realloc(mp__t.deferred, cap * sizeof *v);
    if (v != NULL) {
      mp__t.deferred = v;
      mp__t.deferred_cap = cap;
    }
  }
  bool kept = !twice && n < mp__t.deferred_cap;
  if (kept) {
    mp__t.deferred[n] = (struct mp__tdeferred){pool, ptr, stream};
    atomic_store_explicit(&mp__t.ndeferred, n + 1, memory_order_release);
  }
  pthread_mutex_unlock(&mp__t.lock);
  if (twice)
    (void)mp__fail(MP_EINVAL,
                   "mp_torch_free: %p was freed already while the pool is "
                   "paused (its free is kept for the resume)",
                   ptr);
  else if (!kept)
    (void)mp__fail(MP_ENOMEM,
                   "mp_torch_free: the pool is paused and there is no host "
                   "memory to keep the free of %p for its resume: the block "
                   "stays live",
                   ptr);
  else
    (void)mp__fail(MP_EBUSY,
                   "mp_torch_free: the pool is paused: the free of %p is "
                   "kept and made at the first hook called after the resume",
                   ptr);
}

/* ptr freed in pool, after the work queued on stream. */
static void mp__torch_free_in(mp_pool_t *pool, void *ptr, mp_stream_t stream) {
  /* A stream forgotten since (mp__td): its handle is never named; a free
   * the paused pool refuses is kept, as below. */
  if (mp__td_dead(stream, false)) {
    mp_status_t st = mp__pool_free_named(pool, ptr, "mp_torch_free");
    if (st == MP_OK)
      (void)mp__fail(MP_EINVAL,
                     "mp_torch_free: stream %p was destroyed (forgotten by "
                     "the pools); %p freed on its own stream",
                     (void *)stream, ptr);
    else if (st == MP_EBUSY && mp__torch_paused(pool))
      mp__torch_defer(pool, ptr, stream);
    return;
  }
  /* Freed in order on the free's stream (it matters when PyTorch frees on
   * another stream than the block's), in one step: a refused pointer leaves
   * nothing behind. */
  mp_status_t st = mp__pool_free_on(pool, ptr, stream, "mp_pool_free_async");
  if (st == MP_OK)
    return;
  if (st == MP_EBUSY && mp__torch_paused(pool)) {
    mp__torch_defer(pool, ptr, stream);
    return;
  }
  if (mp__stream_check(mp_pool_device(pool), stream) == MP_OK)
    return;
  /* Refused for the stream alone: PyTorch passes the stream current at the
   * allocation, which may be gone since (mp_stream_destroy: the pools
   * forget it, and the host device refuses its handle; on CUDA a handle
   * destroyed is undefined behaviour to pass at all, cuda.h). No work can
   * be queued on it any more, and what it had queued the pool still waits
   * for before reusing the block (mp_stream_forget); refused, the block
   * was lost for good, as this hook cannot fail and PyTorch forgets the
   * pointer. So it is freed on its own stream; mp_last_error() keeps why
   * the stream was not used. A pointer refused for itself is refused
   * again here, nothing changed. */
  char why[256];
  snprintf(why, sizeof why, "%s", mp_last_error());
  if (mp__pool_free_named(pool, ptr, "mp_torch_free") == MP_OK)
    (void)mp__fail(MP_EINVAL, "mp_torch_free: %s; %p freed on its own stream",
                   why, ptr);
}

/* The frees kept while a pool was paused, made now where the pool takes
 * them, their history stacks starting at ra (the hook's caller); those of
 * a pool still paused stay where they are (its state asked once per run
 * of entries of one pool, not tried and kept again). The caller's own
 * outcome (mp_last_error) is left as it was. */
static void mp__torch_drain(void *ra) {
  if (atomic_load_explicit(&mp__t.ndeferred, memory_order_acquire) == 0)
    return;
  mp__error_saved_t e;
  mp__error_save(&e);
  if (mp__default_refused()) { /* a forked child: the parent's pools */
    mp__error_restore(&e);
    return;
  }
  struct mp__tdeferred *go = NULL;
  size_t ngo = 0, kept = 0;
  mp_pool_t *last = NULL;
  bool paused = false, tried = false;
  pthread_mutex_lock(&mp__t.lock);
  size_t n = atomic_load_explicit(&mp__t.ndeferred, memory_order_relaxed);
  for (size_t i = 0; i < n; i++) {
    struct mp__tdeferred d = mp__t.deferred[i];
    if (d.pool != last) {
      last = d.pool;
      paused = mp__torch_paused(last);
    }
    if (!paused && !tried) { /* asked once: no host memory, all kept */
      go = mp__host_realloc(NULL, (n - i) * sizeof *go);
      tried = true;
    }
    if (paused || go == NULL) /* no host memory: kept for a later hook */
      mp__t.deferred[kept++] = d;
    else
      go[ngo++] = d;
  }
  atomic_store_explicit(&mp__t.ndeferred, kept, memory_order_release);
  pthread_mutex_unlock(&mp__t.lock);
  for (size_t i = 0; i < ngo; i++) {
    MP__HIST_ENTRY_AT(go[i].pool, ra);
    mp__torch_free_in(go[i].pool, go[i].ptr, go[i].stream);
  }
  free(go);
  mp__error_restore(&e);
}

void mp_torch_free(void *ptr, ssize_t size, int device, mp_stream_t stream) {
  (void)size;
  mp__torch_drain(__builtin_return_address(0));
  if (ptr == NULL)
    return;
  mp_pool_t *pool = mp__default_owner(ptr, "mp_torch_free");
  if (pool == NULL)
    return;
  /* A stream forgotten since is not asked whether it captures. */
  if (!mp__td_dead(stream, false))
    (void)mp__torch_capture_route(pool, device, stream);
  MP__HIST_ENTRY(pool);
  mp__torch_free_in(pool, ptr, stream);
}

void mp_torch_init(int device_count) {
  (void)device_count; /* the other devices' pools come on first use */
  (void)mp_default_pool();
}

static void mp__torch_trim(mp_pool_t *pool) {
  (void)mp__pool_trim_marked(pool, 0);
}

void mp_torch_reset(void) {
  if (mp__default_refused()) /* the parent's pools: nothing of ours */
    return;
  /* The events of every pool below (graph pools' ranges going back, the
   * trims) start at this hook's caller: the mark set whatever the pools
   * (MP__HIST_ENTRY asks one first), as they are not known yet. */
  mp__hist_caller = __builtin_return_address(0);
  mp__torch_drain(__builtin_return_address(0));
  pthread_mutex_lock(&mp__t.lock);
  for (size_t i = 0; i < mp__t.npools; i++) {
    mp__tpool_auto_check(mp__t.pools[i]);
    if (mp__tpool_done(mp__t.pools[i]))
      mp__tpool_release(mp__t.pools[i]);
  }
  pthread_mutex_unlock(&mp__t.lock);
  mp__default_each(mp__torch_trim);
}

/* PyTorch's fraction 0 allows 0 bytes (setMemoryFraction,
 * CUDACachingAllocator.cpp: fraction x the device's memory), where the
 * pool's max_fraction 0 is no cap: it is kept here (with a share under a
 * block, the same), the pool's own cap as it was, and mp_torch_malloc
 * refuses while it is set. */
mp_status_t mp_torch_memory_fraction_ex(double fraction, int device) {
  char num[32];
  mp__fmt_g(num, sizeof num, fraction);
  /* Said as this hook, which the program called (PyTorch's
   * set_per_process_memory_fraction through the C++ setter,
   * mempool.torch.set_memory_fraction): PyTorch's call refuses the same
   * ("Allowed range: 0~1"). */
  if (!(fraction >= 0 && fraction <= 1))
    return mp__fail(MP_EINVAL,
                    "mp_torch_memory_fraction: fraction %s is not in [0, 1]",
                    num);
  mp_pool_t *pool = mp__default_pool_for(device);
  if (pool == NULL)
    return mp__last_failure() != MP_OK ? mp__last_failure() : MP_EINVAL;
  /* A share under the pool's alignment, which the pool refuses as a cap,
   * is PyTorch's cap of a few bytes: no block fits, as 0. */
  size_t total = 0;
  bool none =
      fraction == 0 ||
      (fraction > 0 && fraction <= 1 &&
       mp_device_mem_info(mp_pool_device(pool), NULL, &total) == MP_OK &&
       (double)total * fraction < (double)pool->cfg.align);
  mp_status_t st = none ? MP_OK : mp_pool_set_max_fraction(pool, fraction);
  if (st != MP_OK)
    /* The pool's refusal (a paused pool, a device that does not tell its
     * size) kept after this hook's name: the program never called
     * mp_pool_set_max_fraction. A driver's code stays (mp__fail). */
    return mp__fail(st,
                    "mp_torch_memory_fraction: fraction %s on device %d: "
                    "the default pool refused it (%s)",
                    num, device, mp_last_error());
  pthread_mutex_lock(&mp__t.lock);
  mp__torch_set_zero(pool, none);
  pthread_mutex_unlock(&mp__t.lock);
  return MP_OK;
}

void mp_torch_memory_fraction(double fraction, int device) {
  (void)mp_torch_memory_fraction_ex(fraction, device);
}

void *mp_torch_base_alloc(void *ptr, size_t *size) {
  mp_pool_t *pool =
      ptr != NULL ? mp__default_owner(ptr, "mp_torch_base_alloc") : NULL;
  void *base = NULL;
  size_t bytes = 0;
  if (pool == NULL || !mp__pool_base_of(pool, ptr, &base, &bytes)) {
    mp__fail(MP_EINVAL, "mp_torch_base_alloc: %p is in no live block", ptr);
    return ptr;
  }
  if (size != NULL)
    *size = bytes;
  return base;
}

mp_status_t mp_torch_record_stream_ex(void *ptr, mp_stream_t stream) {
  /* An empty tensor's storage: nothing to record (PyTorch's own
   * recordStream returns there too). */
  if (ptr == NULL)
    return MP_OK;
  /* mp_last_error() says why no pool holds ptr (none made yet, none
   * could be, a forked child's, or none of them has it), as
   * mp__default_owner set it: it was replaced by "is no pool's". */
  mp_pool_t *pool = mp__default_owner(ptr, "mp_torch_record_stream");
  if (pool == NULL) {
    mp_status_t st = mp__last_failure();
    return st != MP_OK ? st : MP_EINVAL;
  }
  return mp_pool_record_stream(pool, ptr, stream);
}

void mp_torch_record_stream(void *ptr, mp_stream_t stream) {
  (void)mp_torch_record_stream_ex(ptr, stream);
}

mp_status_t mp_torch_begin_allocate_to_pool_ex(int device,
                                               mp_torch_pool_id_t id,
                                               mp_torch_stream_filter_t filter,
                                               void *ctx,
                                               void (*drop)(void *)) {
  if (mp__default_refused()) {
    if (drop != NULL)
      drop(ctx);
    return MP_EINVAL; /* mp_last_error() says why */
  }
  mp_pool_t *pool = filter != NULL ? mp__default_pool_for(device) : NULL;
  pthread_mutex_lock(&mp__t.lock);
  mp__tpool_t *t = pool != NULL ? mp__tpool_find(device, id) : NULL;
  if (filter == NULL)
    mp__fail(MP_EINVAL, "mp_torch_begin_allocate_to_pool: filter is NULL");
  else if (t != NULL && t->open)
    t = NULL, mp__fail(MP_EBUSY,
                       "mp_torch_begin_allocate_to_pool: pool (%llu, %llu) "
                       "is being allocated to already",
                       id.first, id.second);
  else if (t == NULL && pool != NULL && (t = mp__tpool_new(pool, device))) {
    t->id = id;
    /* Its snapshot names it as PyTorch's does: by the id (0, 0), "no
     * pool" to PyTorch, keeps the graph pool's own. */
    if (id.first != 0 || id.second != 0)
      (void)mp__graph_set_id(t->graph, id.first, id.second);
  }
  if (t != NULL) {
    /* Only a begin that took: a refused one changes nothing, automatic
     * routing of the captures included. */
    atomic_store(&mp__t.hooked, true);
    t->uses++;
    t->open = true;
    t->filter = filter;
    t->ctx = ctx;
    t->drop = drop;
    atomic_fetch_add(&mp__t.open, 1);
  }
  pthread_mutex_unlock(&mp__t.lock);
  if (t == NULL && drop != NULL)
    drop(ctx);
  if (t != NULL)
    return MP_OK;
  mp_status_t st = mp__last_failure();
  return st != MP_OK ? st : MP_EINVAL;
}

void mp_torch_begin_allocate_to_pool(int device, mp_torch_pool_id_t id,
                                     mp_torch_stream_filter_t filter, void *ctx,
                                     void (*drop)(void *)) {
  (void)mp_torch_begin_allocate_to_pool_ex(device, id, filter, ctx, drop);
}

void mp_torch_end_allocate_to_pool(int device, mp_torch_pool_id_t id) {
  if (mp__default_refused())
    return;
  pthread_mutex_lock(&mp__t.lock);
  mp__tpool_t *t = mp__tpool_find(device, id);
  if (t != NULL && t->open) {
    mp__tpool_end(t);
    if (t->uses == 0) { /* its last use was released during the capture */
      MP__HIST_ENTRY(t->parent);
      mp__tpool_release(t);
    }
  } else
    mp__fail(MP_EINVAL,
             "mp_torch_end_allocate_to_pool: pool (%llu, %llu) of device %d "
             "is not being allocated to",
             id.first, id.second, device);
  pthread_mutex_unlock(&mp__t.lock);
}

void mp_torch_release_pool(int device, mp_torch_pool_id_t id) {
  if (mp__default_refused())
    return;
  pthread_mutex_lock(&mp__t.lock);
  mp__tpool_t *t = mp__tpool_find(device, id);
  /* An open capture keeps allocating to its pool, as under PyTorch's
   * releasePool (CUDACachingAllocator.cpp: the use count goes down, the
   * capture stays in captures_underway until endAllocateToPool): the last
   * release during it is done by the end. */
  if (t == NULL || t->uses == 0)
    mp__fail(MP_EINVAL,
             "mp_torch_release_pool: no pool (%llu, %llu) on device %d%s",
             id.first, id.second, device,
             t != NULL ? " (released; its capture is still open)" : "");
  else if (--t->uses == 0 && !t->open) {
    MP__HIST_ENTRY(t->parent);
    mp__tpool_release(t);
  }
  pthread_mutex_unlock(&mp__t.lock);
}
