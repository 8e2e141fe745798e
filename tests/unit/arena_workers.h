/* arena_workers.h - for the white-box tests of pools with arenas: jobs
 * (allocate, free, record a stream) run on a new thread or on a worker
 * thread that keeps its arena, and which arena holds a block. */
#ifndef MEMPOOL_TEST_ARENA_WORKERS_H
#define MEMPOOL_TEST_ARENA_WORKERS_H

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "../support/pool_helpers.h"
#include "arena_holding.h"
#include "pool/pool_internal.h"

/* ---- work on threads of their own -------------------------------------- */
typedef enum { ALLOC, FREE, RECORD, FREE_ASYNC } op_t;

typedef struct job {
  mp_pool_t *pool;
  op_t op;
  size_t bytes;
  unsigned tag; /* ALLOC: the blocks' bytes are tag + i */
  int count;
  mp_stream_t s; /* ALLOC: the stream (NULL unless set) */
  void *ptrs[8];
  mp_status_t st;
  char why[256]; /* mp_last_error() of the job's thread, after it */
} job_t;

static inline void fill(void *p, size_t n, unsigned tag) {
  memset(p, (int)(tag & 0xff), n);
}

/* The first byte of p that is not tag, or n. */
static inline size_t first_difference(const void *p, size_t n, unsigned tag) {
  const unsigned char *c = p;
  size_t at = 0;
  while (at < n && c[at] == (unsigned char)tag)
    at++;
  return at;
}

static inline void *job_run(void *arg) {
  job_t *j = arg;
  j->st = MP_OK;
  for (int i = 0; i < j->count && j->st == MP_OK; i++) {
    switch (j->op) {
    case ALLOC:
      j->st = mp_pool_alloc(j->pool, j->bytes, j->s, &j->ptrs[i]);
      if (j->st == MP_OK)
        fill(j->ptrs[i], j->bytes, j->tag + (unsigned)i);
      break;
    case FREE: j->st = mp_pool_free(j->pool, j->ptrs[i]); break;
    case RECORD:
      j->st = mp_pool_record_stream(j->pool, j->ptrs[i], NULL);
      break;
    case FREE_ASYNC:
      j->st = mp_pool_free_async(j->pool, j->ptrs[i], NULL);
      break;
    }
  }
  snprintf(j->why, sizeof j->why, "%s", mp_last_error());
  return NULL;
}

/* Runs fn(arg) on a new thread (a new arena number) and waits for it. */
static inline void on_new_thread(void *(*fn)(void *), void *arg) {
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, fn, arg), 0);
  pthread_join(t, NULL);
}

/* Runs j's op on a new thread (a new arena number: one not made yet, with
 * arenas=4 and two workers) and waits for it; returns its status. */
static inline mp_status_t on_thread(job_t *j, op_t op) {
  j->op = op;
  on_new_thread(job_run, j);
  return j->st;
}

/* A thread that keeps its arena: runs the jobs given to on_worker. */
typedef struct worker {
  pthread_t t;
  pthread_mutex_t m;
  pthread_cond_t c;
  job_t *job; /* to run; NULL once run */
  bool quit;
} worker_t;

static inline void *worker_main(void *arg) {
  worker_t *w = arg;
  pthread_mutex_lock(&w->m);
  for (;;) {
    while (w->job == NULL && !w->quit)
      pthread_cond_wait(&w->c, &w->m);
    if (w->job == NULL)
      break;
    /* Run without w->m, so that on_worker_within can give up waiting. */
    job_t *j = w->job;
    pthread_mutex_unlock(&w->m);
    job_run(j);
    pthread_mutex_lock(&w->m);
    w->job = NULL;
    pthread_cond_broadcast(&w->c);
  }
  pthread_mutex_unlock(&w->m);
  return NULL;
}

static inline void worker_start(worker_t *w) {
  memset(w, 0, sizeof *w);
  pthread_mutex_init(&w->m, NULL);
  pthread_cond_init(&w->c, NULL);
  cr_assert_eq(pthread_create(&w->t, NULL, worker_main, w), 0);
}

static inline void worker_stop(worker_t *w) {
  pthread_mutex_lock(&w->m);
  w->quit = true;
  pthread_cond_broadcast(&w->c);
  pthread_mutex_unlock(&w->m);
  pthread_join(w->t, NULL);
  pthread_mutex_destroy(&w->m);
  pthread_cond_destroy(&w->c);
}

/* Runs j's op on w and waits for it; returns its status. */
static inline mp_status_t on_worker(worker_t *w, job_t *j, op_t op) {
  j->op = op;
  pthread_mutex_lock(&w->m);
  w->job = j;
  pthread_cond_broadcast(&w->c);
  while (w->job != NULL)
    pthread_cond_wait(&w->c, &w->m);
  pthread_mutex_unlock(&w->m);
  return j->st;
}

/* Gives j's op to w and waits at most ms milliseconds for it: whether it
 * ran. If not, the caller ends what holds it back and calls on_worker_wait. */
static inline bool on_worker_within(worker_t *w, job_t *j, op_t op, long ms) {
  j->op = op;
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += ms / 1000;
  until.tv_nsec += (ms % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&w->m);
  w->job = j;
  pthread_cond_broadcast(&w->c);
  while (w->job != NULL)
    if (pthread_cond_timedwait(&w->c, &w->m, &until) != 0)
      break;
  bool ran = w->job == NULL;
  pthread_mutex_unlock(&w->m);
  return ran;
}

/* Waits for the job on_worker_within gave w; returns its status. */
static inline mp_status_t on_worker_wait(worker_t *w, job_t *j) {
  pthread_mutex_lock(&w->m);
  while (w->job != NULL)
    pthread_cond_wait(&w->c, &w->m);
  pthread_mutex_unlock(&w->m);
  return j->st;
}

/* w started, its arena made to cache one block of bytes (allocated and
 * freed there). */
static inline void cache_on_worker(mp_pool_t *pool, worker_t *w, size_t bytes) {
  job_t cache = {.pool = pool, .bytes = bytes, .tag = 0x10, .count = 1};
  worker_start(w);
  cr_assert_eq(on_worker(w, &cache, ALLOC), MP_OK, "%s", cache.why);
  cr_assert_eq(on_worker(w, &cache, FREE), MP_OK, "%s", cache.why);
}

static inline size_t arenas_made(mp_pool_t *pool) {
  size_t n = 0;
  for (size_t i = 0; i < pool->cfg.arenas; i++)
    n += mp__arena_at(pool, i) != NULL;
  return n;
}

/* Workers wa and wb started, each allocating its job's blocks: two arenas
 * hold them. */
static worker_t wa, wb;
static inline void two_arenas(mp_pool_t *pool, job_t *a, job_t *b) {
  worker_start(&wa);
  worker_start(&wb);
  cr_assert_eq(on_worker(&wa, a, ALLOC), MP_OK, "%s", a->why);
  cr_assert_eq(on_worker(&wb, b, ALLOC), MP_OK, "%s", b->why);
  int ia = arena_holding(pool, a->ptrs[0]),
      ib = arena_holding(pool, b->ptrs[0]);
  cr_assert(ia >= 0 && ib >= 0 && ia != ib, "two arenas (%d, %d)", ia, ib);
  cr_assert_eq(arenas_made(pool), 2);
}

static inline void expect_kept(const job_t *j) {
  for (int i = 0; i < j->count; i++) {
    size_t at = first_difference(j->ptrs[i], j->bytes, j->tag + (unsigned)i);
    cr_expect_eq(at, j->bytes, "block %u lost its content from byte %zu",
                 j->tag + (unsigned)i, at);
  }
}

#endif /* MEMPOOL_TEST_ARENA_WORKERS_H */
