/* pinned.c - the "pinned" view of a device: a backend whose device memory is
 * the underlying device's page-locked host memory, so that the caching
 * best-fit pool (src/pool) serves pinned buffers with the same code that
 * serves device memory (stream-ordered reuse, record_stream, trim, cap,
 * stats, dump, check): the host pool (host_pool.c) is an mp_pool_t over
 * such a view.
 *
 * alloc/free go to the underlying device's host_alloc/host_free (one driver
 * call each: cuMemHostAlloc/cuMemFreeHost on CUDA); streams, events, copies
 * and synchronization are the underlying device's, forwarded unchanged, so
 * a stream of the device is a stream of the view. The view has no virtual
 * memory (page-locked memory cannot be mapped into a reserved range), so
 * the pool grows it in plain segments. Its capacity is the machine's
 * physical memory, the bound on what can be page-locked.
 *
 * Invariant: the view owns nothing but its mp_device_t; closing it leaves
 * the underlying device open, and the underlying device must outlive it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <unistd.h>

#include "backend.h"

static mp_device_t *pinned_under(mp_device_t *dev) {
  return (mp_device_t *)dev->impl;
}

static mp_status_t pinned_open(mp_device_t *dev, const char *opts) {
  (void)dev;
  (void)opts;
  return mp__fail(MP_EINVAL, "the pinned view is made by "
                             "mp__device_pinned_open, not by a device spec");
}

static mp_status_t pinned_close(mp_device_t *dev) {
  (void)dev;
  return MP_OK;
}

static mp_status_t pinned_mem_info(mp_device_t *dev, size_t *free_b,
                                   size_t *total_b) {
  (void)dev;
  long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES);
  long page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0)
    return mp__fail(MP_ENOTSUP, "pinned view: physical memory size unknown");
  *total_b = (size_t)pages * (size_t)page;
  *free_b = avail > 0 ? (size_t)avail * (size_t)page : 0;
  return MP_OK;
}

/* Page-locked memory is whole pages: the host device's is an mmap, and the
 * driver pins whole pages (its cuMemHostAlloc memory starts on one), so a
 * host pool may align blocks to the page (O_DIRECT and GPUDirect Storage
 * bounce buffers want 4 KiB); 512, the default for a device, refused
 * align=4096. pinned_alloc holds the underlying device to it. */
static size_t pinned_alloc_align(mp_device_t *dev) {
  (void)dev;
  long page = sysconf(_SC_PAGESIZE);
  return page > 0 ? (size_t)page : MP__DEVICE_ALLOC_ALIGN;
}

static mp_status_t pinned_alloc(mp_device_t *dev, size_t bytes, void **out) {
  mp_device_t *u = pinned_under(dev);
  void *p = NULL;
  mp_status_t st = u->ops->host_alloc(u, bytes, &p);
  if (st != MP_OK)
    return st;
  if ((uintptr_t)p % pinned_alloc_align(dev) != 0) {
    (void)u->ops->host_free(u, p);
    return mp__fail(MP_ENOTSUP,
                    "page-locked memory of device '%s' at %p does not start "
                    "on a page (%zu bytes): the host pool needs it to",
                    mp_device_name(u), p, pinned_alloc_align(dev));
  }
  *out = p;
  return MP_OK;
}

static mp_status_t pinned_free(mp_device_t *dev, void *ptr) {
  mp_device_t *u = pinned_under(dev);
  return u->ops->host_free(u, ptr);
}

/* Streams, events and copies are the underlying device's. */
#define PINNED_FORWARD(op, params, args)                                       \
  static mp_status_t pinned_##op params {                                      \
    mp_device_t *u = pinned_under(dev);                                        \
    return u->ops->op args;                                                    \
  }
PINNED_FORWARD(synchronize, (mp_device_t * dev), (u))
PINNED_FORWARD(stream_create, (mp_device_t * dev, mp_stream_t *out), (u, out))
PINNED_FORWARD(stream_destroy, (mp_device_t * dev, mp_stream_t s), (u, s))
PINNED_FORWARD(stream_synchronize, (mp_device_t * dev, mp_stream_t s), (u, s))
PINNED_FORWARD(stream_query, (mp_device_t * dev, mp_stream_t s), (u, s))
PINNED_FORWARD(launch_host,
               (mp_device_t * dev, mp_stream_t s, void (*fn)(void *),
                void *arg),
               (u, s, fn, arg))
PINNED_FORWARD(memcpy_async,
               (mp_device_t * dev, void *dst, const void *src, size_t n,
                mp_stream_t s),
               (u, dst, src, n, s))
PINNED_FORWARD(memset_async,
               (mp_device_t * dev, void *dst, int value, size_t n,
                mp_stream_t s),
               (u, dst, value, n, s))
PINNED_FORWARD(event_create, (mp_device_t * dev, mp_event_t *out), (u, out))
PINNED_FORWARD(event_destroy, (mp_device_t * dev, mp_event_t e), (u, e))
PINNED_FORWARD(event_record, (mp_device_t * dev, mp_event_t e, mp_stream_t s),
               (u, e, s))
PINNED_FORWARD(event_query, (mp_device_t * dev, mp_event_t e), (u, e))
PINNED_FORWARD(event_synchronize, (mp_device_t * dev, mp_event_t e), (u, e))
PINNED_FORWARD(stream_wait_event,
               (mp_device_t * dev, mp_stream_t s, mp_event_t e), (u, s, e))
#undef PINNED_FORWARD

/* A call the underlying device refuses where it is made (the host device:
 * from a host function, which "must not make any CUDA API calls", cuda.h,
 * cuLaunchHostFunc) is refused by the view too: the pool asks it before it
 * waits for a device call in flight (src/pool/lock.c, mp__pool_in_host_fn),
 * which the running host function may hold up, and before it grows or
 * synchronizes, so that the refusal names the pool's call. */
static mp_status_t pinned_caller_check(mp_device_t *dev, const char *fn) {
  mp_device_t *u = pinned_under(dev);
  return u->ops->caller_check != NULL ? u->ops->caller_check(u, fn) : MP_OK;
}

static int pinned_stream_kind(mp_device_t *dev, mp_stream_t s) {
  return (int)mp__device_stream_kind(pinned_under(dev), s);
}

static bool pinned_stream_owned(mp_device_t *dev, mp_stream_t s) {
  return mp__device_stream_owned(pinned_under(dev), s);
}

/* The view is of its device: cuda:N's is device N (a snapshot, peers),
 * and a stream's device is the device's answer. */
static int pinned_ordinal(mp_device_t *dev) {
  return mp__device_ordinal(pinned_under(dev));
}

static mp_status_t pinned_stream_ordinal(mp_device_t *dev, mp_stream_t s,
                                         int *out) {
  return mp__device_stream_ordinal(pinned_under(dev), s, out);
}

static int pinned_stream_capturing(mp_device_t *dev, mp_stream_t s) {
  return mp__device_stream_capturing(pinned_under(dev), s);
}

/* The underlying device's captures are the view's (its streams are). */
static int pinned_capture_seen(mp_device_t *dev, mp_stream_t *which) {
  return mp__device_capture_seen(pinned_under(dev), NULL, which);
}

static int pinned_stream_capture_id(mp_device_t *dev, mp_stream_t s,
                                    uint64_t *id) {
  return mp__device_stream_capture_id(pinned_under(dev), s, id);
}

static mp_status_t pinned_capture_on_release(mp_device_t *dev, mp_stream_t s,
                                             void (*fn)(void *), void *arg) {
  return mp__device_capture_on_release(pinned_under(dev), s, fn, arg);
}

static mp_status_t pinned_no_vm(void) {
  return mp__fail(MP_ENOTSUP, "pinned host memory has no virtual memory");
}

static mp_status_t pinned_vm_granularity(mp_device_t *dev, size_t *out) {
  (void)dev;
  (void)out;
  return pinned_no_vm();
}

static mp_status_t pinned_vm_reserve(mp_device_t *dev, size_t bytes,
                                     void **out) {
  (void)dev;
  (void)bytes;
  (void)out;
  return pinned_no_vm();
}

static mp_status_t pinned_vm_range(mp_device_t *dev, void *addr, size_t bytes) {
  (void)dev;
  (void)addr;
  (void)bytes;
  return pinned_no_vm();
}

const mp__backend_t mp__pinned_backend = {
    .name = "pinned",
    .open = pinned_open,
    .close = pinned_close,
    .mem_info = pinned_mem_info,
    .alloc_align = pinned_alloc_align,
    .alloc = pinned_alloc,
    .free = pinned_free,
    .host_alloc = pinned_alloc,
    .host_free = pinned_free,
    .synchronize = pinned_synchronize,
    .stream_create = pinned_stream_create,
    .stream_destroy = pinned_stream_destroy,
    .caller_check = pinned_caller_check,
    .stream_synchronize = pinned_stream_synchronize,
    .stream_query = pinned_stream_query,
    .stream_kind = pinned_stream_kind,
    .stream_owned = pinned_stream_owned,
    .stream_capturing = pinned_stream_capturing,
    .capture_seen = pinned_capture_seen,
    .stream_capture_id = pinned_stream_capture_id,
    .capture_on_release = pinned_capture_on_release,
    .stream_ordinal = pinned_stream_ordinal,
    .ordinal = pinned_ordinal,
    .launch_host = pinned_launch_host,
    .memcpy_async = pinned_memcpy_async,
    .memset_async = pinned_memset_async,
    .event_create = pinned_event_create,
    .event_destroy = pinned_event_destroy,
    .event_record = pinned_event_record,
    .event_query = pinned_event_query,
    .event_synchronize = pinned_event_synchronize,
    .stream_wait_event = pinned_stream_wait_event,
    .vm_granularity = pinned_vm_granularity,
    .vm_reserve = pinned_vm_reserve,
    .vm_release = pinned_vm_range,
    .vm_map = pinned_vm_range,
    .vm_unmap = pinned_vm_range,
};

mp_status_t mp__device_pinned_open(mp_device_t *under, mp_device_t **out) {
  mp_device_t *dev = mp__host_calloc(1, sizeof *dev);
  if (dev == NULL)
    return mp__fail(MP_ENOMEM, "out of host memory opening a pinned view");
  dev->ops = &mp__pinned_backend;
  dev->impl = under;
  snprintf(dev->name, sizeof dev->name, "pinned(%.100s)", under->name);
  *out = dev;
  return MP_OK;
}
