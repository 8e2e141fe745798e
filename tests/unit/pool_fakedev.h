/* pool_fakedev.h - a synchronous in-process device for the pool's white-box
 * tests: memory from the C heap (or an mmap'd virtual range), streams that
 * run everything at once, events that are always complete. It counts calls
 * and checks that every vm_unmap matches one vm_map exactly, so tests can
 * assert the pool's use of the device without the host backend's threads. */
#ifndef MEMPOOL_TEST_POOL_FAKEDEV_H
#define MEMPOOL_TEST_POOL_FAKEDEV_H

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "device/backend.h"

typedef struct fake_dev {
  size_t capacity, used, peak; /* peak: the most used at once */
  size_t granule;              /* 0: no virtual memory */
  unsigned fail_after, allocs;
  unsigned maps, unmaps, frees, bad_unmaps, syncs;
  unsigned refuse_frees; /* this many next frees fail (MP_EDRIVER) */
  size_t max_reserve;    /* 0, or the largest vm_reserve that succeeds (an
                            address space that runs short) */
  unsigned reserves;     /* vm_reserve calls */
  /* Called once, at the next vm_unmap (then cleared): the pool's lock is
   * dropped there, so it may call the pool as another thread would. */
  void (*on_unmap)(void *ctx);
  void *on_unmap_ctx;
  /* The same at the next free of a plain allocation, before it is freed. */
  void (*on_free)(void *ctx);
  void *on_free_ctx;
  /* Event queries answer "not yet" (MP_EBUSY) while set: work the pool
   * sees as queued, until a wait (events synchronize at once). */
  bool events_busy;
  struct {
    void *addr;
    size_t size;
  } map[4096];
  size_t nmap;
  struct {
    void *p;
    size_t size;
  } plain[4096];
  size_t nplain;
} fake_dev_t;

static fake_dev_t *fake_of(mp_device_t *dev) {
  return (fake_dev_t *)dev->impl;
}

static mp_status_t fake_take(fake_dev_t *f, size_t bytes) {
  f->allocs++;
  if (f->fail_after && f->allocs >= f->fail_after)
    return MP_ENOMEM;
  if (f->used + bytes > f->capacity)
    return MP_ENOMEM;
  f->used += bytes;
  if (f->used > f->peak)
    f->peak = f->used;
  return MP_OK;
}

/* fake_alloc's posix_memalign alignment. */
static size_t fake_alloc_align(mp_device_t *dev) {
  (void)dev;
  return 4096;
}

static mp_status_t fake_alloc(mp_device_t *dev, size_t bytes, void **out) {
  fake_dev_t *f = fake_of(dev);
  mp_status_t st = fake_take(f, bytes);
  if (st != MP_OK)
    return st;
  void *p = NULL;
  if (posix_memalign(&p, 4096, bytes) != 0)
    return MP_ENOMEM;
  f->plain[f->nplain].p = p;
  f->plain[f->nplain++].size = bytes;
  *out = p;
  return MP_OK;
}

/* Calls and clears *fn (with ctx) if set. */
static void fake_hook(void (**fn)(void *), void *ctx) {
  void (*call)(void *) = *fn;
  *fn = NULL;
  if (call != NULL)
    call(ctx);
}

static mp_status_t fake_free(mp_device_t *dev, void *ptr) {
  fake_dev_t *f = fake_of(dev);
  fake_hook(&f->on_free, f->on_free_ctx);
  if (f->refuse_frees > 0) {
    f->refuse_frees--;
    return MP_EDRIVER;
  }
  for (size_t i = 0; i < f->nplain; i++)
    if (f->plain[i].p == ptr) {
      f->used -= f->plain[i].size;
      f->plain[i] = f->plain[--f->nplain];
      f->frees++;
      free(ptr);
      return MP_OK;
    }
  return MP_EINVAL;
}

static mp_status_t fake_ok(mp_device_t *dev) {
  fake_of(dev)->syncs++;
  return MP_OK;
}
static mp_status_t fake_mem_info(mp_device_t *dev, size_t *f, size_t *t) {
  *f = fake_of(dev)->capacity - fake_of(dev)->used;
  *t = fake_of(dev)->capacity;
  return MP_OK;
}
static mp_status_t fake_stream_create(mp_device_t *dev, mp_stream_t *out) {
  static char streams[64];
  static int n;
  (void)dev;
  *out = (mp_stream_t)&streams[++n % 64];
  return MP_OK;
}
static mp_status_t fake_stream_x(mp_device_t *dev, mp_stream_t s) {
  (void)dev;
  (void)s;
  return MP_OK;
}
static mp_status_t fake_launch(mp_device_t *dev, mp_stream_t s,
                               void (*fn)(void *), void *arg) {
  (void)dev;
  (void)s;
  fn(arg);
  return MP_OK;
}
static mp_status_t fake_memcpy(mp_device_t *dev, void *d, const void *src,
                               size_t n, mp_stream_t s) {
  (void)dev;
  (void)s;
  memmove(d, src, n);
  return MP_OK;
}
static mp_status_t fake_memset(mp_device_t *dev, void *d, int v, size_t n,
                               mp_stream_t s) {
  (void)dev;
  (void)s;
  memset(d, v, n);
  return MP_OK;
}
static mp_status_t fake_event_create(mp_device_t *dev, mp_event_t *out) {
  (void)dev;
  *out = (mp_event_t)malloc(1);
  return *out ? MP_OK : MP_ENOMEM;
}
static mp_status_t fake_event_destroy(mp_device_t *dev, mp_event_t e) {
  (void)dev;
  free(e);
  return MP_OK;
}
static mp_status_t fake_event_record(mp_device_t *dev, mp_event_t e,
                                     mp_stream_t s) {
  (void)dev;
  (void)e;
  (void)s;
  return MP_OK;
}
static mp_status_t fake_event_x(mp_device_t *dev, mp_event_t e) {
  (void)dev;
  (void)e;
  return MP_OK;
}
static mp_status_t fake_event_query(mp_device_t *dev, mp_event_t e) {
  (void)e;
  return fake_of(dev)->events_busy ? MP_EBUSY : MP_OK;
}
static mp_status_t fake_wait(mp_device_t *dev, mp_stream_t s, mp_event_t e) {
  (void)dev;
  (void)s;
  (void)e;
  return MP_OK;
}
static mp_status_t fake_vm_gran(mp_device_t *dev, size_t *out) {
  if (fake_of(dev)->granule == 0)
    return MP_ENOTSUP;
  *out = fake_of(dev)->granule;
  return MP_OK;
}
static mp_status_t fake_vm_reserve(mp_device_t *dev, size_t bytes, void **out) {
  fake_dev_t *f = fake_of(dev);
  f->reserves++;
  if (f->max_reserve != 0 && bytes > f->max_reserve)
    return MP_ENOMEM;
  void *p = mmap(NULL, bytes, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    return MP_ENOMEM;
  *out = p;
  return MP_OK;
}
static mp_status_t fake_vm_release(mp_device_t *dev, void *base, size_t bytes) {
  (void)dev;
  munmap(base, bytes);
  return MP_OK;
}
static mp_status_t fake_vm_map(mp_device_t *dev, void *addr, size_t bytes) {
  fake_dev_t *f = fake_of(dev);
  mp_status_t st = fake_take(f, bytes);
  if (st != MP_OK)
    return st;
  if (mprotect(addr, bytes, PROT_READ | PROT_WRITE) != 0)
    return MP_EDRIVER;
  f->map[f->nmap].addr = addr;
  f->map[f->nmap++].size = bytes;
  f->maps++;
  return MP_OK;
}
static mp_status_t fake_vm_unmap(mp_device_t *dev, void *addr, size_t bytes) {
  fake_dev_t *f = fake_of(dev);
  fake_hook(&f->on_unmap, f->on_unmap_ctx);
  for (size_t i = 0; i < f->nmap; i++)
    if (f->map[i].addr == addr && f->map[i].size == bytes) {
      f->map[i] = f->map[--f->nmap];
      f->used -= bytes;
      f->unmaps++;
      madvise(addr, bytes, MADV_DONTNEED);
      mprotect(addr, bytes, PROT_NONE);
      return MP_OK;
    }
  f->bad_unmaps++;
  return MP_EINVAL;
}

static const mp__backend_t fake_backend = {
    .name = "fake",
    .mem_info = fake_mem_info,
    .alloc = fake_alloc,
    .free = fake_free,
    .synchronize = fake_ok,
    .stream_create = fake_stream_create,
    .stream_destroy = fake_stream_x,
    .stream_synchronize = fake_stream_x,
    .stream_query = fake_stream_x,
    .launch_host = fake_launch,
    .memcpy_async = fake_memcpy,
    .memset_async = fake_memset,
    .event_create = fake_event_create,
    .event_destroy = fake_event_destroy,
    .event_record = fake_event_record,
    .event_query = fake_event_query,
    .event_synchronize = fake_event_x,
    .stream_wait_event = fake_wait,
    .alloc_align = fake_alloc_align,
    .vm_granularity = fake_vm_gran,
    .vm_reserve = fake_vm_reserve,
    .vm_release = fake_vm_release,
    .vm_map = fake_vm_map,
    .vm_unmap = fake_vm_unmap,
};

/* granule 0: plain allocations only. */
static mp_device_t *fake_open(size_t capacity, size_t granule) {
  mp_device_t *dev = calloc(1, sizeof *dev);
  fake_dev_t *f = calloc(1, sizeof *f);
  f->capacity = capacity;
  f->granule = granule;
  dev->ops = &fake_backend;
  dev->impl = f;
  strcpy(dev->name, "fake");
  return dev;
}

static void fake_close(mp_device_t *dev) {
  fake_dev_t *f = fake_of(dev);
  for (size_t i = 0; i < f->nplain; i++)
    free(f->plain[i].p);
  free(f);
  free(dev);
}

#ifdef MEMPOOL_TEST_POOL_HELPERS_H
/* Checks the pool, destroys it and expects everything back: nothing left
 * in use on the device, every unmap one whole map. */
static inline void fake_pool_finish(mp_pool_t *p, mp_device_t *dev) {
  check(p);
  mp_pool_destroy(p);
  cr_expect_eq(fake_of(dev)->used, 0);
  cr_expect_eq(fake_of(dev)->bad_unmaps, 0);
  fake_close(dev);
}
#endif

#endif
