/* arena_holding.h - which arena of a pool with arenas holds a pointer. */
#ifndef MEMPOOL_TEST_ARENA_HOLDING_H
#define MEMPOOL_TEST_ARENA_HOLDING_H

#include "pool/pool_internal.h"

/* The index of the first arena made for which in(arena, p) holds, asked
 * under the arena's lock, or -1. */
static inline int arena_where(mp_pool_t *pool, const void *p,
                              bool (*in)(mp_pool_t *a, uintptr_t p)) {
  for (size_t i = 0; i < pool->cfg.arenas; i++) {
    mp_pool_t *a = mp__arena_at(pool, i);
    if (a == NULL)
      continue;
    mp__pool_lock(a);
    bool yes = in(a, (uintptr_t)p);
    mp__pool_unlock(a);
    if (yes)
      return (int)i;
  }
  return -1;
}

static inline bool arena_live_at(mp_pool_t *a, uintptr_t p) {
  return mp__map_find(a, p) != NULL;
}

/* The index of the arena whose live map holds p, or -1. */
static inline int arena_holding(mp_pool_t *pool, const void *p) {
  return arena_where(pool, p, arena_live_at);
}

#endif /* MEMPOOL_TEST_ARENA_HOLDING_H */
