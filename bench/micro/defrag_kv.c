/* defrag_kv.c - what defragmentation buys an LLM decode loop.
 *
 * The workload: `seqs` sequences decode side by side. Each keeps its KV
 * cache in one movable block that grows by concatenation: when the next
 * token does not fit, a bigger movable block is allocated, the old cache is
 * copied into it on the stream and the old block is freed. Every step also
 * allocates and frees raw-pointer temporaries (activations). Sequences end
 * at random lengths and new ones start, so the pool fragments the way a
 * serving engine's does.
 *
 * The loop runs twice on fresh pools with the same random workload. In the
 * first run it stops every `every` steps and defragments on its stream; for
 * each stop it prints the largest free block and the free bytes before and
 * after, the bytes moved and the time until the copies were complete. Each
 * run then prints its peak reserved bytes, the largest free block at the
 * end and what trim gives back; the second run never defragments. Last,
 * the total bytes moved and the time per moved GiB.
 *
 * Usage: bench_defrag_kv [--device SPEC] [--seqs N] [--steps N]
 *          [--token-bytes SIZE] [--every N] [--seed N]
 * Defaults: host:capacity=8G, 32 sequences, 2000 steps, 8 KiB per token,
 * every 250 steps. --seqs is refused (exit 2) when the first step's caches,
 * one per sequence, do not fit in the device's free memory. */
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mempool/mempool.h>

#include "../core/xorshift.h"
#include "internal.h" /* mp__parse_size, mp__fmt_bytes, MP__GiB */

/* A sequence ends at 64 to this many tokens, so its cache (grown 16 tokens
 * at a time) holds at most this many: token bytes times it must be a size
 * (a larger --token-bytes wrapped: 2^60 + 1 bytes a token ran caches of
 * 16 bytes a page, and 2^60 of 0 bytes, and printed their figures). */
#define MAX_TOKENS 1024
/* The first cache of a sequence: one page of 16 tokens. No sequence ends
 * before 64 tokens, so the first step holds one such cache per sequence at
 * once, each rounded up to the pool's blocks (mp_pool_create with no
 * config: 512 bytes, mempool/pool.h), beside the step's 4 temporaries of
 * at least 64 KiB. */
#define PAGE_TOKENS 16
#define POOL_ALIGN  512
#define TMP_MIN     (64 << 10)

typedef struct seq {
  mp_handle_t *kv;
  size_t tokens, cap_tokens, end_tokens;
} seq_t;

typedef struct opts {
  const char *device;
  unsigned seqs, steps, every;
  size_t token_bytes;
  uint64_t seed;
} opts_t;

static uint64_t rng_state;
static uint64_t rnd(void) {
  return xorshift64(&rng_state);
}
static size_t rnd_between(size_t lo, size_t hi) {
  return lo + (size_t)(rnd() % (hi - lo + 1));
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *what, mp_status_t st) {
  fprintf(stderr, "bench_defrag_kv: %s: %s (%s)\n", what, mp_status_name(st),
          mp_last_error());
  exit(1);
}

static void parse(int argc, char **argv, opts_t *o) {
  *o = (opts_t){"host:capacity=8G", 32, 2000, 250, 8 * 1024, 42};
  /* An option with no value after it was dropped without a word. */
  if (argc % 2 == 0) {
    fprintf(stderr, "bench_defrag_kv: %s needs a value\n", argv[argc - 1]);
    exit(2);
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    const char *k = argv[i], *v = argv[i + 1];
    size_t n;
    bool count = strcmp(k, "--seqs") == 0 || strcmp(k, "--steps") == 0 ||
                 strcmp(k, "--every") == 0;
    if (strcmp(k, "--device") == 0)
      o->device = v;
    else if (!mp__parse_size(v, strlen(v), &n) || n == 0 ||
             (count && n > UINT_MAX) || /* cut to 32 bits, it ran another */
             (strcmp(k, "--token-bytes") == 0 && n > SIZE_MAX / MAX_TOKENS))
      goto bad;
    else if (strcmp(k, "--seqs") == 0)
      o->seqs = (unsigned)n;
    else if (strcmp(k, "--steps") == 0)
      o->steps = (unsigned)n;
    else if (strcmp(k, "--every") == 0)
      o->every = (unsigned)n;
    else if (strcmp(k, "--token-bytes") == 0)
      o->token_bytes = n;
    else if (strcmp(k, "--seed") == 0)
      o->seed = n;
    else
      goto bad;
    continue;
  bad:
    fprintf(stderr, "bench_defrag_kv: bad option %s %s\n", k, v);
    exit(2);
  }
}

/* Grows s's cache to hold one more token, by concatenation. */
static void grow(mp_pool_t *pool, mp_device_t *dev, mp_stream_t st, seq_t *s,
                 size_t token_bytes) {
  if (s->tokens < s->cap_tokens)
    return;
  size_t cap = s->cap_tokens + PAGE_TOKENS; /* one page more */
  mp_handle_t *n;
  mp_status_t r = mp_pool_alloc_movable(pool, cap * token_bytes, st, &n);
  if (r != MP_OK)
    die("grow KV cache", r);
  if (s->kv != NULL) {
    r = mp_memcpy_async(dev, mp_handle_ptr(n), mp_handle_ptr(s->kv),
                        s->tokens * token_bytes, st);
    if (r != MP_OK)
      die("copy KV cache", r);
    if ((r = mp_handle_free(s->kv)) != MP_OK)
      die("free KV cache", r);
  }
  s->kv = n;
  s->cap_tokens = cap;
}

static void start(seq_t *s) {
  s->kv = NULL;
  s->tokens = s->cap_tokens = 0;
  s->end_tokens = rnd_between(64, MAX_TOKENS);
}

typedef struct totals {
  size_t moved;
  double seconds;
  unsigned runs;
} totals_t;

static void stop_and_defragment(mp_pool_t *pool, mp_device_t *dev,
                                mp_stream_t st, unsigned step, totals_t *t) {
  mp_stats_t a, b;
  mp_status_t r;
  if ((r = mp_stream_synchronize(dev, st)) != MP_OK)
    die("sync", r);
  mp_pool_get_stats(pool, &a);
  size_t moved = 0;
  double t0 = now_s();
  if ((r = mp_pool_defragment(pool, st, &moved)) != MP_OK)
    die("defragment", r);
  if ((r = mp_stream_synchronize(dev, st)) != MP_OK)
    die("sync", r);
  double dt = now_s() - t0;
  mp_pool_get_stats(pool, &b);
  if ((r = mp_pool_check(pool)) != MP_OK)
    die("check", r);
  char x[5][32];
  printf("step %5u  largest free %10s -> %10s  free %10s -> %10s  moved "
         "%10s in %8.3f ms\n",
         step, mp__fmt_bytes(x[0], 32, a.largest_free_bytes),
         mp__fmt_bytes(x[1], 32, b.largest_free_bytes),
         mp__fmt_bytes(x[2], 32, a.free_bytes),
         mp__fmt_bytes(x[3], 32, b.free_bytes), mp__fmt_bytes(x[4], 32, moved),
         dt * 1e3);
  t->moved += moved;
  t->seconds += dt;
  t->runs++;
}

/* Runs the decode loop on a fresh pool; with defrag, stops every o->every
 * steps and at the end to defragment. Returns the pool's last stats. */
static mp_stats_t run(const opts_t *o, mp_device_t *dev, bool defrag,
                      totals_t *t) {
  rng_state = o->seed * 2654435761u + 1; /* the same workload each run */
  mp_pool_t *pool;
  mp_stream_t st;
  mp_status_t r;
  if ((r = mp_pool_create(dev, NULL, &pool)) != MP_OK)
    die("create pool", r);
  if ((r = mp_stream_create(dev, &st)) != MP_OK)
    die("create stream", r);
  seq_t *seqs = calloc(o->seqs, sizeof *seqs);
  if (seqs == NULL) {
    fprintf(stderr, "bench_defrag_kv: no host memory for %u sequences\n",
            o->seqs);
    exit(1);
  }
  for (unsigned i = 0; i < o->seqs; i++)
    start(&seqs[i]);
  void *tmp[4];
  for (unsigned step = 1; step <= o->steps; step++) {
    for (unsigned k = 0; k < 4; k++)
      if ((r = mp_pool_alloc(pool, rnd_between(TMP_MIN, 2 << 20), st,
                             &tmp[k])) != MP_OK)
        die("temporary", r);
    for (unsigned i = 0; i < o->seqs; i++) {
      seq_t *s = &seqs[i];
      grow(pool, dev, st, s, o->token_bytes);
      s->tokens++;
      if (s->tokens == s->end_tokens) {
        if ((r = mp_handle_free(s->kv)) != MP_OK)
          die("end sequence", r);
        start(s);
      }
    }
    for (unsigned k = 0; k < 4; k++)
      mp_pool_free(pool, tmp[k]);
    if (defrag && step % o->every == 0)
      stop_and_defragment(pool, dev, st, step, t);
  }
  if (defrag)
    stop_and_defragment(pool, dev, st, o->steps, t);
  mp_stats_t a, b;
  mp_pool_get_stats(pool, &a);
  if ((r = mp_pool_trim(pool, 0)) != MP_OK)
    die("trim", r);
  mp_pool_get_stats(pool, &b);
  char x[6][32];
  printf("%s defragmentation: peak reserved %s; at the end largest free %s "
         "of %s free; trim: reserved %s -> %s (live %s)\n",
         defrag ? "with   " : "without",
         mp__fmt_bytes(x[0], 32, b.peak_reserved_bytes),
         mp__fmt_bytes(x[1], 32, a.largest_free_bytes),
         mp__fmt_bytes(x[2], 32, a.free_bytes),
         mp__fmt_bytes(x[3], 32, a.reserved_bytes),
         mp__fmt_bytes(x[4], 32, b.reserved_bytes),
         mp__fmt_bytes(x[5], 32, b.allocated_bytes));
  for (unsigned i = 0; i < o->seqs; i++)
    if (seqs[i].kv != NULL)
      mp_handle_free(seqs[i].kv);
  free(seqs);
  mp_stream_destroy(dev, st);
  mp_pool_destroy(pool);
  return b;
}

/* Refuses (exit 2) a plan whose first step cannot fit in what dev has
 * free: --seqs 4000000000 was taken, and the run spent minutes setting up
 * 128 GB of sequences on the host before its first allocation. */
static void check_fits(const opts_t *o, mp_device_t *dev) {
  size_t free_b, total_b;
  mp_status_t r = mp_device_mem_info(dev, &free_b, &total_b);
  if (r != MP_OK)
    die("device memory", r);
  /* token_bytes <= SIZE_MAX / MAX_TOKENS (parse): no wrap here. */
  size_t first = (PAGE_TOKENS * o->token_bytes + POOL_ALIGN - 1) &
                 ~(size_t)(POOL_ALIGN - 1);
  size_t room = free_b > 4 * TMP_MIN ? free_b - 4 * TMP_MIN : 0;
  if (o->seqs <= room / first)
    return;
  char x[2][32];
  fprintf(stderr,
          "bench_defrag_kv: --seqs %u does not fit: the first step holds "
          "one %s cache (%d tokens of %zu bytes) per sequence at once, and "
          "device %s has %s free; at most %zu sequences of this size\n",
          o->seqs, mp__fmt_bytes(x[0], 32, first), PAGE_TOKENS, o->token_bytes,
          mp_device_name(dev), mp__fmt_bytes(x[1], 32, free_b), room / first);
  mp_device_close(dev);
  exit(2);
}

int main(int argc, char **argv) {
  opts_t o;
  parse(argc, argv, &o);
  mp_device_t *dev;
  mp_status_t r;
  if ((r = mp_device_open(o.device, &dev)) != MP_OK)
    die("open device", r);
  check_fits(&o, dev);
  printf("bench_defrag_kv: device %s, %u sequences, %u steps, %zu B/token, "
         "defragment every %u steps\n",
         mp_device_name(dev), o.seqs, o.steps, o.token_bytes, o.every);
  totals_t t = {0};
  run(&o, dev, true, &t);
  run(&o, dev, false, &t);
  char x[32];
  double gib = (double)t.moved / (double)MP__GiB;
  printf("total: %u defragmentations moved %s in %.3f ms: %.3f s per moved "
         "GiB (%.2f GiB/s)\n",
         t.runs, mp__fmt_bytes(x, 32, t.moved), t.seconds * 1e3,
         gib > 0 ? t.seconds / gib : 0.0, t.seconds > 0 ? gib / t.seconds : 0);
  mp_device_close(dev);
  return 0;
}
