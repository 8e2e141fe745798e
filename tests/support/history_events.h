/* history_events.h - for white-box tests of a pool's event history: the
 * streams of the events of one action in its ring. */
#ifndef MEMPOOL_TESTS_HISTORY_EVENTS_H
#define MEMPOOL_TESTS_HISTORY_EVENTS_H

#include <stddef.h>
#include <stdint.h>

#include "pool/pool_internal.h"

/* How many events of action the ring holds, and the stream of each in
 * got[] (at most max), oldest first. */
static inline size_t history_events_of(const mp_pool_t *p, unsigned action,
                                       uintptr_t *got, size_t max) {
  const mp__history_t *h = &p->hist;
  size_t nev = h->total < h->cap ? (size_t)h->total : h->cap;
  size_t start = h->total > h->cap ? h->next : 0, n = 0;
  for (size_t k = 0; k < nev; k++) {
    const mp__hevent_t *e = &h->ev[(start + k) % h->cap];
    if (e->action != action)
      continue;
    if (n < max)
      got[n] = e->stream;
    n++;
  }
  return n;
}

#endif
