/* pairs_rows.h - a pool's row of the pair benchmarks (bench_pool_pairs'
 * device pool, bench_host_pairs' host pool): its figures from the pool's
 * stats around the timed phase, printed in the same columns. */
#ifndef MP_MICRO_PAIRS_ROWS_H
#define MP_MICRO_PAIRS_ROWS_H

#include <stdbool.h>
#include <stdio.h>

#include <mempool/stats.h>

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

#endif /* MP_MICRO_PAIRS_ROWS_H */
