/* index.c - the free index: size classes, a two-level bitmap, and per-class
 * treaps ordered by (size, address).
 *
 * Algorithm: TLSF's mapping (power-of-two first level, 32 equal
 * subdivisions each) names the class of a size. A first-level word and one
 * second-level word per first level say which classes hold free blocks, so
 * the next non-empty class above a size is two find-first-set operations.
 * Within a class the blocks sit in a treap keyed by (size, address), whose
 * priorities hash the address (a class's first block takes the top one
 * while it stays, mp__index_link_hot): best fit is a lower-bound search in
 * the request's own class (expected O(log m), m = blocks in that class), or
 * the minimum of the next non-empty class. Nothing scans the pool.
 *
 * Invariant: a class's bitmap bit is set exactly when its treap is non-empty,
 * and every block in a class's treap is free and maps to that class. */

#include "pool_internal.h"

/* The index of the highest set bit of x (x != 0). GCC's x86-64 bsr
 * builtin: its result joins 64-bit arithmetic with no sign extension
 * (63 ^ clz is bsr too, but an int that GCC 12 widens with cltq, about
 * 2.7 a pair). Elsewhere 63 ^ clz, not 63 - clz: bsr alone where the
 * result is adjusted after (63 - clz gave bsr, xor and sub). */
#if defined(__has_builtin)
#if __has_builtin(__builtin_ia32_bsrdi)
#define MP__FLS64_BSR 1
#endif
#endif
static size_t mp__fls64(uint64_t x) {
#ifdef MP__FLS64_BSR
  return (size_t)__builtin_ia32_bsrdi((long long)x);
#else
  return (size_t)63 ^ (size_t)__builtin_clzll(x);
#endif
}

/* The class of a size, fl * MP__SL_COUNT + sl, with one count of leading
 * zeros and no branch: below 2 * MP__SL_COUNT units of 512 bytes a class
 * per unit (fl 0 and 1), above it the top MP__SL_LOG2 + 1 bits of the size.
 * The unit is fixed, not the pool's alignment: best fit is exact whatever
 * the classes (a lower-bound search in the request's class, else the next
 * class's minimum), and a constant shift costs two instructions less. A
 * size_t, as the classes' bins[] index is: no zero-extension each use. */
static inline size_t mp__cls(const mp_pool_t *pool, size_t size) {
  (void)pool;
  /* With u = size in units and s = fls(u | MP__SL_COUNT) - MP__SL_LOG2,
   * the class is (s << MP__SL_LOG2) + (u >> s). Taken on the size itself:
   * top = fls(size | MP__SL_COUNT units) is s + MP__CLS_UNIT_LOG2 +
   * MP__SL_LOG2, and u >> s is size >> (top - MP__SL_LOG2) (the unit's
   * bits shift out with it), so that no shift to units comes first and the
   * constant joins the last add (two instructions fewer). */
  size_t top =
      mp__fls64((uint64_t)size | ((uint64_t)MP__SL_COUNT << MP__CLS_UNIT_LOG2));
  return (top << MP__SL_LOG2) -
         ((size_t)(MP__CLS_UNIT_LOG2 + MP__SL_LOG2) << MP__SL_LOG2) +
         (size >> (top - MP__SL_LOG2));
}

void mp__class_of(const mp_pool_t *pool, size_t size, unsigned *fl,
                  unsigned *sl) {
  size_t c = mp__cls(pool, size);
  *fl = (unsigned)(c / MP__SL_COUNT);
  *sl = (unsigned)(c % MP__SL_COUNT);
}

static uint32_t mp__prio(uintptr_t addr) {
  uint64_t x = (uint64_t)addr * 0x9E3779B97F4A7C15ull;
  return (uint32_t)(x >> 32);
}

/* (size, address) order of free block n against a key. */
static int mp__key_cmp(const mp__block_t *n, size_t size, uintptr_t addr) {
  if (n->size != size)
    return n->size < size ? -1 : 1;
  if (n->addr != addr)
    return n->addr < addr ? -1 : 1;
  return 0;
}

/* Sets class c's bits in the bitmaps (its treap gained its first block).
 * On x86-64 with GCC or clang, bts on memory: its bit-string form takes the
 * class itself as the bit offset into sl_bitmap[] (word c / 32, bit
 * c % 32), so that no shifted 1 is built and no word index computed for it
 * (GCC 12: mov $1, shl and or to memory for each level, and the word's
 * index, nine instructions a fill, at 1.35 fills a pair with 100 live
 * blocks, 0.32 with 10 000). Elsewhere the same in C. The clear stays in C
 * (mp__index_remove_from): its and to memory sets the zero flag that the
 * first level's test needs; btr there measured 366.2 / 341.2 instructions
 * a pair against 363.9 / 339.3. */
_Static_assert(MP__SL_COUNT == 32 && sizeof(uint32_t) * 8 == MP__SL_COUNT,
               "a second-level word is the 32 bits btsl addresses");
static inline void mp__class_mark(mp_pool_t *pool, size_t c) {
#if defined(__GNUC__) && defined(__x86_64__)
  __asm__("btsl %k1, %0" : "+m"(pool->sl_bitmap) : "r"(c) : "cc");
  __asm__("btsq %1, %0" : "+m"(pool->fl_bitmap) : "r"(c / MP__SL_COUNT) : "cc");
#else
  pool->sl_bitmap[c / MP__SL_COUNT] |= 1u << (c % MP__SL_COUNT);
  pool->fl_bitmap |= 1ull << (c / MP__SL_COUNT);
#endif
}

/* Whether free block n's key is above (size, addr): with a 128-bit type,
 * one compare of the two words (cmp, sbb) and one branch, not a branch on
 * the sizes and another on the addresses (on the removal's descent: 357.7
 * / 329.8 -> 357.5 / 329.2 instructions per pair at 100 / 10 000 live; no
 * change on the insert's two descents, which keep mp__key_cmp). */
static inline bool mp__key_above(const mp__block_t *n, size_t size,
                                 uintptr_t addr) {
#if defined(__SIZEOF_INT128__)
  return ((unsigned __int128)n->size << 64 | n->addr) >
         ((unsigned __int128)size << 64 | addr);
#else
  return mp__key_cmp(n, size, addr) > 0;
#endif
}

/* Each free block is its own treap node: the links, the class and the
 * priority live in its record, the key is its (size, addr), so an insert
 * or remove allocates, copies and validates nothing. The priority is
 * stored (prio, in sidx's place: a free block has no stream), so that a
 * descent reads it instead of hashing each node's address again (a load
 * for a load, a multiply and a shift). The first block of an empty class
 * (1.35 an allocation and free with 100 live blocks) takes UINT32_MAX and
 * no hash: it stays the root while it stays in the class, every later
 * block goes below it, and the treap under it is the hashed one, so a
 * descent is at most one step longer. Stored: 359.9 / 337.0 -> 357.7 /
 * 329.8 instructions per pair at 100 / 10 000 live; hashed for the first
 * block too, 366.7 / 331.0. */
MP__HOT void mp__index_link_hot(mp_pool_t *pool, mp__block_t *b, size_t size,
                                uintptr_t addr) {
  MP__ASSERT((b->flags & MP__B_FREE) && b->size == size && b->addr == addr);
  size_t c = mp__cls(pool, size);
  b->cls = (uint32_t)c;
  /* Top down, no stack: descend past the nodes that outrank the new one,
   * put it in the place of the first that does not, and split that
   * subtree by the key into its two children. */
  mp__block_t **link = &pool->bins[c];
  mp__block_t *t = *link;
  if (t == NULL) {
    /* The class was empty (common: most hold a block or two). */
    *link = b;
    b->prio = UINT32_MAX;
    b->left = b->right = NULL;
    mp__class_mark(pool, c);
    return;
  }
  uint32_t prio = mp__prio(addr);
  b->prio = prio;
  while (t != NULL && t->prio >= prio) {
    link = mp__key_cmp(t, size, addr) > 0 ? &t->left : &t->right;
    t = *link;
  }
  *link = b;
  mp__block_t **l = &b->left, **r = &b->right;
  while (t != NULL) {
    if (mp__key_cmp(t, size, addr) < 0) {
      *l = t;
      l = &t->right;
      t = t->right;
    } else {
      *r = t;
      r = &t->left;
      t = t->left;
    }
  }
  *l = *r = NULL;
}

MP__HOT void mp__index_insert_hot(mp_pool_t *pool, mp__block_t *b) {
  b->flags |= MP__B_FREE;
  mp__index_link_hot(pool, b, b->size, b->addr);
}

_Static_assert(((MP__FL_COUNT * MP__SL_COUNT) &
                (MP__FL_COUNT * MP__SL_COUNT - 1)) == 0,
               "mp__index_remove masks a class into bins[]");

/* Puts the merge of treaps l and r (every key of l below every key of r)
 * at *link, the root of higher priority first at each step. */
__attribute__((noinline)) static void
mp__treap_merge(mp__block_t **link, mp__block_t *l, mp__block_t *r) {
  while (l != NULL && r != NULL) {
    if (r->prio > l->prio) {
      *link = r;
      link = &r->left;
      r = *link;
    } else {
      *link = l;
      link = &l->right;
      l = *link;
    }
  }
  *link = l != NULL ? l : r;
}

/* b out of class c's treap at link, the link that points at it (root: the
 * class's root link); unmark: MP__B_FREE cleared (else left for the
 * caller, whose next store of the flags replaces it). */
static MP__HOT void mp__index_cut(mp_pool_t *pool, mp__block_t *b, size_t c,
                                  mp__block_t **link, bool root, bool unmark) {
  /* Its subtrees take its place: one (or none) as it is, two merged (out
   * of line, rare where classes hold a block or two: its loop's registers
   * would weigh on every inline copy's frame; the class stays non-empty,
   * so nothing is live across the call). */
  mp__block_t *l = b->left, *r = b->right;
  if (unmark)
    b->flags &= ~(uint32_t)MP__B_FREE;
  if (MP__UNLIKELY(l != NULL && r != NULL)) {
    mp__treap_merge(link, l, r);
    return;
  }
  /* At most one of them is set: their bits or'ed are that one (or NULL),
   * with no second test of l. */
  mp__block_t *rest = (mp__block_t *)((uintptr_t)l | (uintptr_t)r);
  *link = rest;
  /* Only the root's removal can empty the class: no reload of the root. */
  if (root && rest == NULL) {
    size_t fl = c / MP__SL_COUNT;
    if ((pool->sl_bitmap[fl] &= ~(1u << (c % MP__SL_COUNT))) == 0)
      pool->fl_bitmap &= ~(1ull << fl);
  }
}

/* b out of class c's treap, when it is there (a descent from the root
 * finds its link). */
static MP__HOT void mp__index_remove_from(mp_pool_t *pool, mp__block_t *b,
                                          size_t c, bool unmark) {
  mp__block_t **link = &pool->bins[c];
  mp__block_t *t = *link;
  bool root = t == b;
  while (t != b) {
    if (t == NULL)
      return; /* not indexed: mp_pool_check reports such states */
    link = mp__key_above(t, b->size, b->addr) ? &t->left : &t->right;
    t = *link;
  }
  mp__index_cut(pool, b, c, link, root, unmark);
}

/* The take's and the coalesce's: b is a free block (MP__B_FREE), in the
 * index, so its cls is its class (insert sets both). MP__B_FREE stays: the
 * take's block has its flags replaced (made live, held by the ladder) or
 * goes back (untake), the coalesce's is inserted again or its record
 * freed. */
MP__HOT void mp__index_remove_hot(mp_pool_t *pool, mp__block_t *b) {
  MP__ASSERT((b->flags & MP__B_FREE) && b->cls < MP__FL_COUNT * MP__SL_COUNT);
  mp__index_remove_from(pool, b, b->cls, false);
}

MP__HOT void mp__index_remove_at(mp_pool_t *pool, mp__block_t *b,
                                 mp__block_t *const *at) {
  MP__ASSERT((b->flags & MP__B_FREE) && *at == b);
  size_t c = b->cls;
  /* at was read through the search's const pool; the links are the
   * pool's own, writable. */
  mp__index_cut(pool, b, c, (mp__block_t **)at, at == &pool->bins[c], false);
}

/* The out-of-line copies, for every caller off the free+alloc path. */
void mp__index_insert(mp_pool_t *pool, mp__block_t *b) {
  mp__index_insert_hot(pool, b);
}

void mp__index_remove(mp_pool_t *pool, mp__block_t *b) {
  /* The mask keeps a record that was never indexed (cls unset) inside
   * bins[]; the descent then does not find it. */
  mp__index_remove_from(pool, b, b->cls & (MP__FL_COUNT * MP__SL_COUNT - 1),
                        true);
}

/* The minimum of the treap at link, and in *at the link that points at
 * it. */
static mp__block_t *mp__treap_min(mp__block_t *const *link,
                                  mp__block_t *const **at) {
  mp__block_t *t = *link;
  if (t == NULL)
    return NULL;
  while (t->left != NULL) {
    link = &t->left;
    t = *link;
  }
  *at = link;
  return t;
}

/* First node with key > (size, addr). */
static mp__block_t *mp__treap_after(mp__block_t *t, size_t size,
                                    uintptr_t addr) {
  mp__block_t *best = NULL;
  while (t != NULL) {
    if (mp__key_cmp(t, size, addr) > 0) {
      best = t;
      t = t->left;
    } else {
      t = t->right;
    }
  }
  return best;
}

/* The index of the lowest set bit of x (x != 0), as a size_t. GCC's
 * __builtin_ctz / __builtin_ctzll return an int, which GCC 12 widens with
 * movslq / cltq before the class's arithmetic even where the bit scan
 * wrote all 64 bits; on x86-64 the scan itself (bsf's 32-bit form clears
 * the upper half) gives the size_t directly. */
static inline size_t mp__ctz64(uint64_t x) {
#if defined(__GNUC__) && defined(__x86_64__)
  size_t r;
  __asm__("bsfq %1, %0" : "=r"(r) : "r"(x) : "cc");
  return r;
#else
  return (size_t)__builtin_ctzll(x);
#endif
}
static inline size_t mp__ctz32(uint32_t x) {
#if defined(__GNUC__) && defined(__x86_64__)
  size_t r;
  __asm__("bsfl %1, %k0" : "=r"(r) : "r"(x) : "cc");
  return r;
#else
  return (size_t)__builtin_ctz(x);
#endif
}

/* Minimum of the first non-empty class strictly above class c. */
static MP__HOT mp__block_t *mp__class_above(const mp_pool_t *pool, size_t c,
                                            mp__block_t *const **at) {
  size_t fl = c / MP__SL_COUNT;
  uint32_t sm = pool->sl_bitmap[fl] & (~1u << (c % MP__SL_COUNT));
  if (sm == 0) {
    uint64_t fm = pool->fl_bitmap & (~1ull << fl);
    if (fm == 0)
      return NULL;
    fl = mp__ctz64(fm);
    sm = pool->sl_bitmap[fl];
  }
  return mp__treap_min(&pool->bins[fl * MP__SL_COUNT + mp__ctz32(sm)], at);
}

MP__HOT mp__block_t *mp__index_best_fit_hot(const mp_pool_t *pool, size_t size,
                                            mp__block_t *const **at) {
  size_t c = mp__cls(pool, size);
  /* The first node of size >= size in the request's own class (the key
   * (size, 0) is below every block of that size), and the link to it. */
  mp__block_t *best = NULL;
  mp__block_t *const *link = &pool->bins[c], *const *best_at = link;
  for (mp__block_t *t = *link; t != NULL; t = *link) {
    if (t->size >= size) {
      best = t;
      best_at = link;
      link = &t->left;
    } else {
      link = &t->right;
    }
  }
  if (best == NULL)
    return mp__class_above(pool, c, at);
  *at = best_at;
  return best;
}

/* The out-of-line copy, for every caller off the free+alloc path. */
mp__block_t *mp__index_best_fit(const mp_pool_t *pool, size_t size) {
  mp__block_t *const *at;
  return mp__index_best_fit_hot(pool, size, &at);
}

mp__block_t *mp__index_next(const mp_pool_t *pool, const mp__block_t *b) {
  size_t c = mp__cls(pool, b->size);
  mp__block_t *n = mp__treap_after(pool->bins[c], b->size, b->addr);
  mp__block_t *const *at;
  return n != NULL ? n : mp__class_above(pool, c, &at);
}

mp__block_t *mp__index_largest(const mp_pool_t *pool) {
  if (pool->fl_bitmap == 0)
    return NULL;
  unsigned fl = (unsigned)mp__fls64(pool->fl_bitmap);
  unsigned sl = 31u - (unsigned)__builtin_clz(pool->sl_bitmap[fl]);
  mp__block_t *t = pool->bins[fl * MP__SL_COUNT + sl];
  while (t != NULL && t->right != NULL)
    t = t->right;
  return t;
}

/* Whether n's key lies strictly between those of lo and hi (NULL: no
 * bound): where a search tree puts a node reached below lo's right link
 * and hi's left one. mp_pool_check asks it of every node it reaches, so
 * that a corrupted link back to a node already passed (a cycle: a node's
 * link to itself) is reported, not followed for ever. */
static bool mp__key_between(const mp__block_t *n, const mp__block_t *lo,
                            const mp__block_t *hi) {
  return (lo == NULL || mp__key_cmp(n, lo->size, lo->addr) > 0) &&
         (hi == NULL || mp__key_cmp(n, hi->size, hi->addr) < 0);
}

/* mp_pool_check follows links that may be corrupted: each must name a
 * record of this pool (owned says so) before it is read, and lie where the
 * descent so far puts it (mp__key_between). */
bool mp__index_contains(const mp_pool_t *pool, const mp__block_t *b,
                        mp__rec_owned_fn owned) {
  const mp__block_t *t = pool->bins[mp__cls(pool, b->size)];
  const mp__block_t *lo = NULL, *hi = NULL;
  while (t != NULL && t != b) {
    if (!owned(pool, t) || !mp__key_between(t, lo, hi))
      return false;
    if (mp__key_cmp(t, b->size, b->addr) > 0) {
      hi = t;
      t = t->left;
    } else {
      lo = t;
      t = t->right;
    }
  }
  return t != NULL;
}

/* A child link is sound: none, or a record of the pool whose priority does
 * not exceed its parent's. */
static bool mp__link_ok(const mp_pool_t *pool, mp__rec_owned_fn owned,
                        const mp__block_t *c, uint32_t parent_prio) {
  return c == NULL || (owned(pool, c) && c->prio <= parent_prio);
}

/* In-order walk with a bound on the count: a corrupted treap (a cycle)
 * must not hang mp_pool_check, and a link that names no record of the pool
 * is reported, not followed. lo, hi: the keys n must lie between
 * (mp__key_between), checked before n's links are followed: a node's left
 * link to itself recursed until the stack ran out (the count grows only in
 * order, after the left subtree). */
static bool mp__treap_walk(const mp_pool_t *pool, mp__rec_owned_fn owned,
                           const mp__block_t *n, const mp__block_t *lo,
                           const mp__block_t *hi, unsigned fl, unsigned sl,
                           const mp__block_t **prev, size_t *count,
                           size_t *bytes, size_t limit) {
  if (n == NULL)
    return true;
  if (*count > limit || !owned(pool, n) || !mp__key_between(n, lo, hi))
    return false;
  /* Its stored priority: the hash of its address, or the top one at the
   * root (mp__index_link_hot). */
  uint32_t prio = n->prio;
  if ((prio != mp__prio(n->addr) &&
       (prio != UINT32_MAX || n != pool->bins[fl * MP__SL_COUNT + sl])) ||
      !mp__link_ok(pool, owned, n->left, prio) ||
      !mp__link_ok(pool, owned, n->right, prio))
    return false;
  if (!mp__treap_walk(pool, owned, n->left, lo, n, fl, sl, prev, count, bytes,
                      limit))
    return false;
  unsigned f, s;
  mp__class_of(pool, n->size, &f, &s);
  if (f != fl || s != sl || n->cls != fl * MP__SL_COUNT + sl ||
      (n->flags & (MP__B_FREE | MP__B_HOLE)) != MP__B_FREE)
    return false;
  if (*prev != NULL && mp__key_cmp(*prev, n->size, n->addr) >= 0)
    return false;
  *prev = n;
  (*count)++;
  *bytes += n->size;
  return mp__treap_walk(pool, owned, n->right, n, hi, fl, sl, prev, count,
                        bytes, limit);
}

bool mp__index_check_class(const mp_pool_t *pool, unsigned fl, unsigned sl,
                           mp__rec_owned_fn owned, size_t *count,
                           size_t *bytes) {
  const mp__block_t *prev = NULL;
  size_t n = 0, by = 0;
  size_t limit = (size_t)pool->st.free_blocks + 1;
  if (!mp__treap_walk(pool, owned, pool->bins[fl * MP__SL_COUNT + sl], NULL,
                      NULL, fl, sl, &prev, &n, &by, limit))
    return false;
  *count = n;
  *bytes = by;
  return true;
}
