/* fuzz_pool_ops.h - what the pool harnesses (fuzz_pool, fuzz_pool_life)
 * share: what an out-of-memory refusal is, and work that keeps a stream
 * behind the host. */
#ifndef MEMPOOL_FUZZ_POOL_OPS_H
#define MEMPOOL_FUZZ_POOL_OPS_H

#include <stdint.h>
#include <time.h>

#include <mempool/status.h>

static inline int fz_is_oom(mp_status_t st) {
  return st == MP_ENOMEM || st == MP_ELIMIT;
}

/* Work on a stream (mp_stream_launch_host): spins for arg microseconds. */
static inline void fz_busy(void *arg) {
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  long us = (long)(uintptr_t)arg;
  do
    clock_gettime(CLOCK_MONOTONIC, &t);
  while ((t.tv_sec - t0.tv_sec) * 1000000L + (t.tv_nsec - t0.tv_nsec) / 1000 <
         us);
}

#endif
