/* xorshift.h - the one pseudo-random generator of the tests, the fuzz
 * replayer and the micro benchmarks: Marsaglia's xorshift64 (13, 7, 17).
 * Deterministic for a seed, so failures reproduce; never seed it with 0. */
#ifndef MEMPOOL_TEST_XORSHIFT_H
#define MEMPOOL_TEST_XORSHIFT_H

#include <stdint.h>

static inline uint64_t xorshift64(uint64_t *state) {
  uint64_t x = *state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *state = x;
}

#endif /* MEMPOOL_TEST_XORSHIFT_H */
