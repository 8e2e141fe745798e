/* pool_traces - replays every RMM-style CSV trace under a directory through
 * one best-fit pool on the host device and prints, per trace, peak reserved
 * / peak live (1.0 is the limit) and the device calls the pool made.
 *
 * Trace pointers are mapped to pool pointers through a hash map; a free of a
 * pointer the trace never allocated is counted and skipped. Trace stream 0
 * is the default stream; every other stream id gets a host stream of its
 * own, so stream-ordered reuse is exercised as recorded.
 *
 *   bench_pool_traces [traces dir, default $MEMPOOL_TEST_TRACES or
 *                     ../shared/traces] [pool options, e.g. "virtual=0"] */
#include <dirent.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mempool/mempool.h>

typedef struct tmap {
  uint64_t *keys;
  void **vals;
  size_t cap, count;
} tmap_t;

static size_t tmap_slot(const tmap_t *m, uint64_t k) {
  return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 20) & (m->cap - 1);
}

static void tmap_put(tmap_t *m, uint64_t k, void *v);

static void tmap_grow(tmap_t *m) {
  tmap_t n = {calloc(m->cap * 2, 8), calloc(m->cap * 2, sizeof(void *)),
              m->cap * 2, 0};
  for (size_t i = 0; i < m->cap; i++)
    if (m->keys[i])
      tmap_put(&n, m->keys[i], m->vals[i]);
  free(m->keys);
  free(m->vals);
  *m = n;
}

static void tmap_put(tmap_t *m, uint64_t k, void *v) {
  if ((m->count + 1) * 2 > m->cap)
    tmap_grow(m);
  size_t i = tmap_slot(m, k);
  while (m->keys[i] && m->keys[i] != k)
    i = (i + 1) & (m->cap - 1);
  if (!m->keys[i])
    m->count++;
  m->keys[i] = k;
  m->vals[i] = v;
}

/* Removes k; returns its value or NULL. Backward-shift deletion. */
static void *tmap_take(tmap_t *m, uint64_t k) {
  size_t i = tmap_slot(m, k);
  while (m->keys[i] && m->keys[i] != k)
    i = (i + 1) & (m->cap - 1);
  if (!m->keys[i])
    return NULL;
  void *v = m->vals[i];
  size_t hole = i;
  for (size_t j = (i + 1) & (m->cap - 1); m->keys[j];
       j = (j + 1) & (m->cap - 1)) {
    size_t home = tmap_slot(m, m->keys[j]);
    if (hole <= j ? (home <= hole || home > j) : (home <= hole && home > j)) {
      m->keys[hole] = m->keys[j];
      m->vals[hole] = m->vals[j];
      hole = j;
    }
  }
  m->keys[hole] = 0;
  m->count--;
  return v;
}

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
  tmap_t map = {calloc(1024, 8), calloc(1024, sizeof(void *)), 1024, 0};
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
      tmap_put(&map, ptr, p);
      live += size;
      if (live > r->peak_live)
        r->peak_live = live;
    } else if (strcmp(action, "free") == 0) {
      void *p = tmap_take(&map, ptr);
      if (p == NULL) {
        r->unknown_frees++;
        continue;
      }
      mp_pool_free(pool, p);
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
  for (size_t i = 0; i < map.cap; i++)
    if (map.keys[i])
      mp_pool_free(pool, map.vals[i]);
  mp_pool_destroy(pool);
  for (int k = 0; k < 256; k++)
    if (streams[k])
      mp_stream_destroy(dev, streams[k]);
  free(map.keys);
  free(map.vals);
  return 0;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : getenv("MEMPOOL_TEST_TRACES");
  if (dir == NULL)
    dir = "../shared/traces";
  const char *opts = argc > 2 ? argv[2] : NULL;
  mp_device_t *dev;
  if (mp_device_open("host:capacity=1T", &dev) != MP_OK) {
    fprintf(stderr, "%s\n", mp_last_error());
    return 1;
  }
  char *files[256];
  int nf = 0;
  const char *subs[] = {"pytorch", "mindspore", "."};
  for (int d = 0; d < 3; d++) {
    char sub[1024];
    snprintf(sub, sizeof sub, "%s/%s", dir, subs[d]);
    DIR *dd = opendir(sub);
    if (dd == NULL)
      continue;
    struct dirent *e;
    while ((e = readdir(dd)) != NULL && nf < 256) {
      size_t l = strlen(e->d_name);
      if (l > 4 && strcmp(e->d_name + l - 4, ".csv") == 0) {
        char *p = NULL;
        if (asprintf(&p, "%s/%s", sub, e->d_name) > 0)
          files[nf++] = p;
      }
    }
    closedir(dd);
  }
  qsort(files, (size_t)nf, sizeof files[0], by_name);
  printf("pool options: %s\n", opts ? opts : "(defaults)");
  printf("%-45s %8s %12s %12s %7s %6s %6s %8s\n", "trace", "events",
         "peak live", "peak resv", "ratio", "dallc", "dfree", "ns/ev");
  double worst = 0;
  for (int i = 0; i < nf; i++) {
    result_t r;
    if (replay(dev, opts, files[i], &r) != 0)
      return 1;
    double ratio =
        r.peak_live ? (double)r.peak_reserved / (double)r.peak_live : 0;
    if (ratio > worst)
      worst = ratio;
    const char *name = strstr(files[i], "traces/");
    printf("%-45s %8zu %12zu %12zu %7.4f %6llu %6llu %8.0f%s\n",
           name ? name + 7 : files[i], r.events, r.peak_live, r.peak_reserved,
           ratio, r.dev_allocs, r.dev_frees, r.ns_per_event,
           r.failures ? " (failures!)" : "");
    free(files[i]);
  }
  printf("worst ratio %.4f\n", worst);
  mp_device_close(dev);
  return 0;
}
