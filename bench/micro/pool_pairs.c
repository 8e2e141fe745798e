/* pool_pairs - steady-state cost of one free + alloc pair in the best-fit
 * pool, with 100 and with 10 000 live blocks, next to a jemalloc arena on the
 * same sizes in the same run.
 *
 * Sizes are log-uniform in [512 B, 16 MiB]. The live set is filled first,
 * then a warm-up of the same length as the timed phase runs, then the timed
 * phase: free a random live block, allocate a new random size in its place.
 * Sizes and victims are drawn before timing, so only the pair is measured.
 * The device is the host backend with a large capacity (pages are never
 * touched, so nothing is committed). Also printed: device allocations made
 * during the timed phase (0 once a repeating workload is warm).
 *
 *   bench_pool_pairs [pairs=2000000] [device spec, default
 *                    "host:capacity=64T"] [pool|jemalloc: run only that,
 *                    or history, or remote]
 *
 * Mode "history" (third argument) runs the pool alone, side by side with its
 * event history off, on (history=65536) and on with stacks
 * (history_stacks=1): the cost of recording per pair (3 events a pair).
 *
 * Mode "remote" runs no pairs: it measures a free of another thread's
 * block. Thread A allocates PAIRS blocks, then thread B, which allocated a
 * block first and so has an arena of its own, frees them in A's order;
 * twice, and only B's frees of the second round are timed and counted
 * (dumped as "ALLOCATOR PAIRS"): ns and instructions per free. The pool has
 * its config ($MEMPOOL_CONF) with arenas=2 where that has fewer, so every
 * free misses B's arena's live map and is forwarded to A's arena; the
 * jemalloc arena's blocks are freed without a thread cache, as its pairs
 * are. Sizes are uniform in [4 KiB, 7 KiB], not the pairs' log-uniform
 * ones: 100 000 of those would be about 150 GiB, past the ranges two arenas
 * can reserve under valgrind (about 60 GiB in all). The pool's figure
 * (count_pairs.sh build-release 100000: 100 000 frees) was 273.5
 * instructions a free at ae42207 and is 386.5 at eac33d1, the forward from
 * the miss (468e13e) in between; the jemalloc arena's about 925 in both.
 * 190 to 350 ns a free in both builds: too noisy on a shared 2-core machine
 * to tell them apart.
 *
 * Instructions per pair: run under callgrind with --instr-atstart=no
 * (bench/micro/count_pairs.sh does it and prints them beside ns): each
 * timed phase, and only that, is instrumented and dumped as "ALLOCATOR
 * LIVE", so the count is the pairs' own, without set-up or the plan. */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mempool/mempool.h>

#include "args.h"
#include "pairs_plan.h"
#include "pairs_rows.h"

#if MEMPOOL_HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

/* Whether pool's segments are its virtual range (mp_pool_dump's text names
 * each segment's kind): a pool whose range could not be reserved (under
 * valgrind, a range over about 60 GiB) falls back to plain segments, a
 * different path (count_pairs.sh refuses such a count). */
static bool uses_virtual_range(mp_pool_t *pool) {
  char *text = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&text, &n);
  if (f == NULL)
    return false;
  bool ok = mp_pool_dump(pool, f, "text") == MP_OK;
  fclose(f);
  ok = ok && text != NULL && strstr(text, " virtual size ") != NULL &&
       strstr(text, " plain size ") == NULL;
  free(text);
  return ok;
}

static int run_pool(mp_device_t *dev, const plan_t *p, const char *opts,
                    result_t *r) {
  mp_pool_t *pool;
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  if ((opts[0] != '\0' && mp_pool_config_parse(&cfg, opts) != MP_OK) ||
      mp_pool_create(dev, &cfg, &pool) != MP_OK) {
    fprintf(stderr, "pool: %s\n", mp_last_error());
    return 1;
  }
  void **live = malloc(p->live * sizeof(void *));
  for (size_t i = 0; i < p->live; i++)
    if (mp_pool_alloc(pool, p->init[i], NULL, &live[i]) != MP_OK) {
      fprintf(stderr, "pool: %s\n", mp_last_error());
      return 1;
    }
  /* Warm-up and timed phase run the same sequence: a repeating workload. */
  mp_stats_t s0, s1;
  double t0 = 0;
  for (int phase = 0; phase < 2; phase++) {
    if (phase == 1) {
      mp_pool_get_stats(pool, &s0);
      count_begin();
      t0 = now_ns();
    }
    for (size_t i = 0; i < p->pairs; i++) {
      uint32_t v = p->victim[i];
      mp_pool_free(pool, live[v]);
      if (mp_pool_alloc(pool, p->sizes[i], NULL, &live[v]) != MP_OK) {
        fprintf(stderr, "pool: %s\n", mp_last_error());
        return 1;
      }
    }
  }
  double t1 = now_ns();
  count_end(opts[0] != '\0' ? opts : "pool", p->live);
  mp_pool_get_stats(pool, &s1);
  pairs_result(r, &s0, &s1, t1 - t0, p->pairs);
  r->virtual_range = uses_virtual_range(pool);
  if (mp_pool_check(pool) != MP_OK)
    fprintf(stderr, "pool check: %s\n", mp_last_error());
  mp_pool_destroy(pool);
  free(live);
  return 0;
}

#if MEMPOOL_HAVE_JEMALLOC
static int run_jemalloc(const plan_t *p, result_t *r) {
  unsigned arena;
  size_t sz = sizeof arena;
  if (mallctl("arenas.create", &arena, &sz, NULL, 0) != 0) {
    fprintf(stderr, "jemalloc: arenas.create failed\n");
    return 1;
  }
  int flags = (int)MALLOCX_ARENA(arena) | MALLOCX_TCACHE_NONE;
  void **live = malloc(p->live * sizeof(void *));
  for (size_t i = 0; i < p->live; i++)
    live[i] = mallocx(p->init[i], flags);
  double t0 = 0;
  for (int phase = 0; phase < 2; phase++) {
    if (phase == 1) {
      count_begin();
      t0 = now_ns();
    }
    for (size_t i = 0; i < p->pairs; i++) {
      uint32_t v = p->victim[i];
      dallocx(live[v], flags);
      live[v] = mallocx(p->sizes[i], flags);
      if (live[v] == NULL) {
        fprintf(stderr, "jemalloc: out of memory\n");
        return 1;
      }
    }
  }
  r->ns_per_pair = (now_ns() - t0) / (double)p->pairs;
  count_end("jemalloc", p->live);
  for (size_t i = 0; i < p->live; i++)
    dallocx(live[i], flags);
  free(live);
  return 0;
}
#endif

/* Remote frees (mode "remote"): thread A allocates every block, then the
 * calling thread B, which holds a block of its own (and so, with arenas,
 * an arena of its own), frees them all. A round is A's allocations, then
 * B's frees in A's order; the second round, and only B's frees in it, is
 * timed and counted (the first warms A's arena up, so the second grows
 * nothing). pool is NULL for the jemalloc arena. */
typedef struct remote {
  mp_pool_t *pool;
  unsigned je_arena;
  const size_t *sizes;
  void **blocks;
  size_t n;
  pthread_barrier_t turn;
  int failed;
} remote_t;

static void *remote_owner(void *arg) {
  remote_t *r = arg;
  for (int round = 0; round < 2 && !r->failed; round++) {
    for (size_t i = 0; i < r->n; i++) {
#if MEMPOOL_HAVE_JEMALLOC
      if (r->pool == NULL) {
        int flags = (int)MALLOCX_ARENA(r->je_arena) | MALLOCX_TCACHE_NONE;
        if ((r->blocks[i] = mallocx(r->sizes[i], flags)) != NULL)
          continue;
        fprintf(stderr, "jemalloc: out of memory\n");
        r->failed = 1;
        break;
      }
#endif
      if (mp_pool_alloc(r->pool, r->sizes[i], NULL, &r->blocks[i]) != MP_OK) {
        fprintf(stderr, "pool: %s\n", mp_last_error());
        r->failed = 1;
        break;
      }
    }
    pthread_barrier_wait(&r->turn); /* B's frees */
    pthread_barrier_wait(&r->turn); /* done */
  }
  return NULL;
}

/* B's side of remote_owner's rounds: ns per free of the timed round into
 * r->ns_per_pair, the device frees it made into r->device_frees. */
static int run_remote(remote_t *x, result_t *r) {
  pthread_t a;
  pthread_barrier_init(&x->turn, NULL, 2);
  if (pthread_create(&a, NULL, remote_owner, x) != 0) {
    fprintf(stderr, "remote: no thread\n");
    return 1;
  }
  mp_stats_t s0 = {0}, s1 = {0};
  double t0 = 0, t1 = 0;
  size_t errors = 0;
  for (int round = 0; round < 2; round++) {
    pthread_barrier_wait(&x->turn);
    if (x->failed) {
      pthread_barrier_wait(&x->turn);
      break;
    }
    if (round == 1) {
      if (x->pool != NULL)
        mp_pool_get_stats(x->pool, &s0);
      count_begin();
      t0 = now_ns();
    }
    for (size_t i = 0; i < x->n; i++) {
#if MEMPOOL_HAVE_JEMALLOC
      if (x->pool == NULL) {
        dallocx(x->blocks[i], MALLOCX_TCACHE_NONE);
        continue;
      }
#endif
      errors += mp_pool_free(x->pool, x->blocks[i]) != MP_OK;
    }
    if (round == 1) {
      t1 = now_ns();
      count_end(x->pool != NULL ? "pool" : "jemalloc", x->n);
      if (x->pool != NULL)
        mp_pool_get_stats(x->pool, &s1);
    }
    pthread_barrier_wait(&x->turn);
  }
  pthread_join(a, NULL);
  pthread_barrier_destroy(&x->turn);
  if (errors != 0)
    fprintf(stderr, "remote: %zu frees failed\n", errors);
  r->ns_per_pair = (t1 - t0) / (double)x->n;
  r->device_frees = s1.device_free_count - s0.device_free_count;
  return x->failed || errors != 0;
}

/* The remote rows: the pool (its config, with arenas=2 where it has fewer
 * than 2) and the jemalloc arena, on blocks of 4 to 7 KiB. */
static int remote_rows(mp_device_t *dev, size_t n) {
  size_t *sizes = malloc(n * sizeof(size_t));
  void **blocks = malloc(n * sizeof(void *));
  if (sizes == NULL || blocks == NULL) {
    fprintf(stderr, "remote: out of host memory for %zu blocks\n", n);
    return 1;
  }
  for (size_t i = 0; i < n; i++)
    sizes[i] = 4096 + (size_t)(next_u64() % 3073);
  printf("remote frees: thread A allocates %zu blocks of 4-7 KiB, thread B "
         "(a block and an arena of its own) frees them, device %s\n",
         n, mp_device_name(dev));
  printf("%-10s %-10s %8s %12s %12s %8s %8s\n", "remote", "allocator", "blocks",
         "ns/free", "dev frees", "range", "arenas");
  int rc = 0;
  result_t r = {0};
  {
    mp_pool_config_t cfg;
    mp_pool_t *pool = NULL;
    void *own;
    mp_pool_config_init(&cfg);
    if ((cfg.arenas < 2 && mp_pool_config_parse(&cfg, "arenas=2") != MP_OK) ||
        mp_pool_create(dev, &cfg, &pool) != MP_OK ||
        mp_pool_alloc(pool, 4096, NULL, &own) != MP_OK) {
      fprintf(stderr, "pool: %s\n", mp_last_error());
      if (pool != NULL)
        mp_pool_destroy(pool);
      free(sizes);
      free(blocks);
      return 1;
    }
    remote_t x = {.pool = pool, .sizes = sizes, .blocks = blocks, .n = n};
    rc = run_remote(&x, &r);
    if (rc == 0)
      printf("%-10s %-10s %8zu %12.1f %12llu %8s %8zu\n", "remote", "pool", n,
             r.ns_per_pair, r.device_frees,
             uses_virtual_range(pool) ? "virtual" : "plain", cfg.arenas);
    mp_pool_free(pool, own);
    if (mp_pool_check(pool) != MP_OK)
      fprintf(stderr, "pool check: %s\n", mp_last_error());
    mp_pool_destroy(pool);
  }
#if MEMPOOL_HAVE_JEMALLOC
  unsigned arena;
  size_t sz = sizeof arena;
  if (rc == 0 && mallctl("arenas.create", &arena, &sz, NULL, 0) != 0) {
    fprintf(stderr, "jemalloc: arenas.create failed\n");
    rc = 1;
  } else if (rc == 0) {
    remote_t x = {.je_arena = arena, .sizes = sizes, .blocks = blocks, .n = n};
    rc = run_remote(&x, &r);
    if (rc == 0)
      printf("%-10s %-10s %8zu %12.1f %12s %8s %8s\n", "remote", "jemalloc", n,
             r.ns_per_pair, "-", "-", "-");
  }
#endif
  free(sizes);
  free(blocks);
  return rc;
}

int main(int argc, char **argv) {
  size_t pairs;
  if (!pairs_count(argc, argv, &pairs))
    return 2;
  const char *spec = argc > 2 ? argv[2] : "host:capacity=64T";
  const char *only = argc > 3 ? argv[3] : "";
  /* Another word ran every allocator, as if none was given. */
  if (strcmp(only, "") != 0 && strcmp(only, "pool") != 0 &&
      strcmp(only, "jemalloc") != 0 && strcmp(only, "history") != 0 &&
      strcmp(only, "remote") != 0) {
    fprintf(stderr,
            "%s: unknown mode '%s' (pool, jemalloc, history or remote)\n",
            argv[0], only);
    return 2;
  }
  bool history = strcmp(only, "history") == 0;
  bool do_pool = strcmp(only, "jemalloc") != 0;
  bool do_je = strcmp(only, "pool") != 0 && !history;
  mp_device_t *dev = pairs_device(spec);
  if (dev == NULL)
    return 1;
  if (strcmp(only, "remote") == 0) {
    int rc = remote_rows(dev, pairs);
    mp_device_close(dev);
    return rc;
  }
  printf("free+alloc pairs, sizes log-uniform 512 B .. 16 MiB, %zu pairs, "
         "device %s\n",
         pairs, mp_device_name(dev));
  printf("%-10s %8s %12s %12s %12s %14s %12s %8s\n", "allocator", "live",
         "ns/pair", "dev allocs", "dev frees", "peak res/req", "free blocks",
         "range");
  size_t lives[2] = {100, 10000};
  double pool_ns[2] = {0, 0};
  for (int k = 0; k < 2; k++) {
    plan_t p = make_plan(lives[k], pairs);
    if (p.sizes == NULL) {
      fprintf(stderr, "%s: out of host memory for %zu pairs\n", argv[0], pairs);
      return 1;
    }
    result_t r = {0};
    if (history) {
      const char *modes[] = {"", "history=65536",
                             "history=65536,history_stacks=1"};
      for (int m = 0; m < 3; m++) {
        if (run_pool(dev, &p, modes[m], &r) != 0)
          return 1;
        printf("%-10s %8zu %12.1f  %s\n", "pool", lives[k], r.ns_per_pair,
               m ? modes[m] : "history off");
      }
      do_pool = false;
    }
    if (do_pool && run_pool(dev, &p, "", &r) != 0)
      return 1;
    pool_ns[k] = r.ns_per_pair;
    if (do_pool) {
      pairs_row("pool", lives[k], &r);
      printf(" %8s\n", r.virtual_range ? "virtual" : "plain");
    }
#if MEMPOOL_HAVE_JEMALLOC
    result_t j = {0};
    if (do_je && run_jemalloc(&p, &j) != 0)
      return 1;
    if (do_je)
      printf("%-10s %8zu %12.1f %12s %12s %14s %12s\n", "jemalloc", lives[k],
             j.ns_per_pair, "-", "-", "-", "-");
#endif
    plan_free(&p);
  }
  if (!history)
    printf("pool: 10000-live / 100-live cost = %.2fx\n",
           pool_ns[1] / pool_ns[0]);
  mp_device_close(dev);
  return 0;
}
