/* host_pow2.c - the "host-pow2" baseline: a caching allocator for
 * page-locked host memory built the way PyTorch's CachingHostAllocator is
 * (c10/core/CachingHostAllocator.h, as of PyTorch 2.3-2.5): every request
 * is rounded up to the next power of two (c10::llvm::PowerOf2Ceil), each
 * rounded size has its own free list, a miss is one page-locked allocation
 * of exactly the rounded size, blocks are never split or merged, and
 * nothing goes back to the driver until the cache is emptied (here: when
 * the allocator closes). Stream events are left out: mpbench frees are
 * stream-ordered already. Reserved = the sum of the rounded sizes
 * allocated; device_calls = page-locked allocations the driver made (a
 * refused one is not counted). */
#include <stdlib.h>
#include <string.h>

/* internal.h for: mp__fail, mp__ptrmap_* (the power-of-two pool's block table).
 */
#include "device/backend.h"
#include "internal.h"
#include "mpbench.h"

enum { MPB_POW2_CLASSES = 64 };

typedef struct mpb_pow2_entry {
  uintptr_t key;
  unsigned cls; /* log2 of the rounded size */
  bool live;
} mpb_pow2_entry_t;

struct mpb_pow2 {
  mp_device_t *dev;
  mp__ptrmap_t blocks; /* every block ever allocated -> its class */
  void **free_list[MPB_POW2_CLASSES];
  size_t nfree[MPB_POW2_CLASSES], cap[MPB_POW2_CLASSES];
  size_t nblocks[MPB_POW2_CLASSES]; /* cap[c] > nblocks[c] */
  size_t reserved;
  uint64_t device_calls;
};

static unsigned mpb_pow2_class(size_t size) {
  unsigned c = 0;
  while (((size_t)1 << c) < size)
    c++;
  return c;
}

mp_status_t mpb_pow2_open(mp_device_t *dev, mpb_pow2_t **out) {
  mpb_pow2_t *p = calloc(1, sizeof *p);
  if (p == NULL)
    return mp__fail(MP_ENOMEM, "host-pow2: out of host memory");
  p->dev = dev;
  mp__ptrmap_init(&p->blocks, sizeof(mpb_pow2_entry_t));
  *out = p;
  return MP_OK;
}

mp_status_t mpb_pow2_alloc(mpb_pow2_t *p, size_t size, void **out) {
  /* PyTorch's allocate(0) is {nullptr, nullptr}: no block, no driver call
   * (a 1-byte class block here, before, counted and reserved). */
  if (size == 0) {
    *out = NULL;
    return MP_OK;
  }
  if (size > ((size_t)1 << (MPB_POW2_CLASSES - 2)))
    return mp__fail(MP_ENOMEM, "host-pow2: %zu bytes is too big", size);
  unsigned c = mpb_pow2_class(size);
  void *ptr;
  if (p->nfree[c] > 0) {
    ptr = p->free_list[c][--p->nfree[c]];
  } else {
    /* Room in the free list for this block's return, before the driver:
     * a free never allocates. */
    /* And room in the block table: a block the driver made is always
     * tracked (put cannot fail now), so there is no free to undo it, which
     * the driver could refuse, leaving a page-locked block nobody frees. */
    if (!mpb_grow(&p->free_list[c], &p->cap[c], p->nblocks[c],
                  sizeof(void *)) ||
        !mp__ptrmap_reserve(&p->blocks, 1))
      return mp__fail(MP_ENOMEM, "host-pow2: out of host memory");
    /* Counted once the driver made it, as the pool's device_alloc_count
     * (mempool/stats.h: calls into the driver): a refused page-locked
     * allocation made nothing, and the row compared with host-pool's. */
    mp_status_t st = mp_device_host_alloc(p->dev, (size_t)1 << c, &ptr);
    if (st != MP_OK)
      return st;
    p->device_calls++;
    mpb_pow2_entry_t *e = mp__ptrmap_put(&p->blocks, (uintptr_t)ptr);
    e->cls = c;
    p->nblocks[c]++;
    p->reserved += (size_t)1 << c;
  }
  mpb_pow2_entry_t *e = mp__ptrmap_find(&p->blocks, (uintptr_t)ptr);
  e->live = true;
  *out = ptr;
  return MP_OK;
}

mp_status_t mpb_pow2_free(mpb_pow2_t *p, void *ptr) {
  if (ptr == NULL)
    return MP_OK;
  mpb_pow2_entry_t *e = mp__ptrmap_find(&p->blocks, (uintptr_t)ptr);
  if (e == NULL || !e->live)
    return mp__fail(MP_EINVAL, "host-pow2: %p is not a live block", ptr);
  e->live = false;
  /* The slot was reserved when the block was made (one per block). */
  p->free_list[e->cls][p->nfree[e->cls]++] = ptr;
  return MP_OK;
}

void mpb_pow2_sample(mpb_pow2_t *p, size_t *reserved, uint64_t *calls) {
  *reserved = p->reserved;
  *calls = p->device_calls;
}

void mpb_pow2_close(mpb_pow2_t *p) {
  if (p == NULL)
    return;
  for (size_t i = 0; i < p->blocks.cap; i++) {
    mpb_pow2_entry_t *e = mp__ptrmap_at(&p->blocks, i);
    if (e != NULL)
      mp__device_host_free(p->dev, (void *)e->key);
  }
  mp__ptrmap_destroy(&p->blocks);
  for (unsigned c = 0; c < MPB_POW2_CLASSES; c++)
    free(p->free_list[c]);
  free(p);
}
