/* pool_threads - how free + alloc pairs scale with threads: T threads on one
 * shared pool, T threads each with a pool of its own, and a shared jemalloc
 * arena without thread caches, for T = 1, 2, 4, 8, side by side in one run;
 * and T threads on one shared pool made with arenas=8 (per-thread arenas:
 * each thread allocates from one of 8 private sub-pools, up to 8 threads
 * one each), also with arenas_auto=1 (solo until threads contend), and
 * with arenas_auto=1 past solo (the lane).
 *
 * Each thread keeps its own live set (100 blocks by default) and runs its
 * own plan: sizes log-uniform in [512 B, 16 MiB], victims uniform, drawn
 * before timing. The threads start together at a barrier; the time is from
 * the barrier to the last thread's end. Printed per row: pairs per second
 * (all threads together), the speed-up over the same mode with one thread,
 * for the pool rows peak reserved / peak live (sharing a pool must not
 * raise fragmentation), and how evenly the threads got through: the
 * slowest run of 256 pairs in any thread ("worst run"; one thread alone
 * does one in about 35 us) and when the first thread ended, as a fraction
 * of the whole run ("first end": near 1 when the threads share fairly, 1/T
 * when one thread ran while the others waited), and how many cores the
 * threads got ("cores": their CPU time from the start to each one's end,
 * CLOCK_THREAD_CPUTIME_ID, over the run's time; near T when each thread
 * had a core of its own throughout, lower when the machine's other load
 * took some, or when a thread slept on a lock). The device is the host
 * backend with a large capacity, whose pages are never touched.
 *
 *   bench_pool_threads [pairs per thread=300000] [live per thread=100]
 *                      [max threads=8] [repeats=1]
 *
 * With repeats R above 1 every (mode, threads) row runs R times, the rows
 * of one repeat one after another (in the reverse order every other
 * repeat), so that a burst of load from elsewhere on a shared machine hits
 * one repeat of each row rather than every run of one row. A row then
 * shows the median pairs per second, the median over the repeats of the
 * speed-up over that repeat's own one-thread run (the two runs close in
 * time) and, in "range", the lowest and highest of those speed-ups; the
 * reserved/live and worst-run columns show the worst repeat, "first end"
 * the lowest, "cores" the median.
 *
 * A speed-up is only meaningful up to the machine's core count; past it the
 * rows show what oversubscription costs (a lock held by a descheduled
 * thread). */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mempool/mempool.h>

#include "../core/xorshift.h"
#include "args.h"

#if MEMPOOL_HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

enum mode { SHARED, ARENAS, AUTO, LANE, PER_THREAD, JEMALLOC, MODES };
static const char *const mode_name[MODES] = {
    "pool shared",     "pool arenas",     "pool auto",
    "pool auto, lane", "pool per thread", "jemalloc arena"};
/* The ARENAS row: one shared pool made with arenas=8 (the pool's per-thread
 * arenas), whatever the thread count. The AUTO row: the same with
 * arenas_auto=1, which runs solo on the first allocating thread's arena (a
 * plain pool's path) and switches to the arenas when threads contend: its
 * speed-up is over one thread solo. The LANE row: the same pool taken out
 * of solo before the timed pairs (another thread's arena, made once the
 * first thread's blocks are), so that its one-thread run is the first
 * thread past solo: in the lane since 2026-12-02 (the plain path), on the
 * arenas' path before. */
#define ARENAS_N 8

typedef struct worker {
  pthread_t tid;
  mp_pool_t *pool; /* SHARED, PER_THREAD */
  unsigned arena;  /* JEMALLOC */
  size_t pairs, live;
  size_t *sizes, *init;
  uint32_t *victim;
  void **slots;
  pthread_barrier_t *start;
  int failed;
  bool lane;           /* LANE: ends solo once its own blocks are made */
  double end_ns;       /* when this thread's last pair ended */
  double worst_run_ns; /* the slowest run of BATCH pairs */
  double cpu_ns;       /* its CPU time from the start to its end */
} worker_t;

/* Pairs per timed run: the slowest run shows a thread kept waiting (a
 * starved lock taker), at a clock read per BATCH pairs. */
#define BATCH 256

static size_t log_uniform(uint64_t *rng) {
  double lo = log(512.0), hi = log(16.0 * 1024 * 1024);
  double u = (double)(xorshift64(rng) >> 11) / (double)(1ull << 53);
  return (size_t)exp(lo + u * (hi - lo));
}

static double clock_ns(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static double now_ns(void) {
  return clock_ns(CLOCK_MONOTONIC);
}

/* Called after pair i: times each run of BATCH pairs (*t: the run's start). */
static void batch_tick(worker_t *w, size_t i, double *t) {
  if ((i + 1) % BATCH != 0 && i + 1 != w->pairs)
    return;
  double now = now_ns();
  if (now - *t > w->worst_run_ns)
    w->worst_run_ns = now - *t;
  *t = now;
  w->end_ns = now;
}

/* On a thread of its own: an arena made for it (mp_pool_alloc_contiguous
 * takes the arenas' path), which ends solo. */
static void *take_an_arena(void *arg) {
  mp_pool_t *pool = arg;
  size_t size = 4096;
  void *p;
  if (mp_pool_alloc_contiguous(pool, 1, &size, NULL, &p) == MP_OK)
    mp_pool_free(pool, p);
  return NULL;
}

static void *run_pool(void *arg) {
  worker_t *w = arg;
  for (size_t i = 0; i < w->live; i++)
    if (mp_pool_alloc(w->pool, w->init[i], NULL, &w->slots[i]) != MP_OK)
      w->failed = 1;
  if (w->lane) {
    pthread_t t;
    pthread_create(&t, NULL, take_an_arena, w->pool);
    pthread_join(t, NULL);
  }
  pthread_barrier_wait(w->start);
  double t = now_ns(), cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID);
  for (size_t i = 0; i < w->pairs && !w->failed; i++) {
    uint32_t v = w->victim[i];
    mp_pool_free(w->pool, w->slots[v]);
    if (mp_pool_alloc(w->pool, w->sizes[i], NULL, &w->slots[v]) != MP_OK)
      w->failed = 1;
    batch_tick(w, i, &t);
  }
  w->cpu_ns = clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu;
  pthread_barrier_wait(w->start);
  for (size_t i = 0; i < w->live; i++)
    mp_pool_free(w->pool, w->slots[i]);
  return NULL;
}

#if MEMPOOL_HAVE_JEMALLOC
static void *run_jemalloc(void *arg) {
  worker_t *w = arg;
  int flags = (int)MALLOCX_ARENA(w->arena) | MALLOCX_TCACHE_NONE;
  for (size_t i = 0; i < w->live; i++)
    if ((w->slots[i] = mallocx(w->init[i], flags)) == NULL)
      w->failed = 1;
  pthread_barrier_wait(w->start);
  double t = now_ns(), cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID);
  for (size_t i = 0; i < w->pairs && !w->failed; i++) {
    uint32_t v = w->victim[i];
    dallocx(w->slots[v], flags);
    if ((w->slots[v] = mallocx(w->sizes[i], flags)) == NULL)
      w->failed = 1;
    batch_tick(w, i, &t);
  }
  w->cpu_ns = clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu;
  pthread_barrier_wait(w->start);
  for (size_t i = 0; i < w->live; i++)
    if (w->slots[i] != NULL)
      dallocx(w->slots[i], flags);
  return NULL;
}
#endif

/* What a run measured besides pairs per second. */
typedef struct outcome {
  double ratio;      /* pools' peak reserved / peak live; 0 for jemalloc */
  double worst_us;   /* the slowest run of BATCH pairs in any thread */
  double first_done; /* the first thread's end / the last thread's end */
  double cores;      /* the threads' CPU time over the run's time */
} outcome_t;

/* Runs mode with n threads; pairs per second, or 0 on failure. */
static double run(mp_device_t *dev, enum mode m, worker_t *w, unsigned n,
                  outcome_t *o) {
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, n + 1);
  mp_pool_t *pools[64] = {0};
  bool auto_ = m == AUTO || m == LANE;
  unsigned npools = m == SHARED || m == ARENAS || auto_ ? 1
                    : m == PER_THREAD                   ? n
                                                        : 0;
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cfg.arenas = m == ARENAS || auto_ ? ARENAS_N : 0;
  if (auto_)
    cfg.flags |= MP_POOL_ARENAS_AUTO;
  for (unsigned i = 0; i < npools; i++)
    if (mp_pool_create(dev, &cfg, &pools[i]) != MP_OK) {
      fprintf(stderr, "pool: %s\n", mp_last_error());
      return 0;
    }
#if MEMPOOL_HAVE_JEMALLOC
  unsigned arena = 0;
  size_t sz = sizeof arena;
  if (m == JEMALLOC && mallctl("arenas.create", &arena, &sz, NULL, 0) != 0)
    return 0;
#endif
  for (unsigned t = 0; t < n; t++) {
    w[t].pool = pools[m == PER_THREAD ? t : 0];
    w[t].start = &start;
    w[t].failed = 0;
    w[t].lane = m == LANE && t == 0;
    w[t].end_ns = w[t].worst_run_ns = w[t].cpu_ns = 0;
    void *(*fn)(void *) = run_pool;
#if MEMPOOL_HAVE_JEMALLOC
    w[t].arena = arena;
    if (m == JEMALLOC)
      fn = run_jemalloc;
#endif
    pthread_create(&w[t].tid, NULL, fn, &w[t]);
  }
  pthread_barrier_wait(&start);
  double t0 = now_ns();
  pthread_barrier_wait(&start);
  double t1 = now_ns();
  int failed = 0;
  double first = t1, last = t0, cpu = 0;
  o->worst_us = 0;
  for (unsigned t = 0; t < n; t++) {
    pthread_join(w[t].tid, NULL);
    failed |= w[t].failed;
    cpu += w[t].cpu_ns;
    first = w[t].end_ns < first ? w[t].end_ns : first;
    last = w[t].end_ns > last ? w[t].end_ns : last;
    if (w[t].worst_run_ns / 1e3 > o->worst_us)
      o->worst_us = w[t].worst_run_ns / 1e3;
  }
  o->first_done = last > t0 ? (first - t0) / (last - t0) : 1;
  o->cores = last > t0 ? cpu / (last - t0) : 0;
  pthread_barrier_destroy(&start);
  double reserved = 0, live = 0;
  for (unsigned i = 0; i < npools; i++) {
    mp_stats_t s;
    mp_pool_get_stats(pools[i], &s);
    reserved += (double)s.peak_reserved_bytes;
    live += (double)s.peak_requested_bytes;
    mp_pool_destroy(pools[i]);
  }
  o->ratio = live > 0 ? reserved / live : 0;
  if (failed) {
    fprintf(stderr, "%s: an allocation failed: %s\n", mode_name[m],
            mp_last_error());
    return 0;
  }
  return (double)w[0].pairs * n / ((t1 - t0) * 1e-9);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of v[0..n) (n >= 1); sorts v. */
static double median(double *v, unsigned n) {
  qsort(v, n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Thread counts 1, 2, 4, ... up to maxt: how many. */
static unsigned thread_rows(unsigned maxt) {
  unsigned k = 0;
  for (unsigned n = 1; n <= maxt; n *= 2)
    k++;
  return k;
}

#define MAX_REPS 99

int main(int argc, char **argv) {
  uint64_t v[4];
  if (!micro_count(argc, argv, 1, 300000, 1, 100000000, "pairs", &v[0]) ||
      !micro_count(argc, argv, 2, 100, 1, 10000000, "live", &v[1]) ||
      !micro_count(argc, argv, 3, 8, 1, 64, "max threads", &v[2]) ||
      !micro_count(argc, argv, 4, 1, 1, MAX_REPS, "repeats", &v[3])) {
    fprintf(stderr,
            "usage: bench_pool_threads [pairs per thread] [live per "
            "thread] [max threads, 1 to 64] [repeats, 1 to %d]\n",
            MAX_REPS);
    return 2;
  }
  size_t pairs = (size_t)v[0], live = (size_t)v[1];
  unsigned maxt = (unsigned)v[2], reps = (unsigned)v[3];
  mp_device_t *dev;
  if (mp_device_open("host:capacity=64T", &dev) != MP_OK) {
    fprintf(stderr, "device: %s\n", mp_last_error());
    return 1;
  }
  worker_t *w = calloc(maxt, sizeof *w);
  if (w == NULL)
    return 1;
  uint64_t rng = 0x9E3779B97F4A7C15ull;
  for (unsigned t = 0; t < maxt; t++) {
    w[t].pairs = pairs;
    w[t].live = live;
    w[t].sizes = malloc(pairs * sizeof(size_t));
    w[t].victim = malloc(pairs * sizeof(uint32_t));
    w[t].init = malloc(live * sizeof(size_t));
    w[t].slots = calloc(live, sizeof(void *));
    if (w[t].sizes == NULL || w[t].victim == NULL || w[t].init == NULL ||
        w[t].slots == NULL) {
      fprintf(stderr, "%s: out of host memory for %u threads' plans\n", argv[0],
              maxt);
      return 1;
    }
    for (size_t i = 0; i < live; i++)
      w[t].init[i] = log_uniform(&rng);
    for (size_t i = 0; i < pairs; i++) {
      w[t].sizes[i] = log_uniform(&rng);
      w[t].victim[i] = (uint32_t)(xorshift64(&rng) % live);
    }
  }
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  printf("%zu pairs per thread, %zu live per thread, %ld cores", pairs, live,
         cores);
  if (reps > 1)
    printf(", %u repeats: medians", reps);
  printf("\n");
  printf("%-16s %7s %14s %9s %16s %11s %10s %15s %6s\n", "mode", "threads",
         "pairs/s", "speed-up", "reserved/live", "worst run", "first end",
         "range", "cores");
  /* rate[(m * rows + k) * reps + r]: mode m, 2^k threads, repeat r. */
  unsigned rows = thread_rows(maxt);
  double *rate = calloc((size_t)MODES * rows * reps, sizeof *rate);
  outcome_t *out = calloc((size_t)MODES * rows * reps, sizeof *out);
  bool skip[MODES] = {false};
#if !MEMPOOL_HAVE_JEMALLOC
  skip[JEMALLOC] = true;
#endif
  int rc = 0;
  for (unsigned r = 0; r < reps && rc == 0; r++)
    for (int i = 0; i < MODES && rc == 0; i++) {
      int m = r % 2 ? MODES - 1 - i : i;
      for (unsigned k = 0; k < rows && !skip[m]; k++) {
        size_t at = ((size_t)m * rows + k) * reps + r;
        rate[at] = run(dev, (enum mode)m, w, 1u << k, &out[at]);
        if (rate[at] == 0) {
          rc = 1;
          break;
        }
      }
    }
  for (int m = 0; m < MODES && rc == 0; m++) {
    if (skip[m])
      continue;
    for (unsigned k = 0; k < rows; k++) {
      double rates[MAX_REPS], ups[MAX_REPS], got[MAX_REPS],
          ratio = 0, worst = 0, first = 1;
      for (unsigned r = 0; r < reps; r++) {
        size_t at = ((size_t)m * rows + k) * reps + r;
        rates[r] = rate[at];
        got[r] = out[at].cores;
        ups[r] = rate[at] / rate[(size_t)m * rows * reps + r];
        ratio = out[at].ratio > ratio ? out[at].ratio : ratio;
        worst = out[at].worst_us > worst ? out[at].worst_us : worst;
        first = out[at].first_done < first ? out[at].first_done : first;
      }
      double up = median(ups, reps); /* sorts ups: [0] lowest, last highest */
      printf("%-16s %7u %14.0f %8.2fx", mode_name[m], 1u << k,
             median(rates, reps), up);
      if (m != JEMALLOC)
        printf(" %16.3f", ratio);
      else
        printf(" %16s", "");
      printf(" %8.0f us %10.2f", worst, first);
      if (reps > 1)
        printf("   %5.2fx-%5.2fx", ups[0], ups[reps - 1]);
      else
        printf(" %15s", "-");
      printf(" %6.2f\n", median(got, reps));
    }
  }
  free(rate);
  free(out);
  for (unsigned t = 0; t < maxt; t++) {
    free(w[t].sizes);
    free(w[t].victim);
    free(w[t].init);
    free(w[t].slots);
  }
  free(w);
  mp_device_close(dev);
  return rc;
}
