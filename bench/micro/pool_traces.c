/* pool_traces - replays every RMM-style CSV trace under a directory through
 * one best-fit pool on the host device and prints, per trace, the events
 * replayed, peak reserved / peak live (1.0 is the limit) and the device
 * calls the pool made.
 *
 * Traces are read as mpbench reads them (mpb_trace_load, bench/core/
 * trace.c), so its rules hold here too: a malformed row stops the run with
 * its file and line (exit 1); frees of pointers the trace never allocated
 * and "allocate failure" rows are skipped; an allocation of a live address
 * frees the block there first; blocks left live are freed at the end (in
 * the events count, as in mpbench's). Peak live is the workload's
 * (mpb_workload_peak_live), as in mpbench's results. Trace stream 0 is the
 * default stream; every other stream gets a host stream of its own, so
 * stream-ordered reuse is exercised as recorded, the device catching up
 * after each free as in mpbench. ns/ev times the replay alone, not the
 * reading nor the catching up.
 *
 *   bench_pool_traces [traces dir, default $MEMPOOL_TEST_TRACES, else
 *                     where mpbench finds them] [pool options, e.g.
 *                     "virtual=0"] */
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mempool/mempool.h>

#include "mpbench.h" /* finding traces, reading them (mpb_trace_load), and
                        their peak live bytes */

typedef struct result {
  size_t events, peak_live, peak_reserved, failures;
  unsigned long long dev_allocs, dev_frees;
  double ns_per_event;
} result_t;

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* Replays w (read from path) through a fresh pool made with opts: 0, or 1
 * with the reason on stderr. Whatever it made is gone either way. */
static int replay(mp_device_t *dev, const char *opts, const char *path,
                  const mpb_workload_t *w, result_t *r) {
  memset(r, 0, sizeof *r);
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  if (opts && mp_pool_config_parse(&cfg, opts) != MP_OK) {
    fprintf(stderr, "%s\n", mp_last_error());
    return 1;
  }
  mp_pool_t *pool;
  if (mp_pool_create(dev, &cfg, &pool) != MP_OK) {
    fprintf(stderr, "%s\n", mp_last_error());
    return 1;
  }
  /* Per slot, its pool block; per stream index, a host stream made at its
   * first allocation (index 0, the default stream, is NULL). */
  void **ptr = calloc(w->nslots ? w->nslots : 1, sizeof *ptr);
  mp_stream_t *streams = calloc(w->nstreams ? w->nstreams : 1, sizeof *streams);
  int rc = 0;
  if (ptr == NULL || streams == NULL) {
    fprintf(stderr, "%s: out of host memory\n", path);
    rc = 1;
  }
  /* On several streams the device catches up after each free (outside the
   * time), as in mpbench's replay (bench/core/replay.c, mpb_rig_settle):
   * otherwise cross-stream reuse, and the figures, would depend on when
   * the host streams' threads ran (select_n llama: 1.19 to 1.25). */
  bool settle = w->nstreams > 1;
  double t0 = now_ns(), settled = 0;
  for (size_t i = 0; i < w->n && rc == 0; i++) {
    const mpb_event_t *e = &w->ev[i];
    if (e->op == MPB_FREE) {
      mp_pool_free(pool, ptr[e->slot]); /* NULL: its allocation failed */
      ptr[e->slot] = NULL;
      if (settle) {
        double t = now_ns();
        mp_device_synchronize(dev);
        settled += now_ns() - t;
      }
      continue;
    }
    if (e->op != MPB_ALLOC) /* a trace has no other events */
      continue;
    mp_stream_t *s = &streams[e->stream];
    if (e->stream != 0 && *s == NULL && mp_stream_create(dev, s) != MP_OK) {
      fprintf(stderr, "%s: %s\n", path, mp_last_error());
      rc = 1;
    } else if (mp_pool_alloc(pool, e->size, *s, &ptr[e->slot]) != MP_OK) {
      ptr[e->slot] = NULL;
      r->failures++;
    }
  }
  r->events = w->n;
  r->ns_per_event = (now_ns() - t0 - settled) / (double)(w->n ? w->n : 1);
  r->peak_live = mpb_workload_peak_live(w);
  mp_stats_t st;
  mp_pool_get_stats(pool, &st);
  r->peak_reserved = st.peak_reserved_bytes;
  r->dev_allocs = st.device_alloc_count;
  r->dev_frees = st.device_free_count;
  if (rc == 0 && mp_pool_check(pool) != MP_OK)
    fprintf(stderr, "%s: pool check: %s\n", path, mp_last_error());
  /* The workload ends empty; a replay cut short does not. */
  for (uint32_t k = 0; ptr != NULL && k < w->nslots; k++)
    mp_pool_free(pool, ptr[k]);
  mp_pool_destroy(pool);
  for (uint32_t k = 1; streams != NULL && k < w->nstreams; k++)
    if (streams[k] != NULL)
      mp_stream_destroy(dev, streams[k]);
  free(streams);
  free(ptr);
  return rc;
}

int main(int argc, char **argv) {
  char dirbuf[4096];
  const char *dir = argc > 1 ? argv[1] : getenv("MEMPOOL_TEST_TRACES");
  if (dir == NULL)
    dir = mpb_traces_dir(dirbuf, sizeof dirbuf);
  if (dir == NULL) {
    fprintf(stderr, "no traces folder (give one, or set $MEMPOOL_TRACES)\n");
    return 1;
  }
  const char *opts = argc > 2 ? argv[2] : NULL;
  mp_device_t *dev;
  if (mp_device_open("host:capacity=1T", &dev) != MP_OK) {
    fprintf(stderr, "%s\n", mp_last_error());
    return 1;
  }
  char **files = NULL;
  size_t nf = 0;
  if (mpb_traces_scan(dir, &files, &nf, NULL, NULL) != MP_OK) {
    fprintf(stderr, "%s\n", mp_last_error());
    mp_device_close(dev);
    return 1;
  }
  printf("pool options: %s\n", opts ? opts : "(defaults)");
  printf("%-45s %8s %12s %12s %7s %6s %6s %8s\n", "trace", "events",
         "peak live", "peak resv", "ratio", "dallc", "dfree", "ns/ev");
  double worst = 0;
  int rc = 0;
  for (size_t i = 0; i < nf; i++) {
    result_t r;
    char path[4096];
    mpb_workload_t w;
    if (snprintf(path, sizeof path, "%s/%s", dir, files[i]) >=
        (int)sizeof path) {
      fprintf(stderr, "%s/%s: path too long\n", dir, files[i]);
      rc = 1;
    } else if (mpb_trace_load(path, files[i], &w) != MP_OK) {
      fprintf(stderr, "%s\n", mp_last_error()); /* names the file, line */
      rc = 1;
    } else {
      rc = replay(dev, opts, path, &w, &r);
      mpb_workload_free(&w);
    }
    if (rc != 0)
      break;
    double ratio =
        r.peak_live ? (double)r.peak_reserved / (double)r.peak_live : 0;
    if (ratio > worst)
      worst = ratio;
    printf("%-45s %8zu %12zu %12zu %7.4f %6llu %6llu %8.0f%s\n", files[i],
           r.events, r.peak_live, r.peak_reserved, ratio, r.dev_allocs,
           r.dev_frees, r.ns_per_event, r.failures ? " (failures!)" : "");
  }
  mpb_traces_free(files, nf);
  if (rc == 0)
    printf("worst ratio %.4f\n", worst);
  mp_device_close(dev);
  return rc;
}
