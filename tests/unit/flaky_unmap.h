/* flaky_unmap.h - the fake device (pool_fakedev.h) with page-locked host
 * memory for a pause's kept content (the fake has none of its own) and its
 * vm_unmap call #fail_at (1-based; 0: none) failing: the pause tests' way
 * to fail a pause, or the undo of a resume, part-way. A second device of
 * its kind (flaky_peer_open, ordinal 1) is a peer for mp_pool_set_access,
 * and the fake records which mappings are open to it; its vm_access call
 * #access_fail_at fails. */
#ifndef MEMPOOL_TEST_FLAKY_UNMAP_H
#define MEMPOOL_TEST_FLAKY_UNMAP_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "pool/pool_internal.h"
#include "pool_fakedev.h"

static unsigned unmap_calls, unmap_fail_at;

/* The peer (ordinal 1; every other device of the kind is 0), and the
 * mappings opened to it, by address: an unmap closes one. */
static mp_device_t *flaky_peer;
static void *peer_open[64];
static size_t npeer_open;

static int flaky_ordinal(mp_device_t *dev) {
  return dev == flaky_peer;
}

/* Whether the mapping at addr is open to the peer. */
static bool open_to_peer(const void *addr) {
  for (size_t i = 0; i < npeer_open; i++)
    if (peer_open[i] == addr)
      return true;
  return false;
}

/* vm_access call #access_fail_at (1-based, grants only; 0: none) fails,
 * after access_hook (if any) ran: the peer-access tests' way to refuse a
 * peer part-way. */
static _Atomic unsigned access_calls, access_fail_at;
static void (*access_hook)(void);

static void peer_close(const void *addr) {
  for (size_t i = 0; i < npeer_open; i++)
    if (peer_open[i] == addr) {
      peer_open[i] = peer_open[--npeer_open];
      break;
    }
}

/* cuMemSetAccess: "The range must be a fully mapped address range"
 * (/usr/local/cuda/include/cuda.h): one whole mapping here, else refused.
 * !grant: PROT_NONE, the mapping closed to the peer again. */
static mp_status_t flaky_vm_access(mp_device_t *dev, void *addr, size_t bytes,
                                   mp_device_t *peer, bool grant) {
  if (grant && ++access_calls == access_fail_at) {
    if (access_hook != NULL)
      access_hook();
    return mp__fail(MP_EDRIVER, "fake vm_access #%u fails",
                    (unsigned)access_calls);
  }
  fake_dev_t *f = fake_of(dev);
  for (size_t i = 0; i < f->nmap; i++)
    if (f->map[i].addr == addr && f->map[i].size == bytes) {
      if (peer == flaky_peer && !grant)
        peer_close(addr);
      else if (peer == flaky_peer && !open_to_peer(addr) &&
               npeer_open < sizeof peer_open / sizeof *peer_open)
        peer_open[npeer_open++] = addr;
      return MP_OK;
    }
  return mp__fail(MP_EDRIVER, "fake vm_access: %p is not mapped", addr);
}

static mp_status_t flaky_vm_unmap(mp_device_t *dev, void *addr, size_t bytes) {
  if (++unmap_calls == unmap_fail_at)
    return mp__fail(MP_EDRIVER, "fake vm_unmap #%u fails", unmap_calls);
  mp_status_t st = fake_vm_unmap(dev, addr, bytes);
  if (st == MP_OK)
    peer_close(addr);
  return st;
}

/* Whether host_alloc fails (no page-locked memory left). */
static bool host_alloc_fails;

static mp_status_t flaky_host_alloc(mp_device_t *dev, size_t bytes,
                                    void **out) {
  (void)dev;
  if (host_alloc_fails)
    return mp__fail(MP_ENOMEM, "fake host_alloc of %zu bytes fails", bytes);
  *out = malloc(bytes);
  return *out != NULL ? MP_OK : MP_ENOMEM;
}

/* Called (if set) with the pointer at each host_free, before the free: a
 * resume frees an arena's kept content there, its lock dropped, once every
 * arena is mapped again, so the tests may call the pool there as another
 * thread would. */
static void (*host_free_hook)(void *ptr);

static mp_status_t flaky_host_free(mp_device_t *dev, void *ptr) {
  (void)dev;
  if (host_free_hook != NULL)
    host_free_hook(ptr);
  free(ptr);
  return MP_OK;
}

static mp__backend_t flaky_backend;

/* mp__pool_vm_map of bytes at a, as growth and resume call it: a device
 * call in flight, the lock dropped, and the strays counted after. With
 * the peer's access refused (access_fail_at) and then the unmap, it
 * leaves a stray. */
static inline mp_status_t flaky_map_directly(mp_pool_t *p, uintptr_t a,
                                             size_t bytes) {
  mp__pool_lock(p);
  mp__pool_device_begin(p);
  mp_status_t st = mp__pool_vm_map(p, (void *)a, bytes);
  mp__pool_device_end(p);
  mp__vrange_strays_count(p);
  mp__pool_unlock(p);
  return st;
}

/* A fake device of 1 GiB with a 2 MiB granule. */
static inline mp_device_t *flaky_open(unsigned fail_at) {
  flaky_backend = fake_backend;
  flaky_backend.vm_unmap = flaky_vm_unmap;
  flaky_backend.host_alloc = flaky_host_alloc;
  flaky_backend.host_free = flaky_host_free;
  flaky_backend.ordinal = flaky_ordinal;
  flaky_backend.vm_access = flaky_vm_access;
  mp_device_t *dev = fake_open((size_t)1 << 30, (size_t)2 << 20);
  dev->ops = &flaky_backend;
  unmap_calls = 0;
  unmap_fail_at = fail_at;
  npeer_open = 0;
  access_calls = 0;
  access_fail_at = 0;
  access_hook = NULL;
  host_free_hook = NULL;
  host_alloc_fails = false;
  return dev;
}

/* The peer, after flaky_open; fake_close closes it. */
static inline mp_device_t *flaky_peer_open(void) {
  flaky_peer = fake_open((size_t)1 << 30, (size_t)2 << 20);
  flaky_peer->ops = &flaky_backend;
  return flaky_peer;
}

#endif /* MEMPOOL_TEST_FLAKY_UNMAP_H */
