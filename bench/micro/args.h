/* args.h - the micro benchmarks' counts from the command line.
 *
 * A count is a plain decimal within its range, or the benchmark refuses it
 * (exit 2) before any work: strtoull and atoi took "-5" as 2^64 - 5 (a plan
 * no malloc holds, or whose size wrapped: a crash), "5x" as 5 and "abc" as
 * 0 without a word. */
#ifndef MP_MICRO_ARGS_H
#define MP_MICRO_ARGS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "internal.h" /* mp__parse_u64: digits only, no sign or blank */

/* argv[i] where argc > i (else def) as a count in [lo, hi] into *out;
 * false, after a message naming what and its range, when it is none. */
static inline bool micro_count(int argc, char **argv, int i, uint64_t def,
                               uint64_t lo, uint64_t hi, const char *what,
                               uint64_t *out) {
  if (argc <= i) {
    *out = def;
    return true;
  }
  const char *s = argv[i];
  if (mp__parse_u64(s, strlen(s), out) && *out >= lo && *out <= hi)
    return true;
  fprintf(stderr, "%s: bad %s '%s' (a decimal from %llu to %llu)\n", argv[0],
          what, s, (unsigned long long)lo, (unsigned long long)hi);
  return false;
}

#endif /* MP_MICRO_ARGS_H */
