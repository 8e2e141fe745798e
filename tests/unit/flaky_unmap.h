/* flaky_unmap.h - the fake device (pool_fakedev.h) with page-locked host
 * memory for a pause's kept content (the fake has none of its own) and its
 * vm_unmap call #fail_at (1-based; 0: none) failing: the pause tests' way
 * to fail a pause, or the undo of a resume, part-way. */
#ifndef MEMPOOL_TEST_FLAKY_UNMAP_H
#define MEMPOOL_TEST_FLAKY_UNMAP_H

#include <stdlib.h>

#include "pool_fakedev.h"

static unsigned unmap_calls, unmap_fail_at;

static mp_status_t flaky_vm_unmap(mp_device_t *dev, void *addr, size_t bytes) {
  if (++unmap_calls == unmap_fail_at)
    return mp__fail(MP_EDRIVER, "fake vm_unmap #%u fails", unmap_calls);
  return fake_vm_unmap(dev, addr, bytes);
}

static mp_status_t flaky_host_alloc(mp_device_t *dev, size_t bytes,
                                    void **out) {
  (void)dev;
  *out = malloc(bytes);
  return *out != NULL ? MP_OK : MP_ENOMEM;
}

static mp_status_t flaky_host_free(mp_device_t *dev, void *ptr) {
  (void)dev;
  free(ptr);
  return MP_OK;
}

static mp__backend_t flaky_backend;

/* A fake device of 1 GiB with a 2 MiB granule. */
static inline mp_device_t *flaky_open(unsigned fail_at) {
  flaky_backend = fake_backend;
  flaky_backend.vm_unmap = flaky_vm_unmap;
  flaky_backend.host_alloc = flaky_host_alloc;
  flaky_backend.host_free = flaky_host_free;
  mp_device_t *dev = fake_open((size_t)1 << 30, (size_t)2 << 20);
  dev->ops = &flaky_backend;
  unmap_calls = 0;
  unmap_fail_at = fail_at;
  return dev;
}

#endif /* MEMPOOL_TEST_FLAKY_UNMAP_H */
