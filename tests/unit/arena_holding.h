/* arena_holding.h - which arena of a pool with arenas holds a pointer. */
#ifndef MEMPOOL_TEST_ARENA_HOLDING_H
#define MEMPOOL_TEST_ARENA_HOLDING_H

#include "pool/pool_internal.h"

/* The index of the arena whose live map holds p, or -1. */
static inline int arena_holding(mp_pool_t *pool, const void *p) {
  for (size_t i = 0; i < pool->cfg.arenas; i++) {
    mp_pool_t *a = mp__arena_at(pool, i);
    if (a == NULL)
      continue;
    mp__pool_lock(a);
    bool in = mp__map_find(a, (uintptr_t)p) != NULL;
    mp__pool_unlock(a);
    if (in)
      return (int)i;
  }
  return -1;
}

#endif /* MEMPOOL_TEST_ARENA_HOLDING_H */
