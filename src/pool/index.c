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

/* (size, address) order. */
static int mp__key_cmp(const mp__block_t *a, size_t size, uintptr_t addr) {
  if (a->size != size)
    return a->size < size ? -1 : 1;
  if (a->addr != addr)
    return a->addr < addr ? -1 : 1;
  return 0;
}

static uint32_t mp__prio(uintptr_t addr) {
  uint64_t x = (uint64_t)addr * 0x9E3779B97F4A7C15ull;
  return (uint32_t)(x >> 32);
}

void mp__index_insert(mp_pool_t *pool, mp__block_t *b) {
  unsigned fl, sl;
  mp__class_of(pool, b->size, &fl, &sl);
  b->left = b->right = NULL;
  b->prio = mp__prio(b->addr);
  b->flags |= MP__B_FREE;
  /* Descend to the leaf position, remembering the path, then rotate the
   * new node up while its priority beats its parent's. */
  /* The deepest 64 links of the path suffice: a new node rising more than
   * 64 levels has probability below 2^-64. */
  mp__block_t **path[64];
  unsigned depth = 0;
  mp__block_t **link = &pool->bins[fl][sl];
  while (*link != NULL) {
    path[depth++ % 64] = link;
    link = mp__key_cmp(*link, b->size, b->addr) > 0 ? &(*link)->left
                                                    : &(*link)->right;
  }
  *link = b;
  for (unsigned up = 0; up < 64 && depth > 0; up++) {
    mp__block_t **plink = path[--depth % 64];
    mp__block_t *p = *plink;
    if (p->prio >= b->prio)
      break;
    if (p->left == b) {
      p->left = b->right;
      b->right = p;
    } else {
      p->right = b->left;
      b->left = p;
    }
    *plink = b;
  }
  pool->sl_bitmap[fl] |= 1u << sl;
  pool->fl_bitmap |= 1ull << fl;
}

void mp__index_remove(mp_pool_t *pool, mp__block_t *b) {
  unsigned fl, sl;
  mp__class_of(pool, b->size, &fl, &sl);
  mp__block_t **link = &pool->bins[fl][sl];
  while (*link != NULL && *link != b)
    link = mp__key_cmp(*link, b->size, b->addr) > 0 ? &(*link)->left
                                                    : &(*link)->right;
  if (*link == NULL)
    return; /* not indexed: mp_pool_check reports such states */
  /* Rotate b down towards the child of higher priority until it is a leaf. */
  while (b->left != NULL || b->right != NULL) {
    if (b->left == NULL ||
        (b->right != NULL && b->right->prio > b->left->prio)) {
      mp__block_t *r = b->right;
      b->right = r->left;
      r->left = b;
      *link = r;
      link = &r->left;
    } else {
      mp__block_t *l = b->left;
      b->left = l->right;
      l->right = b;
      *link = l;
      link = &l->right;
    }
  }
  *link = NULL;
  b->flags &= ~(uint32_t)MP__B_FREE;
  if (pool->bins[fl][sl] == NULL) {
    pool->sl_bitmap[fl] &= ~(1u << sl);
    if (pool->sl_bitmap[fl] == 0)
      pool->fl_bitmap &= ~(1ull << fl);
  }
}

static mp__block_t *mp__treap_min(mp__block_t *t) {
  if (t != NULL)
    while (t->left != NULL)
      t = t->left;
  return t;
}

/* First node with key > (size, addr), or >= when inclusive. */
static mp__block_t *mp__treap_after(mp__block_t *t, size_t size, uintptr_t addr,
                                    bool inclusive) {
  mp__block_t *best = NULL;
  while (t != NULL) {
    int c = mp__key_cmp(t, size, addr);
    if (c > 0 || (inclusive && c == 0)) {
      best = t;
      t = t->left;
    } else {
      t = t->right;
    }
  }
  return best;
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
  return mp__treap_min(pool->bins[fl][sl]);
}

mp__block_t *mp__index_best_fit(const mp_pool_t *pool, size_t size) {
  unsigned fl, sl;
  mp__class_of(pool, size, &fl, &sl);
  if (pool->sl_bitmap[fl] & (1u << sl)) {
    mp__block_t *b = mp__treap_after(pool->bins[fl][sl], size, 0, true);
    if (b != NULL)
      return b;
  }
  return mp__class_above(pool, fl, sl);
}

mp__block_t *mp__index_next(const mp_pool_t *pool, const mp__block_t *b) {
  unsigned fl, sl;
  mp__class_of(pool, b->size, &fl, &sl);
  mp__block_t *n = mp__treap_after(pool->bins[fl][sl], b->size, b->addr, false);
  return n != NULL ? n : mp__class_above(pool, fl, sl);
}

mp__block_t *mp__index_largest(const mp_pool_t *pool) {
  if (pool->fl_bitmap == 0)
    return NULL;
  unsigned fl = mp__fls64(pool->fl_bitmap);
  unsigned sl = 31u - (unsigned)__builtin_clz(pool->sl_bitmap[fl]);
  mp__block_t *t = pool->bins[fl][sl];
  while (t != NULL && t->right != NULL)
    t = t->right;
  return t;
}

bool mp__index_contains(const mp_pool_t *pool, const mp__block_t *b) {
  unsigned fl, sl;
  mp__class_of(pool, b->size, &fl, &sl);
  const mp__block_t *t = pool->bins[fl][sl];
  while (t != NULL && t != b)
    t = mp__key_cmp(t, b->size, b->addr) > 0 ? t->left : t->right;
  return t == b;
}

/* In-order walk with an explicit bound on depth: a corrupted treap (a cycle)
 * must not hang mp_pool_check. */
static bool mp__treap_walk(const mp_pool_t *pool, const mp__block_t *t,
                           unsigned fl, unsigned sl, const mp__block_t **prev,
                           size_t *count, size_t *bytes, size_t limit) {
  if (t == NULL)
    return true;
  if (*count > limit)
    return false;
  if ((t->left && t->left->prio > t->prio) ||
      (t->right && t->right->prio > t->prio))
    return false;
  if (!mp__treap_walk(pool, t->left, fl, sl, prev, count, bytes, limit))
    return false;
  unsigned f, s;
  mp__class_of(pool, t->size, &f, &s);
  if (f != fl || s != sl || !(t->flags & MP__B_FREE))
    return false;
  if (*prev != NULL && mp__key_cmp(*prev, t->size, t->addr) >= 0)
    return false;
  *prev = t;
  (*count)++;
  *bytes += t->size;
  return mp__treap_walk(pool, t->right, fl, sl, prev, count, bytes, limit);
}

bool mp__index_check_class(const mp_pool_t *pool, unsigned fl, unsigned sl,
                           size_t *count, size_t *bytes) {
  const mp__block_t *prev = NULL;
  size_t n = 0, by = 0;
  size_t limit = (size_t)pool->st.free_blocks + 1;
  if (!mp__treap_walk(pool, pool->bins[fl][sl], fl, sl, &prev, &n, &by, limit))
    return false;
  *count = n;
  *bytes = by;
  return true;
}
