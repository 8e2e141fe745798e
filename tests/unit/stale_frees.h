/* stale_frees.h - a thread that frees, as a raw pointer, whatever address
 * the test last published, over and over: a stale pointer's double free
 * landing on the blocks the test makes, from another thread, at any point
 * of their making. Each free that passes is counted (on a block marked
 * movable or a child's range it must be MP_EINVAL). */
#ifndef MEMPOOL_TEST_STALE_FREES_H
#define MEMPOOL_TEST_STALE_FREES_H

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include <mempool/mempool.h>

#include "../support/pool_helpers.h"

typedef struct stale_freer {
  mp_pool_t *pool;
  _Atomic(void *) last; /* the address to free; NULL: none */
  atomic_bool stop;
  atomic_long passed; /* frees that returned MP_OK */
  pthread_t thread;
} stale_freer_t;

static void *stale_freer_run(void *arg) {
  stale_freer_t *f = arg;
  while (!atomic_load(&f->stop)) {
    void *p = atomic_load(&f->last);
    if (p != NULL && mp_pool_free(f->pool, p) == MP_OK)
      atomic_fetch_add(&f->passed, 1);
  }
  return NULL;
}

static inline void stale_freer_start(stale_freer_t *f, mp_pool_t *pool) {
  f->pool = pool;
  atomic_init(&f->last, NULL);
  atomic_init(&f->stop, false);
  atomic_init(&f->passed, 0);
  pthread_create(&f->thread, NULL, stale_freer_run, f);
}

/* Stops the thread; the frees that passed. */
static inline long stale_freer_stop(stale_freer_t *f) {
  atomic_store(&f->stop, true);
  pthread_join(f->thread, NULL);
  return atomic_load(&f->passed);
}

/* One kind of object the race makes and unmakes: make returns the
 * address to publish (the object in *obj), unmake ends the object. */
typedef struct stale_round {
  void *(*make)(mp_pool_t *pool, void **obj);
  void (*unmake)(mp_pool_t *pool, void *obj);
  const char *what; /* for the message: "a movable block" */
} stale_round_t;

/* rounds objects made and unmade one after another, each one's address
 * published to the freer while it lives; then no stale free may have
 * passed, and nothing is left allocated. */
static inline void stale_frees_race(mp_pool_t *pool, int rounds,
                                    const stale_round_t *r) {
  stale_freer_t f;
  stale_freer_start(&f, pool);
  for (int i = 0; i < rounds; i++) {
    void *obj = NULL;
    atomic_store(&f.last, r->make(pool, &obj));
    r->unmake(pool, obj);
  }
  cr_expect_eq(stale_freer_stop(&f), 0, "a raw free of %s passed", r->what);
  check(pool);
  cr_expect_eq(stats(pool).allocated_bytes, 0);
}

#endif /* MEMPOOL_TEST_STALE_FREES_H */
