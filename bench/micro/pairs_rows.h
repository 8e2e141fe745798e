/* pairs_rows.h - a pool's row of the pair benchmarks (bench_pool_pairs'
 * device pool, bench_host_pairs' host pool): its figures from the pool's
 * stats around the timed phase, printed in the same columns. */
#ifndef MP_MICRO_PAIRS_ROWS_H
#define MP_MICRO_PAIRS_ROWS_H

#include <stdbool.h>
#include <stdio.h>

#include <mempool/mempool.h>
#include <mempool/stats.h>

#include "args.h"

typedef struct result {
  double ns_per_pair;
  unsigned long long device_allocs, device_frees;
  double reserved_over_live;
  unsigned long long free_blocks;
  bool virtual_range; /* the pool grew in its virtual range */
} result_t;

/* r's figures for pairs pairs that took ns, between stats s0 and s1. */
static inline void pairs_result(result_t *r, const mp_stats_t *s0,
                                const mp_stats_t *s1, double ns, size_t pairs) {
  r->ns_per_pair = ns / (double)pairs;
  r->device_allocs = s1->device_alloc_count - s0->device_alloc_count;
  r->device_frees = s1->device_free_count - s0->device_free_count;
  r->free_blocks = s1->free_blocks;
  r->reserved_over_live =
      (double)s1->peak_reserved_bytes / (double)s1->peak_requested_bytes;
}

/* The row's columns up to "free blocks", without a line end. */
static inline void pairs_row(const char *allocator, size_t live,
                             const result_t *r) {
  printf("%-10s %8zu %12.1f %12llu %12llu %14.3f %12llu", allocator, live,
         r->ns_per_pair, r->device_allocs, r->device_frees,
         r->reserved_over_live, r->free_blocks);
}

/* The pair count, argv[1] (default 2 000 000, at most 10^8); false, with
 * the message on stderr, where it is not one. */
static inline bool pairs_count(int argc, char **argv, size_t *pairs) {
  uint64_t n;
  if (!micro_count(argc, argv, 1, 2000000, 1, 100000000, "pairs", &n))
    return false;
  *pairs = (size_t)n;
  return true;
}

/* Opens the benchmark's device (spec); NULL, with the device's message on
 * stderr, where it cannot. */
static inline mp_device_t *pairs_device(const char *spec) {
  mp_device_t *dev = NULL;
  if (mp_device_open(spec, &dev) != MP_OK) {
    fprintf(stderr, "device: %s\n", mp_last_error());
    return NULL;
  }
  return dev;
}

#endif /* MP_MICRO_PAIRS_ROWS_H */
