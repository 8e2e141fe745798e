/* pairs_plan.h - the free+alloc pair plan of bench_pool_pairs, shared by
 * the micro benchmarks that run it through another allocator
 * (bench_host_pairs, bench_preload_pairs), so that every one of them sees
 * the same sizes and victims, and the callgrind markers around a timed
 * phase (count_pairs.sh and preload_pairs.sh read them).
 *
 * Sizes are log-uniform in [512 B, 16 MiB], drawn from one xorshift64
 * sequence per program: the plan of 100 live blocks, made first, then that
 * of 10 000, are the same in every benchmark for the same pair count. */
#ifndef MP_MICRO_PAIRS_PLAN_H
#define MP_MICRO_PAIRS_PLAN_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../core/xorshift.h"

#if defined(__has_include)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define MP_HAVE_CALLGRIND 1
#endif
#endif

/* Around a timed phase: under callgrind, count only it (a no-op
 * otherwise; the client requests cost a few instructions each). */
static inline void count_begin(void) {
#ifdef MP_HAVE_CALLGRIND
  CALLGRIND_ZERO_STATS;
  CALLGRIND_START_INSTRUMENTATION;
#endif
}

/* Ends the phase and dumps its count as "WHAT LIVE". */
static inline void count_end(const char *what, size_t live) {
#ifdef MP_HAVE_CALLGRIND
  CALLGRIND_STOP_INSTRUMENTATION;
  char name[64];
  snprintf(name, sizeof name, "%s %zu", what, live);
  CALLGRIND_DUMP_STATS_AT(name);
#else
  (void)what;
  (void)live;
#endif
}

typedef struct plan {
  size_t *sizes;    /* one per pair */
  uint32_t *victim; /* one per pair */
  size_t *init;     /* one per live block */
  size_t pairs, live;
} plan_t;

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static inline uint64_t next_u64(void) {
  return xorshift64(&rng);
}

static inline size_t log_uniform(void) {
  double lo = log(512.0), hi = log(16.0 * 1024 * 1024);
  double u = (double)(next_u64() >> 11) / (double)(1ull << 53);
  return (size_t)exp(lo + u * (hi - lo));
}

static inline void plan_free(plan_t *p) {
  free(p->sizes);
  free(p->victim);
  free(p->init);
  p->sizes = NULL;
  p->victim = NULL;
  p->init = NULL;
}

/* The plan; its arrays NULL (freed) when host memory runs out. */
static inline plan_t make_plan(size_t live, size_t pairs) {
  plan_t p = {malloc(pairs * sizeof(size_t)), malloc(pairs * sizeof(uint32_t)),
              malloc(live * sizeof(size_t)), pairs, live};
  if (p.sizes == NULL || p.victim == NULL || p.init == NULL) {
    plan_free(&p);
    return p;
  }
  for (size_t i = 0; i < live; i++)
    p.init[i] = log_uniform();
  for (size_t i = 0; i < pairs; i++) {
    p.sizes[i] = log_uniform();
    p.victim[i] = (uint32_t)(next_u64() % live);
  }
  return p;
}

static inline double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

#endif /* MP_MICRO_PAIRS_PLAN_H */
