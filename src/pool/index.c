/* index.c - the free index: size classes, a two-level bitmap, and per-class
 * treaps ordered by (size, address).
 *
 * Algorithm: TLSF's mapping (power-of-two first level, 32 equal
 * subdivisions each) names the class of a size. A first-level word and one
 * second-level word per first level say which classes hold free blocks, so
 * the next non-empty class above a size is two find-first-set operations.
 * Within a class the blocks sit in a treap keyed by (size, address), whose
 * priorities hash the address: best fit is a lower-bound search in the
 * request's own class (expected O(log m), m = blocks in that class), or the
 * minimum of the next non-empty class. Nothing scans the pool.
 *
 * Invariant: a class's bitmap bit is set exactly when its treap is non-empty,
 * and every block in a class's treap is free and maps to that class. */
#include <stdlib.h>
#include <string.h>

#include "pool_internal.h"

static unsigned mp__fls64(uint64_t x) {
  return 63u - (unsigned)__builtin_clzll(x);
}

/* The class of a size, fl * MP__SL_COUNT + sl, with one count of leading
 * zeros and no branch: below 2 * MP__SL_COUNT units a class per unit
 * (fl 0 and 1), above it the top MP__SL_LOG2 + 1 bits of the size. */
static inline unsigned mp__cls(const mp_pool_t *pool, size_t size) {
  uint64_t u = (uint64_t)(size >> pool->align_log2);
  unsigned s = mp__fls64(u | MP__SL_COUNT) - MP__SL_LOG2;
  return (s << MP__SL_LOG2) + (unsigned)(u >> s);
}

void mp__class_of(const mp_pool_t *pool, size_t size, unsigned *fl,
                  unsigned *sl) {
  unsigned c = mp__cls(pool, size);
  *fl = c / MP__SL_COUNT;
  *sl = c % MP__SL_COUNT;
}

static uint32_t mp__prio(uintptr_t addr) {
  uint64_t x = (uint64_t)addr * 0x9E3779B97F4A7C15ull;
  return (uint32_t)(x >> 32);
}

/* (size, address) order of node n against a key. */
static int mp__key_cmp(const mp__inode_t *n, size_t size, uintptr_t addr) {
  if (n->size != size)
    return n->size < size ? -1 : 1;
  if (n->addr != addr)
    return n->addr < addr ? -1 : 1;
  return 0;
}

bool mp__index_reserve(mp_pool_t *pool, size_t n) {
  size_t want = (size_t)pool->inodes_used + n + 1;
  if (want <= pool->inodes_cap)
    return true;
  if (want > UINT32_MAX)
    return false;
  size_t cap = pool->inodes_cap ? pool->inodes_cap : 256;
  while (cap < want)
    cap *= 2;
  if (cap > UINT32_MAX)
    cap = UINT32_MAX;
  mp__inode_t *v = mp__host_realloc(pool->inodes, cap * sizeof *v);
  if (v == NULL)
    return false;
  if (pool->inodes == NULL)
    memset(&v[0], 0, sizeof v[0]); /* the null node */
  pool->inodes = v;
  pool->inodes_cap = (uint32_t)cap;
  return true;
}

void mp__index_release(mp_pool_t *pool) {
  free(pool->inodes);
  pool->inodes = NULL;
  pool->inodes_cap = pool->inode_free = pool->inodes_used = 0;
}

/* A fresh node on the free-node list, for an insert that found it empty:
 * false without host memory. */
static MP__COLD bool mp__node_refill(mp_pool_t *pool) {
  if (!mp__index_reserve(pool, 1))
    return false;
  /* Slots 1..inodes_used were handed out once; the next one. */
  uint32_t i = ++pool->inodes_used;
  pool->inodes[i].left = 0;
  pool->inode_free = i;
  return true;
}

MP__HOT void mp__index_insert_hot(mp_pool_t *pool, mp__block_t *b) {
  if (MP__UNLIKELY(pool->inode_free == 0) && !mp__node_refill(pool))
    return; /* no host memory: b stays out of the index (check says so) */
  mp__inode_t *nodes = pool->inodes;
  uint32_t ni = pool->inode_free;
  mp__inode_t *nn = &nodes[ni];
  pool->inode_free = nn->left;
  size_t size = b->size;
  uintptr_t addr = b->addr;
  uint32_t prio = mp__prio(addr);
  unsigned c = mp__cls(pool, size);
  nn->size = size;
  nn->addr = addr;
  nn->blk = b;
  nn->prio = prio;
  nn->cls = c;
  b->inode = ni;
  b->flags |= MP__B_FREE;
  /* Top down, no stack: descend past the nodes that outrank the new one,
   * put it in the place of the first that does not, and split that
   * subtree by the key into its two children. */
  uint32_t *link = &pool->bins[c];
  uint32_t t;
  if (*link == 0) {
    /* The class was empty (common: most hold a block or two). */
    *link = ni;
    nn->left = nn->right = 0;
    pool->sl_bitmap[c / MP__SL_COUNT] |= 1u << (c % MP__SL_COUNT);
    pool->fl_bitmap |= 1ull << (c / MP__SL_COUNT);
    return;
  }
  while ((t = *link) != 0 && nodes[t].prio >= prio)
    link = mp__key_cmp(&nodes[t], size, addr) > 0 ? &nodes[t].left
                                                  : &nodes[t].right;
  *link = ni;
  uint32_t *l = &nn->left, *r = &nn->right;
  while (t != 0) {
    mp__inode_t *n = &nodes[t];
    if (mp__key_cmp(n, size, addr) < 0) {
      *l = t;
      l = &n->right;
      t = n->right;
    } else {
      *r = t;
      r = &n->left;
      t = n->left;
    }
  }
  *l = *r = 0;
}

MP__HOT void mp__index_remove_hot(mp_pool_t *pool, mp__block_t *b) {
  uint32_t ni = b->inode;
  mp__inode_t *nodes = pool->inodes;
  if (ni == 0 || ni >= pool->inodes_cap || nodes[ni].blk != b)
    return; /* not indexed: mp_pool_check reports such states */
  mp__inode_t *nn = &nodes[ni];
  unsigned c = nn->cls;
  uint32_t *link = &pool->bins[c];
  uint32_t t;
  while ((t = *link) != ni) {
    if (t == 0)
      return;
    link = mp__key_cmp(&nodes[t], nn->size, nn->addr) > 0 ? &nodes[t].left
                                                          : &nodes[t].right;
  }
  /* Its two subtrees merge into its place, the root of higher priority
   * first at each step. */
  uint32_t l = nn->left, r = nn->right;
  while (l != 0 && r != 0) {
    if (nodes[r].prio > nodes[l].prio) {
      *link = r;
      link = &nodes[r].left;
      r = *link;
    } else {
      *link = l;
      link = &nodes[l].right;
      l = *link;
    }
  }
  *link = l | r;
  nn->left = pool->inode_free;
  nn->blk = NULL;
  pool->inode_free = ni;
  b->inode = 0;
  b->flags &= ~(uint32_t)MP__B_FREE;
  if (pool->bins[c] == 0) {
    unsigned fl = c / MP__SL_COUNT;
    if ((pool->sl_bitmap[fl] &= ~(1u << (c % MP__SL_COUNT))) == 0)
      pool->fl_bitmap &= ~(1ull << fl);
  }
}

/* The out-of-line copies, for every caller off the free+alloc path. */
void mp__index_insert(mp_pool_t *pool, mp__block_t *b) {
  mp__index_insert_hot(pool, b);
}

void mp__index_remove(mp_pool_t *pool, mp__block_t *b) {
  mp__index_remove_hot(pool, b);
}

static mp__block_t *mp__treap_min(const mp_pool_t *pool, uint32_t t) {
  if (t == 0)
    return NULL;
  while (pool->inodes[t].left != 0)
    t = pool->inodes[t].left;
  return pool->inodes[t].blk;
}

/* First node with key > (size, addr). */
static mp__block_t *mp__treap_after(const mp_pool_t *pool, uint32_t t,
                                    size_t size, uintptr_t addr) {
  uint32_t best = 0;
  while (t != 0) {
    const mp__inode_t *n = &pool->inodes[t];
    if (mp__key_cmp(n, size, addr) > 0) {
      best = t;
      t = n->left;
    } else {
      t = n->right;
    }
  }
  return best ? pool->inodes[best].blk : NULL;
}

/* Minimum of the first non-empty class strictly above class c. */
static mp__block_t *mp__class_above(const mp_pool_t *pool, unsigned c) {
  unsigned fl = c / MP__SL_COUNT;
  uint32_t sm = pool->sl_bitmap[fl] & (~1u << (c % MP__SL_COUNT));
  if (sm == 0) {
    uint64_t fm = pool->fl_bitmap & (~1ull << fl);
    if (fm == 0)
      return NULL;
    fl = (unsigned)__builtin_ctzll(fm);
    sm = pool->sl_bitmap[fl];
  }
  return mp__treap_min(
      pool, pool->bins[fl * MP__SL_COUNT + (unsigned)__builtin_ctz(sm)]);
}

MP__HOT mp__block_t *mp__index_best_fit_hot(const mp_pool_t *pool,
                                            size_t size) {
  unsigned c = mp__cls(pool, size);
  /* The first node of size >= size in the request's own class (the key
   * (size, 0) is below every block of that size). */
  uint32_t best = 0;
  for (uint32_t t = pool->bins[c]; t != 0;) {
    const mp__inode_t *n = &pool->inodes[t];
    if (n->size >= size) {
      best = t;
      t = n->left;
    } else {
      t = n->right;
    }
  }
  return best != 0 ? pool->inodes[best].blk : mp__class_above(pool, c);
}

/* The out-of-line copy, for every caller off the free+alloc path. */
mp__block_t *mp__index_best_fit(const mp_pool_t *pool, size_t size) {
  return mp__index_best_fit_hot(pool, size);
}

mp__block_t *mp__index_next(const mp_pool_t *pool, const mp__block_t *b) {
  unsigned c = mp__cls(pool, b->size);
  mp__block_t *n = mp__treap_after(pool, pool->bins[c], b->size, b->addr);
  return n != NULL ? n : mp__class_above(pool, c);
}

mp__block_t *mp__index_largest(const mp_pool_t *pool) {
  if (pool->fl_bitmap == 0)
    return NULL;
  unsigned fl = mp__fls64(pool->fl_bitmap);
  unsigned sl = 31u - (unsigned)__builtin_clz(pool->sl_bitmap[fl]);
  uint32_t t = pool->bins[fl * MP__SL_COUNT + sl];
  while (t != 0 && pool->inodes[t].right != 0)
    t = pool->inodes[t].right;
  return t ? pool->inodes[t].blk : NULL;
}

bool mp__index_contains(const mp_pool_t *pool, const mp__block_t *b) {
  if (b->inode == 0 || b->inode >= pool->inodes_cap)
    return false;
  uint32_t t = pool->bins[mp__cls(pool, b->size)];
  while (t != 0 && t != b->inode)
    t = mp__key_cmp(&pool->inodes[t], b->size, b->addr) > 0
            ? pool->inodes[t].left
            : pool->inodes[t].right;
  return t != 0 && pool->inodes[t].blk == b &&
         pool->inodes[t].size == b->size && pool->inodes[t].addr == b->addr;
}

/* In-order walk with a bound on the count: a corrupted treap (a cycle)
 * must not hang mp_pool_check. */
static bool mp__treap_walk(const mp_pool_t *pool, uint32_t t, unsigned fl,
                           unsigned sl, const mp__inode_t **prev, size_t *count,
                           size_t *bytes, size_t limit) {
  if (t == 0)
    return true;
  if (*count > limit || t >= pool->inodes_cap)
    return false;
  const mp__inode_t *n = &pool->inodes[t];
  if ((n->left && pool->inodes[n->left].prio > n->prio) ||
      (n->right && pool->inodes[n->right].prio > n->prio))
    return false;
  if (!mp__treap_walk(pool, n->left, fl, sl, prev, count, bytes, limit))
    return false;
  unsigned f, s;
  mp__class_of(pool, n->size, &f, &s);
  const mp__block_t *b = n->blk;
  if (f != fl || s != sl || n->cls != fl * MP__SL_COUNT + sl || b == NULL ||
      !(b->flags & MP__B_FREE) || b->inode != t || b->size != n->size ||
      b->addr != n->addr)
    return false;
  if (*prev != NULL && mp__key_cmp(*prev, n->size, n->addr) >= 0)
    return false;
  *prev = n;
  (*count)++;
  *bytes += n->size;
  return mp__treap_walk(pool, n->right, fl, sl, prev, count, bytes, limit);
}

bool mp__index_check_class(const mp_pool_t *pool, unsigned fl, unsigned sl,
                           size_t *count, size_t *bytes) {
  const mp__inode_t *prev = NULL;
  size_t n = 0, by = 0;
  size_t limit = (size_t)pool->st.free_blocks + 1;
  if (!mp__treap_walk(pool, pool->bins[fl * MP__SL_COUNT + sl], fl, sl, &prev,
                      &n, &by, limit))
    return false;
  *count = n;
  *bytes = by;
  return true;
}
