/* devices.c - one pool per CUDA device: made on first use with
 * MEMPOOL_CONF's options, found by ordinal or by the calling thread's
 * context, walked for the report, pause and the snapshot.
 *
 * The pools are written once each, under one mutex, and read without it; a
 * device whose pool could not be made is marked failed and left to the
 * driver from then on. The first device's pool is made by the start
 * (state.c) and handed here. A forked child forgets them all (their locks
 * and threads did not survive the fork): mp__pl_devices_child. Calls only
 * real.c. */
#include <stdio.h>
#include <stdlib.h>

#include "preload.h"

static struct {
  _Atomic(mp_pool_t *) pool;
  /* The pool's device. Atomic: a reset of the device (its retirement)
   * clears it under mp__devs_lock while a walk (mp__pl_each_device, under
   * mp__devs_walk read only: a stream's forgetting on another device's
   * thread) reads it; the walk skips a device it finds cleared. */
  _Atomic(mp_device_t *) dev;
  atomic_bool failed;
  _Atomic(mp__cuctx) primary; /* the device's primary context, or NULL */
  /* Where no pool can be made (mp__is_primary): the primary context the
   * driver named last, not retained; NULL after a reset. */
  _Atomic(mp__cuctx) seen;
  /* The resets of the device under way, from the retirement of its pool
   * (mp__pl_devices_retire) until the driver's reset has returned
   * (mp__pl_devices_reset_done): meanwhile no pool is made, as its memory
   * would be the primary context's that the driver is about to destroy
   * while the shim still served it. A count (two threads may reset one
   * device); under mp__devs_lock. */
  unsigned resetting;
} mp__devs[MP__PL_MAX_DEVICES];
/* Pools are made per CUDA device (pool mode on the cuda backend): set by
 * the first mp__pl_devices_put. */
static atomic_bool mp__devs_pooling;

/* Streams the program created while their device's pool was paused:
 * mp_pool_add_stream refuses every call on a paused pool but a few
 * (mempool/pool.h, mp_pool_pause), and a stream left unknown to its pool
 * after the resume was one a free never waited for (its kernels could
 * still use a block the pool handed out again; a blocking stream is
 * covered by the legacy stream's marker, a non-blocking one was not).
 * Held here, by device, and added by the resume (mp__pl_devices_resumed);
 * dropped by the stream's destroy (mp__pl_devices_unhold) and by the
 * device's reset, which destroys them (mp__pl_devices_retire). Under
 * mp__devs_lock. */
typedef struct {
  mp__custream s;
  int ordinal;
} mp__held_t;
static mp__held_t *mp__held;
static size_t mp__nheld, mp__held_cap;

/* The primary context of CUDA device `ordinal`: retained and released at
 * once (the pool made on the device holds a retain of its own, so the
 * context stays and the handle with it); NULL when the driver cannot say. */
static mp__cuctx mp__primary_of(int ordinal) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  int dev = 0;
  mp__cuctx c = NULL;
  if (rc->cuDeviceGet == NULL || rc->cuDevicePrimaryCtxRetain == NULL ||
      rc->cuDevicePrimaryCtxRelease_v2 == NULL ||
      rc->cuDeviceGet(&dev, ordinal) != MP__CU_SUCCESS ||
      rc->cuDevicePrimaryCtxRetain(&c, dev) != MP__CU_SUCCESS)
    return NULL;
  (void)rc->cuDevicePrimaryCtxRelease_v2(dev);
  return c;
}
/* Whether ctx, a live context, is device `ordinal`'s primary context,
 * asked without creating it: an inactive primary context is no live
 * context, and retaining it to compare would create it (cuda.h,
 * cuDevicePrimaryCtxRetain: "the primary context will be created") and the
 * release at once destroy it again. The answer is kept where the device
 * has a pool (its primary context, retained by the pool); true when the
 * driver cannot say. Where no pool can be made (a device whose pool
 * failed, or no device pools at all: passthrough, the host device), the
 * handle the driver named last is kept too (seen): the context current
 * again, as on every call there, is answered without a question
 * (GetState, and a retain and release while active, each call before).
 * That handle is not retained: once the primary context is destroyed
 * (its last release) another context could take its address and pass for
 * it until the next reset of the device, whose only effect there is that
 * the shim forgets, and traces as freed, memory it passed through in that
 * context (the driver still frees it). Only there: on a device whose pool
 * may still be made, a context passing for the primary one would get the
 * pool. */
static bool mp__is_primary(int ordinal, mp__cuctx ctx) {
  mp__cuctx primary =
      atomic_load_explicit(&mp__devs[ordinal].primary, memory_order_acquire);
  if (primary != NULL)
    return primary == ctx;
  bool no_pool =
      atomic_load(&mp__devs[ordinal].failed) || !atomic_load(&mp__devs_pooling);
  if (no_pool && atomic_load_explicit(&mp__devs[ordinal].seen,
                                      memory_order_relaxed) == ctx)
    return true;
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  int dev = 0, active = 0;
  unsigned flags = 0;
  if (rc->cuDevicePrimaryCtxGetState != NULL && rc->cuDeviceGet != NULL &&
      rc->cuDeviceGet(&dev, ordinal) == MP__CU_SUCCESS &&
      rc->cuDevicePrimaryCtxGetState(dev, &flags, &active) == MP__CU_SUCCESS &&
      !active)
    return false;
  primary = mp__primary_of(ordinal);
  if (no_pool && primary != NULL)
    atomic_store_explicit(&mp__devs[ordinal].seen, primary,
                          memory_order_relaxed);
  return primary == NULL || primary == ctx;
}

static pthread_mutex_t mp__devs_lock = PTHREAD_MUTEX_INITIALIZER;
/* Walks of the pools and devices that are not the program's own calls on
 * a device (the snapshot helper thread, the report, a stream's
 * forgetting, the lookup, the process-wide pause and resume, the
 * synchronization before a page-locked free) read under it, each of them
 * over its use of the pools; a retired pool is destroyed under it
 * written (mp__pl_devices_release). The allocation paths do not take it:
 * cuda.h, cuDevicePrimaryCtxReset, leaves it to the caller that nothing
 * else uses the context meanwhile. */
static pthread_rwlock_t mp__devs_walk = PTHREAD_RWLOCK_INITIALIZER;
static mp_pool_config_t mp__cfg; /* MEMPOOL_CONF, for every device's pool */

void mp__pl_devices_config(const mp_pool_config_t *cfg) {
  mp__cfg = *cfg;
}

void mp__pl_devices_put(int ordinal, mp_device_t *dev, mp_pool_t *pool) {
  if (ordinal < 0 || ordinal >= MP__PL_MAX_DEVICES)
    return;
  atomic_store(&mp__devs[ordinal].dev, dev);
  atomic_store(&mp__devs_pooling, true);
  atomic_store(&mp__devs[ordinal].primary, mp__primary_of(ordinal));
  atomic_store(&mp__devs[ordinal].pool, pool);
}

void mp__pl_devices_child(void) {
  pthread_mutex_init(&mp__devs_lock, NULL);
  pthread_rwlock_init(&mp__devs_walk, NULL);
  for (int i = 0; i < MP__PL_MAX_DEVICES; i++) {
    atomic_store(&mp__devs[i].pool, NULL);
    atomic_store(&mp__devs[i].dev, NULL);
    atomic_store(&mp__devs[i].failed, false);
    atomic_store(&mp__devs[i].primary, NULL);
    atomic_store(&mp__devs[i].seen, NULL);
    mp__devs[i].resetting = 0;
  }
  mp__nheld = 0; /* the parent's streams are not this process's */
}

mp_pool_t *mp__pl_pool_of(const mp__pl_t *pl, int ordinal) {
  if (pl->mode != MP__PL_POOL)
    return NULL;
  if (pl->host)
    return pl->pool;
  if (ordinal < 0 || ordinal >= MP__PL_MAX_DEVICES)
    return NULL;
  mp_pool_t *pool =
      atomic_load_explicit(&mp__devs[ordinal].pool, memory_order_acquire);
  if (MP__LIKELY(pool != NULL) || atomic_load(&mp__devs[ordinal].failed))
    return pool;
  pthread_mutex_lock(&mp__devs_lock);
  pool = atomic_load(&mp__devs[ordinal].pool);
  if (pool == NULL && !atomic_load(&mp__devs[ordinal].failed) &&
      mp__devs[ordinal].resetting == 0) {
    char spec[32];
    snprintf(spec, sizeof spec, "cuda:%d", ordinal);
    mp_device_t *dev = NULL;
    mp_status_t st = mp_device_open(spec, &dev);
    if (st == MP_OK && (st = mp_pool_create(dev, &mp__cfg, &pool)) != MP_OK)
      mp_device_close(dev);
    if (st != MP_OK) {
      MP__PL_SAY("no pool for CUDA device %d (%s); the driver serves it",
                 ordinal, mp_last_error());
      atomic_store(&mp__devs[ordinal].failed, true);
      pool = NULL;
    } else {
      (void)mp_pool_add_stream(pool, NULL);
      atomic_store(&mp__devs[ordinal].dev, dev);
      atomic_store(&mp__devs[ordinal].primary, mp__primary_of(ordinal));
      atomic_store_explicit(&mp__devs[ordinal].pool, pool,
                            memory_order_release);
    }
  }
  pthread_mutex_unlock(&mp__devs_lock);
  return pool;
}

mp_pool_t *mp__pl_pool_current(const mp__pl_t *pl,
                               unsigned int (*current)(int *)) {
  if (pl->host || current == NULL)
    return mp__pl_pool_of(pl, pl->ordinal);
  int d = -1;
  if (current(&d) != 0 || d < 0 || d >= MP__PL_MAX_DEVICES)
    return NULL; /* CUDA_SUCCESS, cudaSuccess */
  /* A device whose pool could not be made is the driver's whatever the
   * context: no question about its primary context (GetState, and a
   * retain and release where it is active) on each call. */
  if (atomic_load_explicit(&mp__devs[d].failed, memory_order_relaxed))
    return NULL;
  /* A context the program made is not the pool's: cuEventRecord's event
   * and stream "must be from the same context" (cuda.h), and the pool's
   * blocks would outlive cuCtxDestroy of the context they were asked for
   * in. Asked before the device's pool is made, so that such a context
   * makes none (nor its device's primary context). */
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  mp__cuctx here = NULL;
  if (rc->cuCtxGetCurrent != NULL &&
      rc->cuCtxGetCurrent(&here) == MP__CU_SUCCESS && here != NULL &&
      !mp__is_primary(d, here))
    return NULL;
  return mp__pl_pool_of(pl, d);
}

int mp__pl_primary_current(void) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  mp__cuctx here = NULL;
  int d = -1;
  if (rc->cuCtxGetCurrent == NULL || rc->cuCtxGetDevice == NULL ||
      rc->cuCtxGetCurrent(&here) != MP__CU_SUCCESS || here == NULL ||
      rc->cuCtxGetDevice(&d) != MP__CU_SUCCESS || d < 0 ||
      d >= MP__PL_MAX_DEVICES)
    return -1;
  return mp__is_primary(d, here) ? d : -1;
}

/* cuda_runtime_api.h, cudaDeviceReset: "::cudaDeviceReset() will not
 * destroy memory allocations by ::cudaMallocAsync() and
 * ::cudaMallocFromPoolAsync(). These memory allocations need to be
 * destroyed explicitly." They come from the device's memory pool, not the
 * context (cuda.h, cuDevicePrimaryCtxReset, which cudaDeviceReset calls,
 * says only "Destroy all allocations and reset all state on the primary
 * context"): the stricter word of the two is followed. */
int mp__pl_reset_owner(bool stream_ordered) {
  return stream_ordered ? -1 : mp__pl_primary_current();
}

/* A driver without cuCtxGetDevice (a test double) has one device. */
mp_pool_t *mp__pl_pool_here(const mp__pl_t *pl) {
  return mp__pl_pool_current(pl, mp__pl_real_cuda()->cuCtxGetDevice);
}

mp__pl_stream_where_t mp__pl_stream_where(const mp__pl_t *pl, mp__custream s,
                                          int *ordinal) {
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  mp__cuctx owner = NULL, here = NULL;
  if (pl->host || s == NULL || s == MP__CU_STREAM_LEGACY ||
      s == MP__CU_STREAM_PER_THREAD || rc->cuStreamGetCtx == NULL ||
      rc->cuStreamGetCtx(s, &owner) != MP__CU_SUCCESS || owner == NULL)
    return MP__PL_STREAM_HERE;
  /* A stream of a device's primary context whose pool is made: that
   * device, current or not, with no more questions to the driver. */
  for (int d = 0; d < MP__PL_MAX_DEVICES; d++)
    if (atomic_load_explicit(&mp__devs[d].primary, memory_order_acquire) ==
        owner) {
      *ordinal = d;
      return MP__PL_STREAM_DEVICE;
    }
  if (rc->cuCtxGetCurrent == NULL ||
      rc->cuCtxGetCurrent(&here) != MP__CU_SUCCESS || owner == here)
    return MP__PL_STREAM_HERE;
  /* A device without a pool yet, or a context the program made: the
   * device asked in the stream's context. */
  int d = -1;
  mp__cuctx popped = NULL;
  if (rc->cuCtxPushCurrent_v2 == NULL || rc->cuCtxPopCurrent_v2 == NULL ||
      rc->cuCtxGetDevice == NULL ||
      rc->cuCtxPushCurrent_v2(owner) != MP__CU_SUCCESS)
    return MP__PL_STREAM_HERE;
  mp__curesult r = rc->cuCtxGetDevice(&d);
  (void)rc->cuCtxPopCurrent_v2(&popped);
  if (r != MP__CU_SUCCESS || d < 0 || d >= MP__PL_MAX_DEVICES)
    return MP__PL_STREAM_HERE;
  if (!mp__is_primary(d, owner))
    return MP__PL_STREAM_FOREIGN;
  *ordinal = d;
  return MP__PL_STREAM_DEVICE;
}

mp_pool_t *mp__pl_pool_for_stream(const mp__pl_t *pl, mp__custream s,
                                  mp_pool_t *(*here)(const mp__pl_t *)) {
  int d = -1;
  switch (mp__pl_stream_where(pl, s, &d)) {
  case MP__PL_STREAM_DEVICE: return mp__pl_pool_of(pl, d);
  case MP__PL_STREAM_FOREIGN: return NULL;
  case MP__PL_STREAM_HERE: break;
  }
  return here(pl);
}

bool mp__pl_stream_of_pool(const mp__pl_t *pl, const mp_pool_t *pool,
                           mp__custream s, mp__cuctx *owner_out) {
  if (pl->host)
    return true;
  const mp__real_cuda_t *rc = mp__pl_real_cuda();
  int d = mp__pl_pool_ordinal(pool);
  mp__cuctx owner = NULL,
            primary = d < 0 ? NULL
                            : atomic_load_explicit(&mp__devs[d].primary,
                                                   memory_order_acquire);
  if (primary == NULL)
    return true;
  bool dflt =
      s == NULL || s == MP__CU_STREAM_LEGACY || s == MP__CU_STREAM_PER_THREAD;
  mp__curesult r =
      dflt ? (rc->cuCtxGetCurrent ? rc->cuCtxGetCurrent(&owner) : 1u)
           : (rc->cuStreamGetCtx ? rc->cuStreamGetCtx(s, &owner) : 1u);
  *owner_out = owner;
  return r != MP__CU_SUCCESS || owner == NULL || owner == primary;
}

int mp__pl_pool_ordinal(const mp_pool_t *pool) {
  for (int d = 0; d < MP__PL_MAX_DEVICES; d++)
    if (atomic_load_explicit(&mp__devs[d].pool, memory_order_acquire) == pool)
      return d;
  return -1;
}

void mp__pl_each_device(void (*fn)(mp_device_t *, void *), void *ctx) {
  pthread_rwlock_rdlock(&mp__devs_walk);
  for (int i = 0; i < MP__PL_MAX_DEVICES; i++) {
    mp_device_t *dev = NULL;
    if (atomic_load_explicit(&mp__devs[i].pool, memory_order_acquire) != NULL &&
        (dev = atomic_load(&mp__devs[i].dev)) != NULL)
      fn(dev, ctx);
  }
  pthread_rwlock_unlock(&mp__devs_walk);
}

/* Drops the held entries for which drop(entry, ctx) says so. Under
 * mp__devs_lock. */
static void mp__held_drop(bool (*drop)(const mp__held_t *, const void *),
                          const void *ctx) {
  size_t kept = 0;
  for (size_t k = 0; k < mp__nheld; k++)
    if (!drop(&mp__held[k], ctx))
      mp__held[kept++] = mp__held[k];
  mp__nheld = kept;
}

static bool mp__held_is_stream(const mp__held_t *h, const void *s) {
  return h->s == (mp__custream)s;
}

static bool mp__held_on_device(const mp__held_t *h, const void *ordinal) {
  return h->ordinal == *(const int *)ordinal;
}

mp_status_t mp__pl_devices_add_stream(mp_pool_t *pool, mp__custream s) {
  mp_status_t st = mp_pool_add_stream(pool, (mp_stream_t)s);
  int d = -1;
  if (st != MP_EBUSY || s == NULL || (d = mp__pl_pool_ordinal(pool)) < 0)
    return st;
  bool held = false;
  pthread_mutex_lock(&mp__devs_lock);
  /* Still paused: held, and a resume's drain (under this lock, after the
   * pools run again) sees it. Running again: added below. */
  if (mp__pool_is_paused(pool)) {
    if (mp__nheld == mp__held_cap) {
      size_t cap = mp__held_cap ? 2 * mp__held_cap : 16;
      mp__held_t *more = realloc(mp__held, cap * sizeof *more);
      if (more != NULL) {
        mp__held = more;
        mp__held_cap = cap;
      }
    }
    if (mp__nheld < mp__held_cap) {
      mp__held[mp__nheld++] = (mp__held_t){.s = s, .ordinal = d};
      held = true;
    }
  }
  pthread_mutex_unlock(&mp__devs_lock);
  return held ? MP_OK : mp_pool_add_stream(pool, (mp_stream_t)s);
}

void mp__pl_devices_unhold(mp__custream s) {
  pthread_mutex_lock(&mp__devs_lock);
  mp__held_drop(mp__held_is_stream, s);
  pthread_mutex_unlock(&mp__devs_lock);
}

/* Added to its device's pool, or kept while that pool is still paused. */
static bool mp__held_added(const mp__held_t *h, const void *unused) {
  (void)unused;
  mp_pool_t *pool =
      atomic_load_explicit(&mp__devs[h->ordinal].pool, memory_order_acquire);
  return pool == NULL ||
         mp_pool_add_stream(pool, (mp_stream_t)h->s) != MP_EBUSY;
}

/* Under mp__devs_walk read, as the pause and resume: a reset on another
 * thread does not destroy a pool under it. */
void mp__pl_devices_resumed(void) {
  pthread_rwlock_rdlock(&mp__devs_walk);
  pthread_mutex_lock(&mp__devs_lock);
  mp__held_drop(mp__held_added, NULL);
  pthread_mutex_unlock(&mp__devs_lock);
  pthread_rwlock_unlock(&mp__devs_walk);
}

/* mp__pl_each_pool with mp__devs_walk held by the caller. */
static void mp__each_pool(const mp__pl_t *pl,
                          void (*fn)(mp_pool_t *, int, void *), void *ctx) {
  if (pl->mode == MP__PL_POOL && pl->host) {
    fn(pl->pool, 0, ctx);
    return;
  }
  for (int i = 0; i < MP__PL_MAX_DEVICES; i++) {
    mp_pool_t *p =
        atomic_load_explicit(&mp__devs[i].pool, memory_order_acquire);
    if (p != NULL)
      fn(p, i, ctx);
  }
}

void mp__pl_each_pool(const mp__pl_t *pl, void (*fn)(mp_pool_t *, int, void *),
                      void *ctx) {
  pthread_rwlock_rdlock(&mp__devs_walk);
  mp__each_pool(pl, fn, ctx);
  pthread_rwlock_unlock(&mp__devs_walk);
}

static void mp__collect(mp_pool_t *pool, int ordinal, void *ctx) {
  mp__pl_pools_t *ps = ctx;
  if (ps->n < MP__PL_MAX_DEVICES) {
    ps->pool[ps->n] = pool;
    ps->ordinal[ps->n++] = ordinal;
  }
}

/* Under mp__devs_walk, read, over fn as over the collection: a reset of a
 * device on another thread destroys its retired pool under the lock
 * written (mp__pl_devices_release), so not under fn's use of it. */
void mp__pl_with_pools(const mp__pl_t *pl, void (*fn)(mp__pl_pools_t *, void *),
                       void *ctx) {
  mp__pl_pools_t ps = {.n = 0};
  pthread_rwlock_rdlock(&mp__devs_walk);
  mp__each_pool(pl, mp__collect, &ps);
  fn(&ps, ctx);
  pthread_rwlock_unlock(&mp__devs_walk);
}

/* The lookup runs under mp__devs_walk, read, which a reset takes written
 * to destroy a retired pool (mp__pl_devices_release): a free of any
 * device's memory the shim does not know comes here, and a reset of
 * another device on another thread (cuda.h's rule for
 * cuDevicePrimaryCtxReset binds only users of that device) would
 * otherwise destroy its pool under the lookup. The lock is the one this
 * took already; it is held a little longer, no new lock on the free path.
 * Each pool's lock is taken inside it, as the walks' callbacks do; no one
 * holding a pool's lock takes mp__devs_walk. */
bool mp__pl_pools_hold(const mp__pl_t *pl, uintptr_t addr) {
  mp__pl_pools_t ps = {.n = 0};
  bool in = false;
  if (pl->mode != MP__PL_POOL || addr == 0)
    return false;
  pthread_rwlock_rdlock(&mp__devs_walk);
  mp__each_pool(pl, mp__collect, &ps);
  for (int k = 0; k < ps.n && !in; k++)
    in = mp__pool_contains(ps.pool[k], (const void *)addr);
  pthread_rwlock_unlock(&mp__devs_walk);
  return in;
}

int mp__pl_snapshot(const mp__pl_t *pl, const char *path) {
  /* Each refusal says why in the last error (a ctypes caller reads it;
   * before, it was whatever failed last on the thread). */
  if (path == NULL)
    return mp__fail(MP_EINVAL, "mempool_preload_snapshot: path is NULL");
  if (pl == NULL || pl->mode != MP__PL_POOL)
    return mp__fail(MP_EINVAL, "mempool_preload_snapshot: no pool to "
                               "snapshot: the shim does not serve "
                               "allocations (MEMPOOL_PRELOAD)");
  mp__pl_pools_t ps = {.n = 0};
  pthread_rwlock_rdlock(&mp__devs_walk);
  mp__each_pool(pl, mp__collect, &ps);
  /* No pool now (every device reset, as a program ending with
   * cudaDeviceReset leaves it; or none could be made): the snapshot
   * refuses it and says so ("no pool"). */
  mp_status_t st =
      mp__pool_snapshot_many(ps.pool, ps.ordinal, (size_t)ps.n, path);
  pthread_rwlock_unlock(&mp__devs_walk);
  if (st != MP_OK)
    fprintf(stderr, "mempool preload: snapshot '%s': %s\n", path,
            mp_last_error());
  return (int)st;
}

/* Retired pools not yet released (mp__pl_devices_release) stay reachable
 * here (as a forked child's parent pool does in state.c), so that a leak
 * checker does not report them. Under mp__devs_lock. */
typedef struct mp__retired {
  mp_pool_t *pool;
  mp_device_t *dev;
  struct mp__retired *next;
} mp__retired_t;
static mp__retired_t *mp__retired;

mp_pool_t *mp__pl_devices_retire(const mp__pl_t *pl, int ordinal) {
  if (ordinal < 0 || ordinal >= MP__PL_MAX_DEVICES)
    return NULL;
  /* In every mode: passthrough asks whose memory it passes through too. */
  atomic_store(&mp__devs[ordinal].seen, NULL);
  if (pl->mode != MP__PL_POOL || pl->host)
    return NULL;
  mp__retired_t *keep = calloc(1, sizeof *keep);
  pthread_mutex_lock(&mp__devs_lock);
  mp_pool_t *pool = atomic_exchange(&mp__devs[ordinal].pool, NULL);
  if (pool != NULL && keep != NULL) {
    *keep = (mp__retired_t){.pool = pool,
                            .dev = atomic_load(&mp__devs[ordinal].dev),
                            .next = mp__retired};
    mp__retired = keep;
    keep = NULL;
  }
  atomic_store(&mp__devs[ordinal].dev, NULL);
  atomic_store(&mp__devs[ordinal].failed, false);
  atomic_store(&mp__devs[ordinal].primary, NULL);
  mp__devs[ordinal].resetting++;
  mp__held_drop(mp__held_on_device, &ordinal); /* the reset destroys them */
  pthread_mutex_unlock(&mp__devs_lock);
  free(keep);
  return pool;
}

void mp__pl_devices_reset_done(const mp__pl_t *pl, int ordinal) {
  if (ordinal < 0 || ordinal >= MP__PL_MAX_DEVICES || pl->mode != MP__PL_POOL ||
      pl->host)
    return;
  pthread_mutex_lock(&mp__devs_lock);
  if (mp__devs[ordinal].resetting > 0)
    mp__devs[ordinal].resetting--;
  pthread_mutex_unlock(&mp__devs_lock);
}

/* What mp__retired_entry does with the entry it finds. */
typedef enum {
  MP__RETIRED_LOOK,     /* nothing */
  MP__RETIRED_TAKE,     /* takes it out: pool and device are gone */
  MP__RETIRED_DEV_ONLY, /* the pool is gone, its device is kept */
} mp__retired_do_t;

/* Finds pool in the retired list (its device in *dev) and does `what`
 * with it; false when it is not there. */
static bool mp__retired_entry(mp_pool_t *pool, mp_device_t **dev,
                              mp__retired_do_t what) {
  pthread_mutex_lock(&mp__devs_lock);
  mp__retired_t **at = &mp__retired;
  while (*at != NULL && (*at)->pool != pool)
    at = &(*at)->next;
  mp__retired_t *r = *at;
  if (r != NULL) {
    *dev = r->dev;
    if (what == MP__RETIRED_TAKE)
      *at = r->next;
    else if (what == MP__RETIRED_DEV_ONLY)
      r->pool = NULL; /* never found by a pool again */
  }
  pthread_mutex_unlock(&mp__devs_lock);
  if (what == MP__RETIRED_TAKE)
    free(r);
  return r != NULL;
}

bool mp__pl_devices_release(const mp__pl_t *pl, mp_pool_t *pool) {
  mp_device_t *dev = NULL;
  if (pool == NULL || !mp__retired_entry(pool, &dev, MP__RETIRED_LOOK))
    return false;
  char name[96], why[512] = "", closing[512] = "";
  snprintf(name, sizeof name, "%s", dev != NULL ? mp_device_name(dev) : "?");
  int destroyed = 0;
  pthread_rwlock_wrlock(&mp__devs_walk);
  mp_status_t st = mp_pool_destroy_ex(pool, &destroyed);
  bool gone = destroyed != 0;
  if (st != MP_OK)
    snprintf(why, sizeof why, "%s", mp_last_error());
  /* The first device's stays open: the host pool (host.c) and the report
   * use it (pl->dev). A close the device refuses (mp_device_close_ex: its
   * wait for the device's work refused, from a host function or beside a
   * capture) leaves it open: it stays in the retired list, reachable and
   * said, until exit, as a pool that cannot be released does. Before, it
   * was dropped without a word, open: its memory, streams, events and
   * retain of the primary context leaked. */
  bool closed = !gone || dev == NULL || dev == pl->dev ||
                mp_device_close_ex(dev) == MP_OK;
  if (!closed)
    snprintf(closing, sizeof closing, "%s", mp_last_error());
  pthread_rwlock_unlock(&mp__devs_walk);
  if (gone)
    (void)mp__retired_entry(pool, &dev,
                            closed ? MP__RETIRED_TAKE : MP__RETIRED_DEV_ONLY);
  if (st != MP_OK)
    MP__PL_SAY("cuDevicePrimaryCtxReset: the pool of device '%s' %s: %s", name,
               gone ? "was released with an error"
                    : "cannot be released and is kept until exit",
               why);
  if (!closed)
    MP__PL_SAY("cuDevicePrimaryCtxReset: device '%s' cannot be closed and is "
               "kept open until exit: %s",
               name, closing);
  return gone;
}

mp_pool_t *mp__pl_pool_first(const mp__pl_t *pl) {
  if (pl->mode != MP__PL_POOL)
    return NULL;
  if (pl->host)
    return pl->pool;
  if (pl->ordinal < 0 || pl->ordinal >= MP__PL_MAX_DEVICES)
    return NULL;
  return atomic_load_explicit(&mp__devs[pl->ordinal].pool,
                              memory_order_acquire);
}
