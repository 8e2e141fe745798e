/* gated_streams.h - n streams of dev, each held back by a gate (its
 * gate_wait queued first), for tests of blocks whose reuse waits for work
 * on several streams; and their end: gates opened, streams destroyed. */
#ifndef MEMPOOL_TESTS_GATED_STREAMS_H
#define MEMPOOL_TESTS_GATED_STREAMS_H

#include <criterion/criterion.h>
#include <mempool/mempool.h>

#include "stream_gate.h"

static inline void gated_streams_open(mp_device_t *dev, mp_stream_t *st,
                                      gate_t *g, int n) {
  for (int i = 0; i < n; i++) {
    gate_init(&g[i]);
    cr_assert_eq(mp_stream_create(dev, &st[i]), MP_OK);
    cr_assert_eq(mp_stream_launch_host(dev, st[i], gate_wait, &g[i]), MP_OK);
  }
}

static inline void gated_streams_open_gates(gate_t *g, int n) {
  for (int i = 0; i < n; i++)
    gate_open(&g[i]);
}

static inline void gated_streams_close(mp_device_t *dev, mp_stream_t *st,
                                       gate_t *g, int n) {
  for (int i = 0; i < n; i++) {
    cr_assert_eq(mp_stream_destroy(dev, st[i]), MP_OK);
    gate_destroy(&g[i]);
  }
}

#endif
