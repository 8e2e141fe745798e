/* history.c - the pool's event history: a ring of the last cfg.history
 * events (alloc, frees, segment map/unmap/alloc/free, oom), for snapshots
 * (snapshot.c).
 *
 * Off by default (history=0): the hooks in pool.c and segment.c are one
 * predictable branch (MP__HIST). On, an event costs a clock read and a
 * 40-byte store under the pool lock the caller already holds; the ring is
 * allocated once at create, so recording never allocates. With
 * history_stacks=1 it also costs a backtrace() of the allocating thread:
 * raw return addresses only, symbolized when a snapshot is written. */
#include <execinfo.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pool_internal.h"

/* Frames of the recording machinery itself (mp__history_record and the
 * pool function that called it) are dropped from the stack. */
#define MP__HIST_SKIP 2

mp_status_t mp__history_init(mp_pool_t *pool) {
  size_t n = pool->cfg.history;
  if (n == 0)
    return MP_OK;
  pool->hist.ev = calloc(n, sizeof *pool->hist.ev);
  if (pool->hist.ev == NULL)
    return mp__fail(MP_ENOMEM, "out of host memory for a history of %zu events",
                    n);
  if (pool->cfg.flags & MP_POOL_HISTORY_STACKS) {
    pool->hist.frames = calloc(n * MP__HIST_FRAMES, sizeof(void *));
    if (pool->hist.frames == NULL) {
      mp__history_release(pool);
      return mp__fail(MP_ENOMEM,
                      "out of host memory for the stacks of %zu events", n);
    }
    /* The first backtrace() loads the unwinder (it may allocate): do it
     * now rather than inside the first allocation. */
    void *warm[4];
    (void)backtrace(warm, 4);
  }
  pool->hist.cap = n;
  return MP_OK;
}

void mp__history_release(mp_pool_t *pool) {
  free(pool->hist.ev);
  free(pool->hist.frames);
  memset(&pool->hist, 0, sizeof pool->hist);
}

void mp__history_record(mp_pool_t *pool, unsigned action, uintptr_t addr,
                        size_t size, uintptr_t stream) {
  mp__history_t *h = &pool->hist;
  size_t i = h->next;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  mp__hevent_t *e = &h->ev[i];
  e->time_us = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
  e->addr = addr;
  e->size = size;
  e->stream = stream;
  e->action = (uint8_t)action;
  e->nframes = 0;
  if (h->frames != NULL) {
    void *raw[MP__HIST_FRAMES + MP__HIST_SKIP];
    int n = backtrace(raw, MP__HIST_FRAMES + MP__HIST_SKIP);
    if (n > MP__HIST_SKIP) {
      e->nframes = (uint8_t)(n - MP__HIST_SKIP);
      memcpy(&h->frames[i * MP__HIST_FRAMES], raw + MP__HIST_SKIP,
             e->nframes * sizeof(void *));
    }
  }
  h->next = i + 1 == h->cap ? 0 : i + 1;
  h->total++;
}
