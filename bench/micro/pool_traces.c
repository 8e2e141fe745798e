/* pool_traces - replays every RMM-style CSV trace under a directory through
 * one best-fit pool on the host device and prints, per trace, peak reserved
 * / peak live (1.0 is the limit) and the device calls the pool made.
 *
 * Trace pointers are mapped to pool pointers through the library's address
 * map (src/ptrmap.c); a free of a
 * pointer the trace never allocated is counted and skipped. Trace stream 0
 * is the default stream; every other stream id gets a host stream of its
 * own, so stream-ordered reuse is exercised as recorded.
 *
 *   bench_pool_traces [traces dir, default $MEMPOOL_TEST_TRACES, else
 *                     where mpbench finds them] [pool options, e.g.
 *                     "virtual=0"] */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mempool/mempool.h>

#include "internal.h" /* mp__ptrmap_* (the pointer map) */
#include "mpbench.h"  /* mpb_traces_dir, mpb_traces_scan (finding traces) */

/* Trace pointer -> pool pointer, in the library's address map. */
typedef struct tentry {
  uintptr_t key; /* the trace's pointer */
  void *p;
} tentry_t;

typedef struct result {
  size_t events, peak_live, peak_reserved, unknown_frees, failures;
  unsigned long long dev_allocs, dev_frees;
  double ns_per_event;
} result_t;

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int replay(mp_device_t *dev, const char *opts, const char *path,
                  result_t *r) {
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return 1;
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
  mp__ptrmap_t map;
  mp__ptrmap_init(&map, sizeof(tentry_t));
  mp_stream_t streams[256] = {0};
  char line[512];
  size_t lineno = 0, live = 0;
  memset(r, 0, sizeof *r);
  double t0 = now_ns();
  while (fgets(line, sizeof line, f)) {
    lineno++;
    if (lineno == 1)
      continue;
    char action[32];
    unsigned long long ptr;
    size_t size;
    unsigned stream;
    char *c = line;
    for (int k = 0; k < 2 && c; k++)
      c = strchr(c, ',') ? strchr(c, ',') + 1 : NULL;
    if (c == NULL ||
        sscanf(c, "%31[^,],%llx,%zu,%u", action, &ptr, &size, &stream) != 4) {
      fprintf(stderr, "%s:%zu: malformed line\n", path, lineno);
      return 1;
    }
    r->events++;
    mp_stream_t s = NULL;
    if (stream != 0) {
      unsigned k = stream % 256;
      if (streams[k] == NULL && mp_stream_create(dev, &streams[k]) != MP_OK)
        return 1;
      s = streams[k];
    }
    if (strcmp(action, "allocate") == 0) {
      void *p;
      if (mp_pool_alloc(pool, size, s, &p) != MP_OK) {
        r->failures++;
        continue;
      }
      tentry_t *e = mp__ptrmap_put(&map, (uintptr_t)ptr);
      if (e == NULL) {
        fprintf(stderr, "%s:%zu: out of host memory\n", path, lineno);
        return 1;
      }
      e->p = p;
      live += size;
      if (live > r->peak_live)
        r->peak_live = live;
    } else if (strcmp(action, "free") == 0) {
      tentry_t e = {0, NULL};
      if (!mp__ptrmap_take(&map, (uintptr_t)ptr, &e)) {
        r->unknown_frees++;
        continue;
      }
      mp_pool_free(pool, e.p);
      live -= size;
    }
  }
  r->ns_per_event = (now_ns() - t0) / (double)(r->events ? r->events : 1);
  fclose(f);
  mp_stats_t st;
  mp_pool_get_stats(pool, &st);
  r->peak_reserved = st.peak_reserved_bytes;
  r->dev_allocs = st.device_alloc_count;
  r->dev_frees = st.device_free_count;
  if (mp_pool_check(pool) != MP_OK)
    fprintf(stderr, "%s: pool check: %s\n", path, mp_last_error());
  for (size_t i = 0; i < map.cap; i++) {
    tentry_t *e = mp__ptrmap_at(&map, i);
    if (e != NULL)
      mp_pool_free(pool, e->p);
  }
  mp_pool_destroy(pool);
  for (int k = 0; k < 256; k++)
    if (streams[k])
      mp_stream_destroy(dev, streams[k]);
  mp__ptrmap_destroy(&map);
  return 0;
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
    return 1;
  }
  printf("pool options: %s\n", opts ? opts : "(defaults)");
  printf("%-45s %8s %12s %12s %7s %6s %6s %8s\n", "trace", "events",
         "peak live", "peak resv", "ratio", "dallc", "dfree", "ns/ev");
  double worst = 0;
  for (size_t i = 0; i < nf; i++) {
    result_t r;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    if (replay(dev, opts, path, &r) != 0)
      return 1;
    double ratio =
        r.peak_live ? (double)r.peak_reserved / (double)r.peak_live : 0;
    if (ratio > worst)
      worst = ratio;
    printf("%-45s %8zu %12zu %12zu %7.4f %6llu %6llu %8.0f%s\n", files[i],
           r.events, r.peak_live, r.peak_reserved, ratio, r.dev_allocs,
           r.dev_frees, r.ns_per_event, r.failures ? " (failures!)" : "");
  }
  mpb_traces_free(files, nf);
  printf("worst ratio %.4f\n", worst);
  mp_device_close(dev);
  return 0;
}
