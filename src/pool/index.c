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

void mp__class_of(const mp_pool_t *pool, size_t size, unsigned *fl,
                  unsigned *sl) {
  uint64_t u = (uint64_t)(size >> pool->align_log2);
  if (u < MP__SL_COUNT) {
    *fl = 0;
    *sl = (unsigned)u;
    return;
  }
  unsigned f = mp__fls64(u);
  *fl = f - MP__SL_LOG2 + 1;
  *sl = (unsigned)(u >> (f - MP__SL_LOG2)) - MP__SL_COUNT;
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

static uint32_t mp__node_new(mp_pool_t *pool) {
  if (pool->inode_free != 0) {
    uint32_t i = pool->inode_free;
    pool->inode_free = pool->inodes[i].left;
    return i;
  }
  if (!mp__index_reserve(pool, 1))
    return 0;
  /* Slots 1..inodes_used were handed out once; take the next. */
  return ++pool->inodes_used;
}

static void mp__node_free(mp_pool_t *pool, uint32_t i) {
  pool->inodes[i].left = pool->inode_free;
  pool->inodes[i].blk = NULL;
  pool->inode_free = i;
}

void mp__index_insert(mp_pool_t *pool, mp__block_t *b) {
  uint32_t ni = mp__node_new(pool);
  if (ni == 0)
    return; /* no host memory: b stays out of the index (check says so) */
  mp__inode_t *nodes = pool->inodes;
  mp__inode_t *nn = &nodes[ni];
  nn->size = b->size;
  nn->addr = b->addr;
  nn->blk = b;
  nn->left = nn->right = 0;
  nn->prio = mp__prio(b->addr);
  b->inode = ni;
  b->flags |= MP__B_FREE;
  unsigned fl, sl;
  mp__class_of(pool, b->size, &fl, &sl);
  nn->cls = fl * MP__SL_COUNT + sl;
  /* Descend to the leaf position, remembering the deepest 64 links of the
   * path (a new node rising more than 64 levels has probability below
   * 2^-64), then rotate it up while its priority beats its parent's. */
  uint32_t *path[64];
  unsigned depth = 0;
  uint32_t *link = &pool->bins[fl][sl];
  while (*link != 0) {
    path[depth++ % 64] = link;
    mp__inode_t *n = &nodes[*link];
    link = mp__key_cmp(n, nn->size, nn->addr) > 0 ? &n->left : &n->right;
  }
  *link = ni;
  for (unsigned up = 0; up < 64 && depth > 0; up++) {
    uint32_t *plink = path[--depth % 64];
    mp__inode_t *p = &nodes[*plink];
    if (p->prio >= nn->prio)
      break;
    uint32_t pi = *plink;
    if (p->left == ni) {
      p->left = nn->right;
      nn->right = pi;
    } else {
      p->right = nn->left;
      nn->left = pi;
    }
    *plink = ni;
  }
  pool->sl_bitmap[fl] |= 1u << sl;
  pool->fl_bitmap |= 1ull << fl;
}

void mp__index_remove(mp_pool_t *pool, mp__block_t *b) {
  uint32_t ni = b->inode;
  if (ni == 0 || ni >= pool->inodes_cap || pool->inodes[ni].blk != b)
    return; /* not indexed: mp_pool_check reports such states */
  mp__inode_t *nodes = pool->inodes;
  mp__inode_t *nn = &nodes[ni];
  unsigned fl = nn->cls / MP__SL_COUNT, sl = nn->cls % MP__SL_COUNT;
  uint32_t *link = &pool->bins[fl][sl];
  while (*link != 0 && *link != ni)
    link = mp__key_cmp(&nodes[*link], nn->size, nn->addr) > 0
               ? &nodes[*link].left
               : &nodes[*link].right;
  if (*link == 0)
    return;
  /* Rotate the node down towards the child of higher priority until it is
   * a leaf, then cut it off. */
  while (nn->left != 0 || nn->right != 0) {
    if (nn->left == 0 ||
        (nn->right != 0 && nodes[nn->right].prio > nodes[nn->left].prio)) {
      uint32_t ri = nn->right;
      nn->right = nodes[ri].left;
      nodes[ri].left = ni;
      *link = ri;
      link = &nodes[ri].left;
    } else {
      uint32_t li = nn->left;
      nn->left = nodes[li].right;
      nodes[li].right = ni;
      *link = li;
      link = &nodes[li].right;
    }
  }
  *link = 0;
  mp__node_free(pool, ni);
  b->inode = 0;
  b->flags &= ~(uint32_t)MP__B_FREE;
  if (pool->bins[fl][sl] == 0) {
    pool->sl_bitmap[fl] &= ~(1u << sl);
    if (pool->sl_bitmap[fl] == 0)
      pool->fl_bitmap &= ~(1ull << fl);
  }
}

static mp__block_t *mp__treap_min(const mp_pool_t *pool, uint32_t t) {
  if (t == 0)
    return NULL;
  while (pool->inodes[t].left != 0)
    t = pool->inodes[t].left;
  return pool->inodes[t].blk;
}

/* First node with key > (size, addr), or >= when inclusive. */
static mp__block_t *mp__treap_after(const mp_pool_t *pool, uint32_t t,
                                    size_t size, uintptr_t addr,
                                    bool inclusive) {
  uint32_t best = 0;
  while (t != 0) {
    const mp__inode_t *n = &pool->inodes[t];
    int c = mp__key_cmp(n, size, addr);
    if (c > 0 || (inclusive && c == 0)) {
      best = t;
      t = n->left;
    } else {
      t = n->right;
    }
  }
  return best ? pool->inodes[best].blk : NULL;
}

/* Minimum of the first non-empty class strictly above (fl, sl). */
static mp__block_t *mp__class_above(const mp_pool_t *pool, unsigned fl,
                                    unsigned sl) {
  uint32_t sm =
      sl + 1 < MP__SL_COUNT ? pool->sl_bitmap[fl] & (~0u << (sl + 1)) : 0;
  if (sm == 0) {
    uint64_t fm =
        fl + 1 < MP__FL_COUNT ? pool->fl_bitmap & (~0ull << (fl + 1)) : 0;
    if (fm == 0)
      return NULL;
    fl = (unsigned)__builtin_ctzll(fm);
    sm = pool->sl_bitmap[fl];
  }
  sl = (unsigned)__builtin_ctz(sm);
  return mp__treap_min(pool, pool->bins[fl][sl]);
}

MP__HOT mp__block_t *mp__index_best_fit_hot(const mp_pool_t *pool,
                                            size_t size) {
  unsigned fl, sl;
  mp__class_of(pool, size, &fl, &sl);
  if (pool->sl_bitmap[fl] & (1u << sl)) {
    mp__block_t *b = mp__treap_after(pool, pool->bins[fl][sl], size, 0, true);
    if (b != NULL)
      return b;
  }
  return mp__class_above(pool, fl, sl);
}

/* The out-of-line copy, for every caller off the free+alloc path. */
mp__block_t *mp__index_best_fit(const mp_pool_t *pool, size_t size) {
  return mp__index_best_fit_hot(pool, size);
}

mp__block_t *mp__index_next(const mp_pool_t *pool, const mp__block_t *b) {
  unsigned fl, sl;
  mp__class_of(pool, b->size, &fl, &sl);
  mp__block_t *n =
      mp__treap_after(pool, pool->bins[fl][sl], b->size, b->addr, false);
  return n != NULL ? n : mp__class_above(pool, fl, sl);
}

mp__block_t *mp__index_largest(const mp_pool_t *pool) {
  if (pool->fl_bitmap == 0)
    return NULL;
  unsigned fl = mp__fls64(pool->fl_bitmap);
  unsigned sl = 31u - (unsigned)__builtin_clz(pool->sl_bitmap[fl]);
  uint32_t t = pool->bins[fl][sl];
  while (t != 0 && pool->inodes[t].right != 0)
    t = pool->inodes[t].right;
  return t ? pool->inodes[t].blk : NULL;
}

bool mp__index_contains(const mp_pool_t *pool, const mp__block_t *b) {
  if (b->inode == 0 || b->inode >= pool->inodes_cap)
    return false;
  unsigned fl, sl;
  mp__class_of(pool, b->size, &fl, &sl);
  uint32_t t = pool->bins[fl][sl];
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
  if (!mp__treap_walk(pool, pool->bins[fl][sl], fl, sl, &prev, &n, &by, limit))
    return false;
  *count = n;
  *bytes = by;
  return true;
}
