/* default.c - the drop-in replacement for cudaMalloc: process-wide pools.
 *
 * The first pool is made on first use, exactly once even when threads race
 * (pthread_once), on mp_device_open(NULL) (which honours $MEMPOOL_DEVICE)
 * with mp_pool_config_init ($MEMPOOL_CONF). When it cannot be made the
 * reason is kept and every later call fails with it. On a backend with
 * several devices (CUDA) the calling thread's device is served, as
 * cudaMalloc serves the current context's, and a stream-ordered allocation
 * the stream's device, as cuMemAllocAsync: every other device gets a pool
 * of its own on first use, opened as "cuda:N" with the same options. A
 * free goes to the pool whose memory holds the pointer. Pools and devices
 * live until the process exits.
 *
 * A child forked after the pools were made has copies of them, but not the
 * device memory or the threads their streams run on (CUDA's own state is
 * not inherited either): every call of the child on them is refused
 * (MP_EINVAL) instead of waiting for work no thread will ever run (a trim,
 * PyTorch's empty_cache, hung there before 2026-12-01). A child of a
 * parent whose make failed is refused with the parent's reason and status
 * (it was told of pools that were never made). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "internal.h"
#include "pool/pool_internal.h"

static pthread_once_t mp__default_once = PTHREAD_ONCE_INIT;
static mp_pool_t *mp__default;
static int mp__default_ordinal;
static mp_status_t mp__default_status = MP_OK;
static char mp__default_error[MP__ERROR_MAX];
static int mp__default_cu; /* its driver code (mp_last_driver_error) */
/* The other devices' pools: written once each under the lock. */
static _Atomic(mp_pool_t *) mp__others[MP__DEFAULT_DEVICES];
/* The other devices opened only to wait for a stream of theirs
 * (mp__free_elsewhere) before they had a pool: written once each under the
 * lock, kept as the pools are, and the pool's device once it is made. */
static _Atomic(mp_device_t *) mp__others_dev[MP__DEFAULT_DEVICES];
static pthread_mutex_t mp__others_lock = PTHREAD_MUTEX_INITIALIZER;
/* Set in a child forked after mp__default_make: the pools are the
 * parent's. */
static atomic_bool mp__default_forked;
/* The options of every default pool, $MEMPOOL_CONF's as mp__default_make
 * read it once: written there, read after its once. */
static mp_pool_config_t mp__default_cfg;
/* Set once mp__default_make has run: mp_default_pool_made. */
static atomic_bool mp__default_done;
/* Set by a thread back from the once without a pool: the make is over and
 * failed, for good, and no once is left half-run for a forked child. */
static atomic_bool mp__default_failed;

static void mp__default_child(void) {
  atomic_store_explicit(&mp__default_forked, true, memory_order_relaxed);
}

static bool mp__default_in_child(void) {
  return atomic_load_explicit(&mp__default_forked, memory_order_relaxed);
}

static mp_status_t mp__default_unavailable(void) {
  return mp__fail_driver(mp__default_cu, mp__default_status,
                         "default pool unavailable: %s", mp__default_error);
}

/* A child of a parent whose make failed has no pools of the parent's: it
 * is refused with the parent's reason, not told of pools never made (it
 * still takes no lock, as a parent's thread may have held it). */
bool mp__default_refused(void) {
  if (!mp__default_in_child())
    return false;
  if (atomic_load_explicit(&mp__default_failed, memory_order_acquire)) {
    (void)mp__default_unavailable();
    return true;
  }
  mp__fail(MP_EINVAL, "default pool: this process was forked from the one "
                      "that made the default pools, whose device memory "
                      "and stream threads it does not have");
  return true;
}

static void mp__default_make_once(void);
static void mp__default_make(void);

/* The once, then mp__default_failed where it gave no pool. */
static void mp__default_run(void) {
  pthread_once(&mp__default_once, mp__default_make);
  if (mp__default == NULL)
    atomic_store_explicit(&mp__default_failed, true, memory_order_release);
}

/* Its first step registers the fork handler. A child forked while another
 * thread of its parent is between that and the end would have glibc's
 * pthread_once run this again (the once's state is reset in a child forked
 * while it was running) from the parent's half-made state: a device open
 * the parent had begun, its locks held for ever. So every caller asks
 * mp__default_refused() before the once. */
static void mp__default_make(void) {
  mp__default_make_once();
  atomic_store_explicit(&mp__default_done, true, memory_order_release);
}

int mp_default_pool_made(void) {
  return atomic_load_explicit(&mp__default_done, memory_order_acquire);
}

static void mp__default_make_once(void) {
  (void)pthread_atfork(NULL, NULL, mp__default_child);
  /* $MEMPOOL_CONF read once, for every device's pool (mempool.h: fixed
   * for the process once the first pool is made). */
  mp_pool_config_init(&mp__default_cfg);
  mp_device_t *dev = NULL;
  mp_status_t st = mp_device_open(NULL, &dev);
  if (st == MP_OK) {
    mp_pool_config_t cfg = mp__default_cfg;
    st = mp_pool_create(dev, &cfg, &mp__default);
    if (st != MP_OK)
      mp_device_close(dev);
    else
      mp__pool_for_good(mp__default);
  }
  if (st != MP_OK) {
    mp__default_status = st;
    mp__default_cu = mp_last_driver_error();
    snprintf(mp__default_error, sizeof mp__default_error, "%s",
             mp_last_error());
    return;
  }
  /* -1: a backend of one device, nothing more to serve. */
  int here;
  mp__default_ordinal =
      mp__device_stream_ordinal(dev, NULL, &here) != MP_ENOTSUP
          ? mp__device_ordinal(dev)
          : -1;
}

static mp_status_t mp__default_open(int ordinal, mp_device_t **dev) {
  char spec[32];
  snprintf(spec, sizeof spec, "cuda:%d", ordinal);
  return mp_device_open(spec, dev);
}

/* Whether another device's ordinal is served (MP_ENODEV set where not);
 * *pool its pool, NULL if none is made yet. */
static bool mp__default_served(int ordinal, mp_pool_t **pool) {
  if (ordinal >= MP__DEFAULT_DEVICES) {
    mp__fail(MP_ENODEV, "default pool: device %d is past the %d served",
             ordinal, MP__DEFAULT_DEVICES);
    return false;
  }
  *pool = atomic_load_explicit(&mp__others[ordinal], memory_order_acquire);
  return true;
}

/* Device ordinal's pool, made now if need be; NULL with the error set. */
static mp_pool_t *mp__default_other(int ordinal) {
  mp_pool_t *pool = NULL;
  if (!mp__default_served(ordinal, &pool))
    return NULL;
  if (pool != NULL)
    return pool;
  pthread_mutex_lock(&mp__others_lock);
  pool = atomic_load(&mp__others[ordinal]);
  if (pool == NULL) {
    /* The device a wait opened, else one opened now (closed again if the
     * pool cannot be made). */
    mp_device_t *dev = atomic_load(&mp__others_dev[ordinal]);
    bool opened = dev == NULL;
    /* The first pool's options: $MEMPOOL_CONF is not read again (a later
     * change would give devices different options, mempool.h). */
    mp_pool_config_t cfg = mp__default_cfg;
    mp_status_t st = opened ? mp__default_open(ordinal, &dev) : MP_OK;
    if (st == MP_OK && mp_pool_create(dev, &cfg, &pool) != MP_OK) {
      if (opened)
        mp_device_close(dev);
      pool = NULL;
    }
    if (pool != NULL) {
      mp__pool_for_good(pool);
      atomic_store_explicit(&mp__others[ordinal], pool, memory_order_release);
    }
  }
  pthread_mutex_unlock(&mp__others_lock);
  return pool;
}

/* Device ordinal's handle, to wait for a stream of it: its default
 * pool's, else one opened for that (kept, and given to the pool if one is
 * made later). No pool is made: a free of another device's block on a
 * stream of this one asks for none. NULL with the error set. */
static mp_device_t *mp__default_device(int ordinal) {
  mp_pool_t *pool = NULL;
  if (ordinal == mp__default_ordinal)
    return mp_pool_device(mp__default);
  if (!mp__default_served(ordinal, &pool))
    return NULL;
  if (pool != NULL)
    return mp_pool_device(pool);
  mp_device_t *dev =
      atomic_load_explicit(&mp__others_dev[ordinal], memory_order_acquire);
  if (dev != NULL)
    return dev;
  pthread_mutex_lock(&mp__others_lock);
  pool = atomic_load(&mp__others[ordinal]);
  dev = pool != NULL ? mp_pool_device(pool)
                     : atomic_load(&mp__others_dev[ordinal]);
  if (dev == NULL && mp__default_open(ordinal, &dev) == MP_OK)
    atomic_store_explicit(&mp__others_dev[ordinal], dev, memory_order_release);
  pthread_mutex_unlock(&mp__others_lock);
  return dev;
}

/* The pool of the device work on s runs on (the calling thread's for the
 * default streams), made now if need be; NULL with the error set. */
static mp_pool_t *mp__default_of_stream(mp_stream_t s) {
  if (mp__default_refused()) /* before the once: see mp__default_make */
    return NULL;
  mp__default_run();
  if (mp__default == NULL) {
    (void)mp__default_unavailable();
    return NULL;
  }
  int here = -1;
  if (mp__default_ordinal < 0 ||
      mp__device_stream_ordinal(mp_pool_device(mp__default), s, &here) !=
          MP_OK ||
      here == mp__default_ordinal || here < 0)
    return mp__default;
  return mp__default_other(here);
}

mp_pool_t *mp_default_pool(void) {
  return mp__default_of_stream(NULL);
}

mp_pool_t *mp__default_pool_for(int device) {
  if (mp__default_refused()) /* before the once: see mp__default_make */
    return NULL;
  mp__default_run();
  if (mp__default == NULL) {
    (void)mp__default_unavailable();
    return NULL;
  }
  /* A backend of one device (the emulated one answers to 0). */
  int only = mp__default_ordinal < 0 ? mp__device_ordinal(mp__default->dev)
                                     : mp__default_ordinal;
  if (device == only)
    return mp__default;
  if (mp__default_ordinal < 0 || device < 0) {
    mp__fail(MP_ENODEV,
             "default pool: device %d asked, but '%s' is the only "
             "one served",
             device, mp_device_name(mp__default->dev));
    return NULL;
  }
  return mp__default_other(device);
}

/* Before the first pool there is none to visit, and none is made for it
 * (PyTorch's empty_cache makes none either). */
void mp__default_each(void (*fn)(mp_pool_t *pool)) {
  if (!mp_default_pool_made())
    return;
  if (mp__default_in_child())
    return;
  mp__default_run();
  if (mp__default != NULL)
    fn(mp__default);
  for (int i = 0; i < MP__DEFAULT_DEVICES; i++) {
    mp_pool_t *o = atomic_load_explicit(&mp__others[i], memory_order_acquire);
    if (o != NULL)
      fn(o);
  }
}

/* The pool whose memory holds ptr, among the pools already made: as
 * cudaFree frees memory of any device, whatever device the calling thread
 * is on, and never makes that device's pool to do it (which could fail and
 * leave the block allocated). NULL with the error set where no pool holds
 * ptr (MP_EINVAL, naming fn, the caller's function) or there is none. */
mp_pool_t *mp__default_owner(void *ptr, const char *fn) {
  /* Before the first pool no pool holds ptr, and making one to say so
   * would read $MEMPOOL_DEVICE and $MEMPOOL_CONF for good, open a device
   * and answer with that device's failure. A block mp_malloc handed out
   * came after mp__default_done was set, and reached this thread after
   * that. */
  if (!mp_default_pool_made()) {
    mp__fail(MP_EINVAL,
             "%s: %p was not allocated from any device's default pool "
             "(mp_malloc): none was made yet",
             fn, ptr);
    return NULL;
  }
  /* A make that failed for good needs no once: nor a refusal in a child,
   * where no pool holds ptr either. */
  if (!atomic_load_explicit(&mp__default_failed, memory_order_acquire)) {
    if (mp__default_refused()) /* before the once: see mp__default_make */
      return NULL;
    mp__default_run();
  }
  /* No pool at all holds no pointer: the device's failure is the
   * allocations' answer, not a free's. */
  if (mp__default == NULL) {
    mp__fail(MP_EINVAL,
             "%s: %p was not allocated from any device's default pool "
             "(mp_malloc): none could be made (%s)",
             fn, ptr, mp__default_error);
    return NULL;
  }
  /* A backend of one device: its pool is the only one, and says what is
   * wrong with a pointer it does not hold. */
  if (mp__default_ordinal < 0 || mp__pool_contains(mp__default, ptr))
    return mp__default;
  for (int i = 0; i < MP__DEFAULT_DEVICES; i++) {
    mp_pool_t *o = atomic_load_explicit(&mp__others[i], memory_order_acquire);
    if (o != NULL && mp__pool_contains(o, ptr))
      return o;
  }
  mp__fail(MP_EINVAL,
           "%s: %p was not allocated from any device's default pool "
           "(mp_malloc)",
           fn, ptr);
  return NULL;
}

/* After a getter above gave NULL: the status of the reason mp_last_error()
 * gives, which every getter recorded (otherwise where none was). */
static mp_status_t mp__default_failure(mp_status_t otherwise) {
  return mp__last_failure() != MP_OK ? mp__last_failure() : otherwise;
}

/* mp_malloc_async, the events' stacks starting at ra (the entry point's
 * caller), not at this file's frames. */
static mp_status_t mp__malloc_from(void **ptr, size_t bytes, mp_stream_t s,
                                   void *ra) {
  if (ptr == NULL)
    return mp__fail(MP_EINVAL, "mp_malloc: ptr is NULL");
  mp_pool_t *pool = mp__default_of_stream(s);
  if (pool == NULL)
    return mp__default_failure(MP_ENODEV);
  MP__HIST_ENTRY_AT(pool, ra);
  return mp__pool_alloc_marked(pool, bytes, s, ptr);
}

mp_status_t mp_malloc(void **ptr, size_t bytes) {
  return mp__malloc_from(ptr, bytes, NULL, __builtin_return_address(0));
}

mp_status_t mp_malloc_async(void **ptr, size_t bytes, mp_stream_t s) {
  return mp__malloc_from(ptr, bytes, s, __builtin_return_address(0));
}

mp_status_t mp_free(void *ptr) {
  if (ptr == NULL)
    return MP_OK;
  mp_pool_t *pool = mp__default_owner(ptr, "mp_free");
  if (pool == NULL)
    return mp__default_failure(MP_EINVAL);
  MP__HIST_ENTRY(pool);
  return mp__pool_free_named(pool, ptr, "mp_free");
}

/* cudaFreeAsync takes a stream of any device, the default streams being
 * the calling thread's device's. A block of pool freed on a stream s of
 * another device (the block's pool cannot order on it: its events are of
 * its own context) waits here for s, through that device's handle (its
 * default pool is not made for it), and is then free on its own stream,
 * whose work pool orders. *elsewhere: whether s was another device's. */
static mp_status_t mp__free_elsewhere(mp_pool_t *pool, void *ptr, mp_stream_t s,
                                      bool *elsewhere) {
  int here = -1, mine = mp__device_ordinal(mp_pool_device(pool));
  *elsewhere =
      mp__default_ordinal >= 0 &&
      mp__device_stream_ordinal(mp_pool_device(pool), s, &here) == MP_OK &&
      here >= 0 && here != mine;
  if (!*elsewhere)
    return MP_OK;
  /* Through device here's handle, not its pool: making that pool (which
   * the caller never asked for) only to wait made a pool, and could fail
   * and leave the block allocated. */
  mp_device_t *home = mp__default_device(here);
  if (home == NULL)
    return mp__default_failure(MP_ENODEV);
  /* cuda.h: no synchronize during a capture (it would invalidate it); a
   * stream whose capture cannot be told is not waited for either. */
  int capturing = mp__device_stream_capturing(home, s);
  if (capturing == -2) /* the driver's own failure (a kernel's fault) */
    return mp__fail(MP_EDRIVER, "mp_free_async: %s", mp_last_error());
  if (capturing != 0)
    return mp__fail(MP_EBUSY,
                    "mp_free_async: %p is device %d's memory and stream %p "
                    "of device %d is being captured (or cannot say): the "
                    "free cannot be ordered after it; nothing freed",
                    ptr, mine, (void *)s, here);
  mp_status_t st = mp_stream_synchronize(home, s);
  if (st != MP_OK)
    return st; /* nothing freed */
  return mp__pool_free_named(pool, ptr, "mp_free_async");
}

mp_status_t mp_free_async(void *ptr, mp_stream_t s) {
  if (ptr == NULL)
    return MP_OK;
  mp_pool_t *pool = mp__default_owner(ptr, "mp_free_async");
  if (pool == NULL)
    return mp__default_failure(MP_EINVAL);
  MP__HIST_ENTRY(pool); /* as mp_free's */
  bool elsewhere;
  mp_status_t st = mp__free_elsewhere(pool, ptr, s, &elsewhere);
  return elsewhere ? st : mp__pool_free_on(pool, ptr, s, "mp_free_async");
}
