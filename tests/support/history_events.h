/* history_events.h - for white-box tests of a pool's event history: the
 * streams of the events of one action in its ring. */
#ifndef MEMPOOL_TESTS_HISTORY_EVENTS_H
#define MEMPOOL_TESTS_HISTORY_EVENTS_H

#include <criterion/criterion.h>
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

/* Expects the ring's events of action after the first `from` to be at
 * least one, each saying stream; what names them in messages. Returns how
 * many the ring holds. */
static inline size_t history_events_say(const mp_pool_t *p, unsigned action,
                                        size_t from, uintptr_t stream,
                                        const char *what) {
  uintptr_t got[64];
  size_t n = history_events_of(p, action, got, 64);
  cr_expect_gt(n, from, "no %s", what);
  for (size_t i = from; i < n && i < 64; i++)
    cr_expect_eq(got[i], stream, "%s %zu says %#lx, not %#lx", what, i,
                 (unsigned long)got[i], (unsigned long)stream);
  return n;
}

#endif
