/* xorshift.h - the one pseudo-random generator of the micro benchmarks, the
 * tests and the fuzz replayer: Marsaglia's xorshift64 (13, 7, 17).
 * Deterministic for a seed, so failures reproduce; never seed it with 0.
 * It lives in bench/ because the benchmarks use it and bench/ never
 * includes from tests/ (tests may include from bench/ and src/). The
 * built-in workloads draw from splitmix64 instead (workload.c), whose
 * sequences the published figures are made of. */
#ifndef MEMPOOL_BENCH_XORSHIFT_H
#define MEMPOOL_BENCH_XORSHIFT_H

#include <stdint.h>

static inline uint64_t xorshift64(uint64_t *state) {
  uint64_t x = *state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *state = x;
}

#endif /* MEMPOOL_BENCH_XORSHIFT_H */
