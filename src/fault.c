/* fault.c - host-memory allocation for mempool's bookkeeping, with fault
 * injection for tests.
 *
 * Every allocation of mempool's own metadata (block records, the live map,
 * virtual-range tables, stream tables, ...) goes through mp__host_alloc,
 * mp__host_calloc or mp__host_realloc, so a test can make the n-th one fail
 * and check that the failure branch reports MP_ENOMEM and changes nothing,
 * as the device's fail_after does for device memory. Freeing is plain
 * free(). The countdown is one process-wide atomic: Criterion runs each
 * test in a process of its own. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "internal.h"

/* Successful allocations left before the next one fails; negative: off. */
static _Atomic long mp__host_fault_left = -1;

void mp__fault_host_after(long n) {
  atomic_store_explicit(&mp__host_fault_left, n < 0 ? -1 : n,
                        memory_order_relaxed);
}

bool mp__fault_host_pending(void) {
  return atomic_load_explicit(&mp__host_fault_left, memory_order_relaxed) >= 0;
}

/* mp__fault_host_every: every allocation fails. */
static _Atomic bool mp__host_fault_every;

void mp__fault_host_every(bool on) {
  atomic_store_explicit(&mp__host_fault_every, on, memory_order_relaxed);
}

/* true when this allocation is the one chosen to fail (which disarms the
 * countdown), or every one fails. Two relaxed loads when off. */
static bool mp__fault_now(void) {
  if (MP__UNLIKELY(
          atomic_load_explicit(&mp__host_fault_every, memory_order_relaxed)))
    return true;
  long left = atomic_load_explicit(&mp__host_fault_left, memory_order_relaxed);
  while (MP__UNLIKELY(left >= 0)) {
    long next = left == 0 ? -1 : left - 1;
    if (atomic_compare_exchange_weak_explicit(&mp__host_fault_left, &left, next,
                                              memory_order_relaxed,
                                              memory_order_relaxed))
      return left == 0;
  }
  return false;
}

void *mp__host_alloc(size_t n) {
  return mp__fault_now() ? NULL : malloc(n);
}

void *mp__host_calloc(size_t count, size_t size) {
  return mp__fault_now() ? NULL : calloc(count, size);
}

void *mp__host_realloc(void *p, size_t n) {
  return mp__fault_now() ? NULL : realloc(p, n);
}

void *mp__host_room(void *v, size_t *cap, size_t n, size_t elem) {
  if (n < *cap)
    return v;
  size_t c = *cap ? *cap * 2 : 16;
  if (c > SIZE_MAX / elem)
    return NULL;
  void *g = mp__host_realloc(v, c * elem);
  if (g != NULL)
    *cap = c;
  return g;
}
