/* oom_kinds.h - shared by the out-of-memory handler's tests: an engine
 * whose handler drops a cache it holds in the pool, and the kinds of
 * allocation that ask the handler, each asked for and given back alike,
 * in the configurations the handler behaves the same in. */
#ifndef MEMPOOL_TEST_OOM_KINDS_H
#define MEMPOOL_TEST_OOM_KINDS_H

#include <criterion/criterion.h>

#include <mempool/mempool.h>

typedef struct engine {
  void *cache; /* a block the engine can let go of */
  int calls;
  size_t bytes;
  mp_status_t status;
  int answer;
} engine_t;

static inline int drop_cache(mp_pool_t *pool, size_t bytes, mp_status_t status,
                             void *ctx) {
  engine_t *e = ctx;
  e->calls++;
  e->bytes = bytes;
  e->status = status;
  if (e->cache != NULL) {
    cr_assert_eq(mp_pool_free(pool, e->cache), MP_OK, "%s", mp_last_error());
    e->cache = NULL;
  }
  return e->answer;
}

/* The configurations the handler behaves the same in: the pool's own core,
 * and the arenas' out-of-memory path. */
static const char *const configs[] = {"arenas=0", "arenas=2"};

/* The allocation kinds: mp_pool_alloc_contiguous, mp_pool_create_child,
 * mp_pool_alloc. */
typedef enum { PIECES, CHILD, ALLOC } kind_t;

typedef struct asked {
  void *pieces[2];
  mp_pool_t *child;
} asked_t;

/* bytes of kind k from p (two equal pieces, a child's range, or one
 * block). */
static inline mp_status_t ask(mp_pool_t *p, kind_t k, size_t bytes,
                              asked_t *a) {
  if (k == ALLOC)
    return mp_pool_alloc(p, bytes, NULL, a->pieces);
  if (k == CHILD)
    return mp_pool_create_child(p, bytes, &a->child);
  size_t sizes[2] = {bytes / 2, bytes / 2};
  return mp_pool_alloc_contiguous(p, 2, sizes, NULL, a->pieces);
}

static inline void give_back(mp_pool_t *p, kind_t k, asked_t *a) {
  if (k == CHILD) {
    cr_assert_eq(mp_pool_destroy(a->child), MP_OK, "%s", mp_last_error());
    return;
  }
  for (int i = 0; i < (k == PIECES ? 2 : 1); i++)
    cr_assert_eq(mp_pool_free(p, a->pieces[i]), MP_OK, "%s", mp_last_error());
}

static inline const char *kind_name(kind_t k) {
  return k == CHILD   ? "mp_pool_create_child"
         : k == ALLOC ? "mp_pool_alloc"
                      : "mp_pool_alloc_contiguous";
}

#endif /* MEMPOOL_TEST_OOM_KINDS_H */
