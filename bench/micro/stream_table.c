/* stream_table - what a pool's stream table costs (issue 16 item 14).
 *
 * 1. ns per allocation on a stream the pool has not seen, as the number of
 *    streams the pool has met grows: each step creates a stream, allocates
 *    4 KiB on it (the timed call: the pool meets the stream), frees it and
 *    destroys the stream. Reported: median and mean of the 500 steps before
 *    each checkpoint (1 000, 10 000, 50 000 streams by default) and the
 *    timed free of the same steps. A flat row means the table's cost does
 *    not grow with the streams the pool has met and forgotten.
 * 2. mpbench's replay of a generated trace with 4 096 streams (one
 *    allocate and one free per stream, 8 192 rows): parse and replay wall
 *    time through mpbench's "pool" (mempool, default options), no capacity
 *    search. At most the default stream and MPB_MAX_TRACE_STREAMS others,
 *    as many as mpbench replays (the default was 30 000, which mpbench's
 *    loader refuses: exit 1 after parts 1 and 3 had run).
 *
 * 3. The same as 1 with every stream kept live, so the pool's table holds
 *    them all: 1 000, 10 000 and 20 000 live streams by default (on the host
 *    device each is a thread, and the machine's pid_max is often 32 768).
 *
 *   bench_stream_table [max streams=50000] [device spec, default
 *                      "host:capacity=64G"] [replay streams=4096, at most
 *                      4097]
 *                      [live streams=20000]
 *
 * On the host device a stream is a worker thread: creating and destroying
 * one is outside the timed calls, but makes the run take seconds. The host
 * device may give a new stream a destroyed one's handle (the count of
 * distinct values is printed); the pool forgot the old stream at its
 * destroy, so to the pool each one is new. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mempool/mempool.h>

#include "args.h"
#include "mpbench.h"

#define WINDOW 500

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
  return (x > y) - (x < y);
}

/* Median and mean of v[0, n) (sorts v). */
static void summary(double *v, size_t n, double *median, double *mean) {
  double sum = 0;
  for (size_t i = 0; i < n; i++)
    sum += v[i];
  qsort(v, n, sizeof *v, cmp_double);
  *median = v[n / 2];
  *mean = sum / (double)n;
}

static int die(const char *what) {
  fprintf(stderr, "bench_stream_table: %s: %s\n", what, mp_last_error());
  return 1;
}

/* keep: every stream stays live until the end (the pool's table holds them
 * all), instead of being destroyed after its step. */
static int new_streams(mp_device_t *dev, size_t max, bool keep) {
  mp_pool_t *p;
  if (mp_pool_create(dev, NULL, &p) != MP_OK)
    return die("mp_pool_create");
  double *alloc_ns = malloc(max * sizeof *alloc_ns);
  double *free_ns = malloc(max * sizeof *free_ns);
  uintptr_t *handle = malloc(max * sizeof *handle);
  mp_stream_t *live = keep ? malloc(max * sizeof *live) : NULL;
  if (alloc_ns == NULL || free_ns == NULL || handle == NULL ||
      (keep && live == NULL))
    return die("out of host memory");
  double t_start = now_ns();
  for (size_t i = 0; i < max; i++) {
    mp_stream_t s;
    void *a;
    if (mp_stream_create(dev, &s) != MP_OK)
      return die("mp_stream_create");
    double t0 = now_ns();
    mp_status_t st = mp_pool_alloc(p, 4096, s, &a);
    double t1 = now_ns();
    if (st != MP_OK)
      return die("mp_pool_alloc");
    st = mp_pool_free(p, a);
    double t2 = now_ns();
    if (st != MP_OK)
      return die("mp_pool_free");
    if (keep)
      live[i] = s;
    else if (mp_stream_destroy(dev, s) != MP_OK)
      return die("mp_stream_destroy");
    alloc_ns[i] = t1 - t0;
    free_ns[i] = t2 - t1;
    handle[i] = (uintptr_t)s;
  }
  double total_s = (now_ns() - t_start) / 1e9;
  qsort(handle, max, sizeof *handle, cmp_ptr);
  size_t distinct = max ? 1 : 0;
  for (size_t i = 1; i < max; i++)
    distinct += handle[i] != handle[i - 1];
  printf("## allocation on a new stream (%s)\n\n",
         keep ? "created and kept live" : "created, used once, destroyed");
  printf("| streams met | alloc ns (median) | alloc ns (mean) | free ns "
         "(median) | free ns (mean) |\n|---:|---:|---:|---:|---:|\n");
  const size_t marks[] = {1000, 10000, 50000, 0};
  for (const size_t *m = marks; *m != 0; m++) {
    size_t at = *m <= max ? *m : max;
    size_t from = at > WINDOW ? at - WINDOW : 0;
    double am, aa, fm, fa;
    summary(alloc_ns + from, at - from, &am, &aa);
    summary(free_ns + from, at - from, &fm, &fa);
    printf("| %zu | %.0f | %.0f | %.0f | %.0f |\n", at, am, aa, fm, fa);
    if (at == max)
      break;
  }
  printf("\n%zu streams in %.2f s (stream create%s included); %zu distinct "
         "handle values (the device may reuse a destroyed stream's)\n\n",
         max, total_s, keep ? "" : "/destroy", distinct);
  mp_stats_t ps;
  if (mp_pool_get_stats(p, &ps) == MP_OK)
    printf("pool after: reserved %zu bytes, %llu allocations\n\n",
           ps.reserved_bytes, (unsigned long long)ps.alloc_count);
  mp_pool_destroy(p);
  for (size_t i = 0; keep && i < max; i++)
    mp_stream_destroy(dev, live[i]);
  free(live);
  free(alloc_ns);
  free(free_ns);
  free(handle);
  return 0;
}

/* One allocate and one free per stream: 2 * nstreams rows. */
static char *make_trace(size_t nstreams, size_t *len) {
  static const char header[] = "Thread,Time,Action,Pointer,Size,Stream\n";
  size_t cap = sizeof header + nstreams * 2 * 80;
  char *t = malloc(cap);
  if (t == NULL)
    return NULL;
  size_t n = (size_t)snprintf(t, cap, "%s", header);
  for (size_t i = 0; i < nstreams; i++) {
    unsigned long long ptr = 0x7f0000000000ull + i * 0x100000ull;
    unsigned long long stream = i == 0 ? 0 : 0x5500000000ull + i * 0x100;
    size_t size = 4096 + (i % 64) * 4096;
    for (int f = 0; f < 2; f++)
      n += (size_t)snprintf(t + n, cap - n,
                            "1,12:00:%02zu.%06zu,%s,0x%llx,%zu,0x%llx\n",
                            (i / 1000000) % 60, i % 1000000,
                            f ? "free" : "allocate", ptr, size, stream);
  }
  *len = n;
  return t;
}

static int replay_streams(const char *spec, size_t nstreams) {
  size_t len;
  char *text = make_trace(nstreams, &len);
  if (text == NULL)
    return die("out of host memory");
  double t0 = now_ns();
  mpb_workload_t w;
  if (mpb_trace_parse(text, len, "generated", "streams", &w) != MP_OK)
    return die("mpb_trace_parse");
  double t1 = now_ns();
  mpb_replay_opts_t o = {.device_spec = spec};
  mpb_result_t *r = calloc(1, sizeof *r);
  if (r == NULL)
    return die("out of host memory");
  if (mpb_replay(&w, "pool", &o, r) != MP_OK)
    return die("mpb_replay");
  double t2 = now_ns();
  printf("## replay of %zu streams (%llu rows)\n\n", nstreams,
         (unsigned long long)(2 * nstreams));
  printf("parse %.2f s, replay %.2f s (streams created, events replayed, "
         "device synchronized after each free), completed: %s%s%s\n",
         (t1 - t0) / 1e9, (t2 - t1) / 1e9, r->completed ? "yes" : "no",
         r->completed ? "" : ": ", r->completed ? "" : r->error);
  free(r);
  mpb_workload_free(&w);
  free(text);
  return 0;
}

int main(int argc, char **argv) {
  uint64_t max, nreplay, nlive;
  const char *spec = argc > 2 ? argv[2] : "host:capacity=64G";
  if (!micro_count(argc, argv, 1, 50000, 1, 100000000, "max streams", &max) ||
      !micro_count(argc, argv, 3, MPB_MAX_TRACE_STREAMS, 1,
                   MPB_MAX_TRACE_STREAMS + 1, "replay streams", &nreplay) ||
      !micro_count(argc, argv, 4, 20000, 1, 100000000, "live streams",
                   &nlive)) {
    fprintf(stderr, "usage: bench_stream_table [max streams] [device spec] "
                    "[replay streams] [live streams]\n");
    return 2;
  }
  mp_device_t *dev;
  if (mp_device_open(spec, &dev) != MP_OK)
    return die(spec);
  printf("device %s\n\n", spec);
  int rc = new_streams(dev, max, false);
  if (rc == 0)
    rc = new_streams(dev, nlive, true);
  mp_device_close(dev);
  return rc != 0 ? rc : replay_streams(spec, nreplay);
}
