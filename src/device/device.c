/* device.c - the device shim's front: argument checks, spec parsing, and
 * dispatch to a backend (host.c, cuda.c) through its mp__backend_t table.
 *
 * Everything a caller can pass in is checked here, so a backend may trust
 * its arguments: non-NULL handles and outputs, non-zero sizes. A failing
 * call returns before the backend is reached and changes nothing. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

#define MP__CHECK_DEV(dev)                                                     \
  do {                                                                         \
    if (MP__UNLIKELY((dev) == NULL))                                           \
      return mp__fail(MP_EINVAL, "%s: device is NULL", __func__);              \
  } while (0)
#define MP__CHECK_OUT(p)                                                       \
  do {                                                                         \
    if (MP__UNLIKELY((p) == NULL))                                             \
      return mp__fail(MP_EINVAL, "%s: %s is NULL", __func__, #p);              \
  } while (0)

/* The device's refusal of call fn made where it may not be (a host
 * function), before anything changes. */
static mp_status_t mp__device_caller_check(mp_device_t *dev, const char *fn) {
  return dev->ops->caller_check != NULL ? dev->ops->caller_check(dev, fn)
                                        : MP_OK;
}

static mp_status_t mp__open_backend(const mp__backend_t *ops, const char *opts,
                                    mp_device_t **out) {
  mp_device_t *dev = mp__host_calloc(1, sizeof *dev);
  if (dev == NULL)
    return mp__fail(MP_ENOMEM, "out of host memory opening a device");
  dev->ops = ops;
  mp_status_t st = ops->open(dev, opts);
  if (st != MP_OK) {
    free(dev);
    return st;
  }
  *out = dev;
  return MP_OK;
}

enum { MP__SPEC_BAD, MP__SPEC_HOST, MP__SPEC_CUDA };

/* The device spec names: host or cuda, *opts what follows the colon ("" if
 * none), *ordinal the index of a cuda spec; MP__SPEC_BAD with mp__fail's
 * message for a name it does not know, "cuda:" cut short or a bad index
 * (checked in every build: "cuda:x" is a bad spec, not a missing backend). */
static int mp__spec_read(const char *spec, const char **opts, int *ordinal) {
  const char *colon = strchr(spec, ':');
  size_t name_len = colon ? (size_t)(colon - spec) : strlen(spec);
  *opts = colon ? colon + 1 : "";
  if (name_len == 4 && memcmp(spec, "host", 4) == 0)
    return MP__SPEC_HOST;
  if (name_len == 4 && memcmp(spec, "cuda", 4) == 0) {
    /* "cuda:" with no index is a spec cut short, not device 0. */
    if (colon != NULL && (*opts)[0] == '\0') {
      (void)mp__fail(MP_EINVAL, "bad device spec 'cuda:': expected a device "
                                "index after the colon ('cuda' or 'cuda:N')");
      return MP__SPEC_BAD;
    }
    return mp__cuda_spec_index(*opts, ordinal) == MP_OK ? MP__SPEC_CUDA
                                                        : MP__SPEC_BAD;
  }
  char shown[MP__CLIP], name[MP__CLIP]; /* room left for the reason */
  (void)mp__fail(MP_EINVAL,
                 "bad device spec '%s': unknown device '%s' (expected "
                 "'host' or 'cuda')",
                 mp__clip(spec, strlen(spec), shown, sizeof shown),
                 mp__clip(spec, name_len, name, sizeof name));
  return MP__SPEC_BAD;
}

mp_status_t mp__cuda_spec_index(const char *opts, int *out) {
  uint64_t n = 0;
  if (opts[0] == '\0') {
    *out = 0;
    return MP_OK;
  }
  char shown[MP__CLIP]; /* a long spec leaves room for the reason */
  if (!mp__parse_u64(opts, strlen(opts), &n) || n > 1024)
    return mp__fail(MP_EINVAL,
                    "bad device spec 'cuda:%s': expected a device index "
                    "('cuda' or 'cuda:N', N from 0 to 1024)",
                    mp__clip(opts, strlen(opts), shown, sizeof shown));
  *out = (int)n;
  return MP_OK;
}

/* text into buf (cap bytes, NUL included), or MP_EINVAL saying how many
 * it needs (buf untouched). */
static mp_status_t mp__spec_out(const char *text, char *buf, size_t cap) {
  size_t n = strlen(text);
  if (n >= cap)
    return mp__fail(MP_EINVAL,
                    "mp_device_spec_canonical: '%s' needs %zu bytes, the "
                    "buffer has %zu",
                    text, n + 1, cap);
  memcpy(buf, text, n + 1);
  return MP_OK;
}

mp_status_t mp_device_open(const char *spec, mp_device_t **out) {
  MP__CHECK_OUT(out);
  /* Nor from a host function (a driver call on the cuda backend): no
   * device yet, so the host backend's check, which tells whether this
   * thread runs a host function of any host device. */
  mp_status_t hst = mp__host_backend.caller_check(NULL, "mp_device_open");
  if (hst != MP_OK)
    return hst;
  if (spec == NULL) {
    spec = getenv("MEMPOOL_DEVICE");
    if (spec == NULL || spec[0] == '\0') {
#if MEMPOOL_HAVE_CUDA
      /* "cuda" where a GPU is usable, else "host": only a machine without
       * a driver or a device (MP_ENODEV) gets host. A driver that fails
       * otherwise is the caller's error, with the driver's reason, never a
       * silent host device where a GPU was meant. */
      mp_status_t st = mp__open_backend(&mp__cuda_backend, "", out);
      if (st != MP_ENODEV)
        return st;
#endif
      spec = "host";
    }
  }
  const char *opts;
  int ordinal;
  int kind = mp__spec_read(spec, &opts, &ordinal);
  if (kind == MP__SPEC_HOST)
    return mp__open_backend(&mp__host_backend, opts, out);
  if (kind != MP__SPEC_CUDA)
    return mp_last_status();
#if MEMPOOL_HAVE_CUDA
  return mp__open_backend(&mp__cuda_backend, opts, out);
#else
  return mp__fail(MP_ENODEV,
                  "device 'cuda': mempool was built without the CUDA backend");
#endif
}

mp_status_t mp_device_spec_canonical(const char *spec, char *buf, size_t cap) {
  MP__CHECK_OUT(spec);
  MP__CHECK_OUT(buf);
  const char *opts;
  int ordinal;
  int kind = mp__spec_read(spec, &opts, &ordinal);
  if (kind == MP__SPEC_BAD)
    return mp_last_status();
  char text[MP_DEVICE_SPEC_MAX];
  mp_status_t st = MP_OK;
  if (kind == MP__SPEC_HOST)
    st = mp__host_spec_canonical(opts, text);
  else
    snprintf(text, sizeof text, "cuda:%d", ordinal);
  return st != MP_OK ? st : mp__spec_out(text, buf, cap);
}

/* mp_device_close_checked's work; *closed says whether dev is gone. */
static mp_status_t mp__device_close(mp_device_t *dev, int *closed) {
  *closed = 0;
  if (dev == NULL) {
    *closed = 1;
    return MP_OK;
  }
  /* Nor from where the device refuses calls (a host function, which runs
   * on one of its streams: the close would stop that stream from its own
   * thread and free what runs it). Refused before anything changes; the
   * refusal is mp_last_error()'s. */
  mp_status_t st = mp__device_caller_check(dev, "mp_device_close");
  if (st != MP_OK)
    return st;
  /* Nor under a pool: it holds the device's memory and streams, and its
   * next call (mp_malloc on a default pool) used them freed. */
  size_t pools = atomic_load(&dev->pools);
  if (pools > 0)
    return mp__fail(MP_EBUSY,
                    "mp_device_close(%s): %zu pool%s still made on it "
                    "(mp_pool_destroy %s first; a default pool lives until "
                    "the process exits); nothing was closed",
                    dev->name, pools, pools == 1 ? " is" : "s are",
                    pools == 1 ? "it" : "them");
  /* Memory that queued work may still use is not given back: a close that
   * cannot wait for the device closes nothing, not even the imports, and
   * says why (the device stays open: close it again once it can wait). */
  if (dev->ops->close_ready != NULL && dev->ops->close_ready(dev) != MP_OK)
    return mp__fail(mp_last_status(),
                    "mp_device_close(%s): %s; nothing was closed (close it "
                    "again once the device's work can be waited for)",
                    dev->name, mp_last_error());
  /* Past here the device closes whatever the driver answers; the first
   * refusal (an import's forced close, then the backend's releases) is
   * the one reported. */
  mp_error_state_t first;
  st = mp__ipc_close_all(dev);
  if (st != MP_OK)
    mp_error_save(&first);
  mp_status_t cst = dev->ops->close(dev);
  if (st != MP_OK && cst != MP_OK)
    mp_error_restore(&first);
  else if (st == MP_OK)
    st = cst;
  free(dev->watch);
  free(dev);
  *closed = 1;
  return st;
}

mp_status_t mp_device_close_checked(mp_device_t *dev, int *closed) {
  int gone;
  mp_status_t st = mp__device_close(dev, &gone);
  if (closed != NULL)
    *closed = gone;
  return st;
}

mp_status_t mp_device_close_ex(mp_device_t *dev) {
  /* Closed is MP_OK here (device.h): what the driver refused on the way is
   * mp_device_close_checked's to say, and the caller's last error stays. */
  mp_error_state_t before;
  mp_error_save(&before);
  int gone;
  mp_status_t st = mp__device_close(dev, &gone);
  if (gone && st != MP_OK) {
    mp_error_restore(&before);
    return MP_OK;
  }
  return st;
}

void mp_device_close(mp_device_t *dev) {
  (void)mp_device_close_ex(dev);
}

/* ---- stream watchers ---------------------------------------------------- */

/* One mutex for every device's list: watchers change when pools are made
 * and destroyed, and are told when a stream goes, all rare. Held while the
 * watchers run, so that an unwatch returns only once no call of its fn is
 * under way (the pool it names may be freed right after). Order: this
 * mutex, then a pool's lock. */
static pthread_mutex_t mp__watch_mu = PTHREAD_MUTEX_INITIALIZER;

static mp_device_t *mp__watch_root(mp_device_t *dev) {
  return dev->ops == &mp__pinned_backend ? (mp_device_t *)dev->impl : dev;
}

const char *mp__device_memory_name(const mp_device_t *dev) {
  return dev->ops == &mp__pinned_backend ? "page-locked host memory"
                                         : "device memory";
}

void mp__device_pools_add(mp_device_t *dev, int delta) {
  dev = mp__watch_root(dev);
  if (delta > 0)
    atomic_fetch_add(&dev->pools, 1);
  else
    atomic_fetch_sub(&dev->pools, 1);
}

mp_status_t mp__device_watch(mp_device_t *dev, void (*fn)(void *, mp_stream_t),
                             void *ctx) {
  dev = mp__watch_root(dev);
  mp_status_t st = MP_OK;
  pthread_mutex_lock(&mp__watch_mu);
  if (dev->nwatch == dev->watch_cap) {
    size_t cap = dev->watch_cap ? dev->watch_cap * 2 : 4;
    mp__watch_t *w = mp__host_realloc(dev->watch, cap * sizeof *w);
    if (w == NULL) {
      st = mp__fail(MP_ENOMEM, "out of host memory for stream watchers");
    } else {
      dev->watch = w;
      dev->watch_cap = cap;
    }
  }
  if (st == MP_OK)
    dev->watch[dev->nwatch++] = (mp__watch_t){fn, ctx};
  pthread_mutex_unlock(&mp__watch_mu);
  return st;
}

void mp__device_unwatch(mp_device_t *dev, void (*fn)(void *, mp_stream_t),
                        void *ctx) {
  dev = mp__watch_root(dev);
  pthread_mutex_lock(&mp__watch_mu);
  /* In order, not swapped with the last: a forget visits the watchers in
   * the order they came, so a pool with arenas (made first) before its
   * arenas, and an arena made while a forget runs copies no mark of the
   * forgotten stream from its pool after the forget passed the arena. */
  for (size_t i = 0; i < dev->nwatch; i++) {
    if (dev->watch[i].fn == fn && dev->watch[i].ctx == ctx) {
      memmove(&dev->watch[i], &dev->watch[i + 1],
              (dev->nwatch - i - 1) * sizeof *dev->watch);
      dev->nwatch--;
      break;
    }
  }
  if (dev->nwatch == 0) { /* the last pool gone: nothing kept */
    free(dev->watch);
    dev->watch = NULL;
    dev->watch_cap = 0;
  }
  pthread_mutex_unlock(&mp__watch_mu);
}

mp_status_t mp_stream_forget(mp_device_t *dev, mp_stream_t s) {
  MP__CHECK_DEV(dev);
  if (s == NULL)
    return MP_OK;
  dev = mp__watch_root(dev);
  pthread_mutex_lock(&mp__watch_mu);
  atomic_fetch_add_explicit(&dev->forgets, 1, memory_order_seq_cst);
  for (size_t i = 0; i < dev->nwatch; i++)
    dev->watch[i].fn(dev->watch[i].ctx, s);
  atomic_fetch_add_explicit(&dev->forgets_done, 1, memory_order_seq_cst);
  pthread_mutex_unlock(&mp__watch_mu);
  return MP_OK;
}

void mp__device_watchers_tell(mp_device_t *dev, void (*fn)(void *, mp_stream_t),
                              mp_stream_t s) {
  dev = mp__watch_root(dev);
  pthread_mutex_lock(&mp__watch_mu);
  for (size_t i = 0; i < dev->nwatch; i++)
    if (dev->watch[i].fn == fn)
      fn(dev->watch[i].ctx, s);
  pthread_mutex_unlock(&mp__watch_mu);
}

uint64_t mp__device_forgets(mp_device_t *dev) {
  dev = mp__watch_root(dev);
  /* done first: a forget that ends between the loads reads as under way. */
  uint64_t done =
      atomic_load_explicit(&dev->forgets_done, memory_order_seq_cst);
  uint64_t begun = atomic_load_explicit(&dev->forgets, memory_order_seq_cst);
  return begun == done ? begun : UINT64_MAX;
}

mp_status_t mp__device_stream_ordinal(mp_device_t *dev, mp_stream_t s,
                                      int *out) {
  return dev->ops->stream_ordinal != NULL
             ? dev->ops->stream_ordinal(dev, s, out)
             : MP_ENOTSUP;
}

int mp__device_ordinal(mp_device_t *dev) {
  return dev->ops->ordinal != NULL ? dev->ops->ordinal(dev) : 0;
}

int mp__device_stream_capturing(mp_device_t *dev, mp_stream_t s) {
  return dev->ops->stream_capturing != NULL ? dev->ops->stream_capturing(dev, s)
                                            : 0;
}

int mp__device_capture_seen(mp_device_t *dev, mp_stream_t s,
                            mp_stream_t *which) {
  *which = s;
  if (s != NULL) {
    int c = mp__device_stream_capturing(dev, s);
    if (c != 0)
      return c;
  }
  if (dev->ops->capture_seen == NULL)
    return 0;
  *which = NULL;
  return dev->ops->capture_seen(dev, which);
}

int mp__device_stream_capture_id(mp_device_t *dev, mp_stream_t s,
                                 uint64_t *id) {
  *id = 0;
  return dev->ops->stream_capture_id != NULL
             ? dev->ops->stream_capture_id(dev, s, id)
             : mp__device_stream_capturing(dev, s);
}

mp_status_t mp__device_capture_on_release(mp_device_t *dev, mp_stream_t s,
                                          void (*fn)(void *), void *arg) {
  if (dev->ops->capture_on_release == NULL)
    return mp__fail(MP_ENOTSUP, "device '%s' cannot tell when a graph goes",
                    dev->ops->name);
  return dev->ops->capture_on_release(dev, s, fn, arg);
}

mp__stream_kind_t mp__device_stream_kind(mp_device_t *dev, mp_stream_t s) {
  return dev->ops->stream_kind != NULL
             ? (mp__stream_kind_t)dev->ops->stream_kind(dev, s)
             : MP__STREAM_SHARED;
}

bool mp__device_stream_owned(mp_device_t *dev, mp_stream_t s) {
  return dev->ops->stream_owned != NULL
             ? dev->ops->stream_owned(dev, s)
             : mp__device_stream_kind(dev, s) != MP__STREAM_BAD;
}

const char *mp_device_name(const mp_device_t *dev) {
  return dev ? dev->name : "";
}

mp_status_t mp_device_mem_info(mp_device_t *dev, size_t *free_bytes,
                               size_t *total_bytes) {
  MP__CHECK_DEV(dev);
  size_t f, t;
  mp_status_t st = dev->ops->mem_info(dev, &f, &t);
  if (st == MP_OK) {
    if (free_bytes)
      *free_bytes = f;
    if (total_bytes)
      *total_bytes = t;
  }
  return st;
}

mp_status_t mp_device_alloc(mp_device_t *dev, size_t bytes, void **out) {
  MP__CHECK_DEV(dev);
  MP__CHECK_OUT(out);
  if (bytes == 0)
    return mp__fail(MP_EINVAL, "mp_device_alloc: 0 bytes");
  return dev->ops->alloc(dev, bytes, out);
}

/* The public frees keep device.h's promise: the device synchronized
 * first. cuda.h promises no wait of the driver's (cuMemFree "may perform
 * implicit synchronization"; cuMemFreeHost says nothing), so without one a
 * copy still queued would run on freed memory. mempool's own callers free
 * only what no queued work uses, without the wait (mp__device_free). */
static mp_status_t mp__device_free_sync(mp_device_t *dev, const char *fn) {
  mp_status_t st = mp__device_caller_check(dev, fn);
  if (st != MP_OK || dev->ops->free_waits)
    return st;
  return dev->ops->synchronize(dev);
}

mp_status_t mp_device_free(mp_device_t *dev, void *ptr) {
  MP__CHECK_DEV(dev);
  MP__CHECK_OUT(ptr);
  mp_status_t st = mp__device_free_sync(dev, "mp_device_free");
  return st != MP_OK ? st : dev->ops->free(dev, ptr);
}

mp_status_t mp__device_free(mp_device_t *dev, void *ptr) {
  return dev->ops->free(dev, ptr);
}

mp_status_t mp_device_host_alloc(mp_device_t *dev, size_t bytes, void **out) {
  MP__CHECK_DEV(dev);
  MP__CHECK_OUT(out);
  if (bytes == 0)
    return mp__fail(MP_EINVAL, "mp_device_host_alloc: 0 bytes");
  return dev->ops->host_alloc(dev, bytes, out);
}

mp_status_t mp_device_host_free(mp_device_t *dev, void *ptr) {
  MP__CHECK_DEV(dev);
  MP__CHECK_OUT(ptr);
  mp_status_t st = mp__device_free_sync(dev, "mp_device_host_free");
  return st != MP_OK ? st : dev->ops->host_free(dev, ptr);
}

mp_status_t mp__device_host_free(mp_device_t *dev, void *ptr) {
  return dev->ops->host_free(dev, ptr);
}

mp_status_t mp_device_synchronize(mp_device_t *dev) {
  MP__CHECK_DEV(dev);
  return dev->ops->synchronize(dev);
}

mp_status_t mp_stream_create(mp_device_t *dev, mp_stream_t *out) {
  MP__CHECK_DEV(dev);
  MP__CHECK_OUT(out);
  return dev->ops->stream_create(dev, out);
}

mp_status_t mp_stream_destroy(mp_device_t *dev, mp_stream_t s) {
  MP__CHECK_DEV(dev);
  if (s == NULL)
    return mp__fail(MP_EINVAL, "mp_stream_destroy: the default stream "
                               "cannot be destroyed");
  /* Its own record first: a stream destroyed already must not reach the
   * driver (an H200 crashed given a destroyed handle, 2026-11-28). */
  if (!mp__device_stream_owned(dev, s))
    return mp__fail(MP_EINVAL,
                    "mp_stream_destroy: %p was not made by "
                    "mp_stream_create on this device, or is destroyed",
                    (void *)s);
  /* Nor one being captured, before any pool forgets it: the capture is the
   * program's, and its end (cuStreamEndCapture) is due first. */
  if (mp__device_stream_capturing(dev, s) > 0)
    return mp__fail(MP_EBUSY,
                    "mp_stream_destroy: stream %p is capturing a graph; end "
                    "the capture first",
                    (void *)s);
  /* Nor from where the device refuses the call (a host function), before
   * any pool forgets it: a refused call changes nothing. */
  mp_status_t st = mp__device_caller_check(dev, "mp_stream_destroy");
  if (st != MP_OK)
    return st;
  /* The pools forget s around the destroy, not before it (backend.h,
   * mp__stream_destroy_begin): a refused destroy gives s back to them. */
  mp__stream_destroy_begin(dev, s);
  st = dev->ops->stream_destroy(dev, s);
  mp__stream_destroy_end(dev, s, st == MP_OK);
  return st;
}

mp_status_t mp_stream_synchronize(mp_device_t *dev, mp_stream_t s) {
  MP__CHECK_DEV(dev);
  return dev->ops->stream_synchronize(dev, s);
}

mp_status_t mp_stream_query(mp_device_t *dev, mp_stream_t s) {
  MP__CHECK_DEV(dev);
  return dev->ops->stream_query(dev, s);
}

mp_status_t mp_stream_launch_host(mp_device_t *dev, mp_stream_t s,
                                  void (*fn)(void *), void *arg) {
  MP__CHECK_DEV(dev);
  MP__CHECK_OUT(fn);
  return dev->ops->launch_host(dev, s, fn, arg);
}

mp_status_t mp_memcpy_async(mp_device_t *dev, void *dst, const void *src,
                            size_t n, mp_stream_t s) {
  MP__CHECK_DEV(dev);
  if (n == 0)
    return MP_OK;
  MP__CHECK_OUT(dst);
  MP__CHECK_OUT(src);
  return dev->ops->memcpy_async(dev, dst, src, n, s);
}

mp_status_t mp_memset_async(mp_device_t *dev, void *dst, int value, size_t n,
                            mp_stream_t s) {
  MP__CHECK_DEV(dev);
  if (n == 0)
    return MP_OK;
  MP__CHECK_OUT(dst);
  return dev->ops->memset_async(dev, dst, value, n, s);
}

mp_status_t mp_event_create(mp_device_t *dev, mp_event_t *out) {
  MP__CHECK_DEV(dev);
  MP__CHECK_OUT(out);
  return dev->ops->event_create(dev, out);
}

mp_status_t mp_event_destroy(mp_device_t *dev, mp_event_t e) {
  MP__CHECK_DEV(dev);
  MP__CHECK_OUT(e);
  return dev->ops->event_destroy(dev, e);
}

mp_status_t mp_event_record(mp_device_t *dev, mp_event_t e, mp_stream_t s) {
  MP__CHECK_DEV(dev);
  MP__CHECK_OUT(e);
  return dev->ops->event_record(dev, e, s);
}

mp_status_t mp_event_query(mp_device_t *dev, mp_event_t e) {
  MP__CHECK_DEV(dev);
  MP__CHECK_OUT(e);
  return dev->ops->event_query(dev, e);
}

mp_status_t mp_event_synchronize(mp_device_t *dev, mp_event_t e) {
  MP__CHECK_DEV(dev);
  MP__CHECK_OUT(e);
  return dev->ops->event_synchronize(dev, e);
}

mp_status_t mp_stream_wait_event(mp_device_t *dev, mp_stream_t s,
                                 mp_event_t e) {
  MP__CHECK_DEV(dev);
  MP__CHECK_OUT(e);
  return dev->ops->stream_wait_event(dev, s, e);
}

/* ---- virtual memory: internal services for the pool ------------------- */

size_t mp__device_alloc_align(mp_device_t *dev) {
  return dev->ops->alloc_align ? dev->ops->alloc_align(dev)
                               : MP__DEVICE_ALLOC_ALIGN;
}

mp_status_t mp__device_vm_granularity(mp_device_t *dev, size_t *out) {
  return dev->ops->vm_granularity(dev, out);
}

mp_status_t mp__device_vm_reserve(mp_device_t *dev, size_t bytes, void **out) {
  return dev->ops->vm_reserve(dev, bytes, out);
}

mp_status_t mp__device_vm_release(mp_device_t *dev, void *base, size_t bytes) {
  return dev->ops->vm_release(dev, base, bytes);
}

mp_status_t mp__device_vm_map(mp_device_t *dev, void *addr, size_t bytes) {
  return dev->ops->vm_map(dev, addr, bytes);
}

mp_status_t mp__device_vm_unmap(mp_device_t *dev, void *addr, size_t bytes) {
  return dev->ops->vm_unmap(dev, addr, bytes);
}

mp_status_t mp__device_vm_access(mp_device_t *dev, void *addr, size_t bytes,
                                 mp_device_t *peer) {
  return dev->ops->vm_access != NULL
             ? dev->ops->vm_access(dev, addr, bytes, peer, true)
             : MP_OK;
}

mp_status_t mp__device_vm_revoke(mp_device_t *dev, void *addr, size_t bytes,
                                 mp_device_t *peer) {
  return dev->ops->vm_access != NULL
             ? dev->ops->vm_access(dev, addr, bytes, peer, false)
             : MP_OK;
}

mp_status_t mp__device_ipc_export(mp_device_t *dev, void *base, size_t bytes,
                                  bool vm, mp_ipc_handle_t *h) {
  if (dev->ops->ipc_export == NULL)
    return mp__fail(MP_ENOTSUP, "%s cannot share memory with another process",
                    dev->name);
  return dev->ops->ipc_export(dev, base, bytes, vm, h);
}
