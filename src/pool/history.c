/* history.c - the pool's event history: a ring of the last cfg.history
 * events (alloc, frees, segment map/unmap/alloc/free, oom), for snapshots
 * (snapshot.c).
 *
 * Off by default (history=0): the hooks in core.c, segment.c and vrange.c are
 * one predictable branch (MP__HIST). On, an event costs a clock read and a
 * 40-byte store under the pool lock the caller already holds; the ring is
 * allocated once at create, so recording never allocates. With
 * history_stacks=1 it also costs a backtrace() of the allocating thread:
 * raw return addresses only, symbolized when a snapshot is written.
 * Measured (bench_pool_pairs 1000000 host:capacity=64T history, 2-core
 * VM): ns per free+alloc pair with 100 / 10 000 live blocks: off 130 / 177,
 * history=65536 171 / 225, with stacks 2640 / 3000 (two backtrace() calls
 * a pair: a free's two events share one stack and one clock read). */
#include <execinfo.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pool_internal.h"

/* A stack starts at the caller of the public entry point (MP__HIST_ENTRY),
 * searched for in the first MP__HIST_DEPTH frames; the pool's own frames
 * above it (entry point, locked core, block and segment code, this file)
 * are dropped. Without the mark, only this file's frames are: the stamp's
 * own and what a sanitizer's backtrace interceptor adds below it (found by
 * the stamp's return address), then these two (mp__hist_record,
 * mp__history_record). */
#define MP__HIST_SKIP  2
#define MP__HIST_DEPTH 32

_Thread_local void *mp__hist_caller;

mp_status_t mp__history_init(mp_pool_t *pool) {
  size_t n = pool->cfg.history;
  bool stacks = n > 0 && (pool->cfg.flags & MP_POOL_HISTORY_STACKS);
  /* A pool with arenas records nothing itself: each arena keeps a ring of
   * n events (its config is the pool's, arenas 0), and a snapshot merges
   * them by time (snapshot.c). Its entry points mark their caller for the
   * arenas' stacks. */
  if (n == 0 || pool->cfg.arenas > 0) {
    pool->hist.marks = stacks;
    return MP_OK;
  }
  pool->hist.ev = mp__host_calloc(n, sizeof *pool->hist.ev);
  if (pool->hist.ev == NULL)
    return mp__fail(MP_ENOMEM, "out of host memory for a history of %zu events",
                    n);
  if (pool->cfg.flags & MP_POOL_HISTORY_STACKS) {
    pool->hist.frames = mp__host_calloc(n * MP__HIST_FRAMES, sizeof(void *));
    if (pool->hist.frames == NULL) {
      mp__history_release(pool);
      return mp__fail(MP_ENOMEM,
                      "out of host memory for the stacks of %zu events", n);
    }
    /* The first backtrace() loads the unwinder (it may allocate): do it
     * now rather than inside the first allocation. */
    void *warm[4];
    (void)backtrace(warm, 4);
    pool->hist.marks = true;
  }
  pool->hist.cap = n;
  mp__pool_rare_update(pool);
  return MP_OK;
}

void mp__history_release(mp_pool_t *pool) {
  free(pool->hist.ev);
  free(pool->hist.frames);
  memset(&pool->hist, 0, sizeof pool->hist);
  mp__pool_rare_update(pool);
}

/* Appends one event with the given time and stack. */
static void mp__hist_put(mp__history_t *h, unsigned action, uintptr_t addr,
                         size_t size, uintptr_t stream, uint64_t time_us,
                         void *const *frames, int nframes, uint32_t over) {
  size_t i = h->next;
  mp__hevent_t *e = &h->ev[i];
  e->time_us = time_us;
  e->addr = addr;
  e->size = size;
  e->stream = stream;
  e->action = (uint8_t)action;
  e->nframes = (uint8_t)nframes;
  e->restored = false;
  e->over = over;
  if (nframes > 0)
    memcpy(&h->frames[i * MP__HIST_FRAMES], frames,
           (size_t)nframes * sizeof(void *));
  h->next = i + 1 == h->cap ? 0 : i + 1;
  h->total++;
}

/* The clock and (stacks) the stack for the events of one call. */
__attribute__((noinline)) void mp__history_stamp(const mp_pool_t *pool,
                                                 mp__hstamp_t *out) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  out->us = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
  out->nframes = 0;
  if (pool->hist.frames == NULL)
    return;
  void *raw[MP__HIST_DEPTH + MP__HIST_FRAMES];
  int got = backtrace(raw, MP__HIST_DEPTH + MP__HIST_FRAMES);
  void *from = __builtin_return_address(0);
  int skip = -1, base = 1; /* base: the stamp's caller's frame */
  for (int i = 0; i < got && i < MP__HIST_DEPTH; i++) {
    if (raw[i] == from && base == 1 && i > 0)
      base = i;
    if (raw[i] == mp__hist_caller) {
      skip = i;
      break;
    }
  }
  if (skip < 0)
    skip = base + MP__HIST_SKIP;
  int nf = got - skip;
  nf = nf < 0 ? 0 : nf > MP__HIST_FRAMES ? MP__HIST_FRAMES : nf;
  if (nf > 0)
    memcpy(out->frames, raw + skip, (size_t)nf * sizeof(void *));
  out->nframes = nf;
}

void mp__history_put(mp_pool_t *pool, const mp__hstamp_t *at, unsigned action,
                     uintptr_t addr, size_t size, uintptr_t stream,
                     bool restored) {
  mp__history_t *h = &pool->hist;
  size_t i = h->next;
  mp__hist_put(h, action, addr, size, stream, at->us, at->frames, at->nframes,
               0);
  h->ev[i].restored = restored;
}

/* Records actions[0..n) of one block with one clock read and (stacks) one
 * backtrace: a free's requested and completed events share them. */
__attribute__((noinline)) static void
mp__hist_record(mp_pool_t *pool, const unsigned *actions, int n, uintptr_t addr,
                size_t size, uintptr_t stream, uint32_t over) {
  mp__hstamp_t at;
  mp__history_stamp(pool, &at);
  for (int k = 0; k < n; k++)
    mp__hist_put(&pool->hist, actions[k], addr, size, stream, at.us, at.frames,
                 at.nframes, over);
}

void mp__history_record(mp_pool_t *pool, unsigned action, uintptr_t addr,
                        size_t size, uintptr_t stream) {
  mp__hist_record(pool, &action, 1, addr, size, stream, 0);
}

void mp__history_free(mp_pool_t *pool, uintptr_t addr, size_t size,
                      size_t block, uintptr_t stream, bool requested) {
  static const unsigned both[2] = {MP__H_FREE_REQUESTED, MP__H_FREE_COMPLETED};
  /* The block's bytes past the request rounded (mp__hevent_t.over). */
  size_t up, units = 0;
  if (mp__pool_align_up(pool, size, &up) && block > up)
    units = (block - up) / (pool->align_add + 1);
  mp__hist_record(pool, both + requested, 2 - requested, addr, size, stream,
                  units > UINT32_MAX ? UINT32_MAX : (uint32_t)units);
}

void mp__history_save_next(const mp_pool_t *pool, mp__hkept_t *out) {
  const mp__history_t *h = &pool->hist;
  out->ev = h->ev[h->next];
  if (h->frames != NULL)
    memcpy(out->frames, &h->frames[h->next * MP__HIST_FRAMES],
           sizeof out->frames);
}

void mp__history_take_back(mp_pool_t *pool, const mp__hkept_t *was) {
  mp__history_t *h = &pool->hist;
  h->next = h->next == 0 ? h->cap - 1 : h->next - 1;
  h->total--;
  h->ev[h->next] = was->ev;
  if (h->frames != NULL)
    memcpy(&h->frames[h->next * MP__HIST_FRAMES], was->frames,
           sizeof was->frames);
}
