/* pause_resume - what mp_pool_pause and mp_pool_resume cost per GiB on a
 * device, with and without MP_PAUSE_KEEP_CONTENT, and two pools taking
 * turns on a device too small for both (the RLHF colocation pattern: a
 * "trainer" and an "engine" pool, each filled to most of the device,
 * alternately paused and resumed with their content kept and checked).
 *
 * The pool is filled with blocks whose pages are touched (so the host
 * device really commits and copies them), then paused and resumed
 * `rounds` times; the median of each phase is reported in ms and ms/GiB.
 * Timing and medians are mpbench's (bench/core/pause.c), which its
 * colocate workload reports the same way.
 *
 *   bench_pause_resume [SIZE=1] [rounds=5] [device spec, default
 *                      "host:capacity=<3/2 of SIZE>"]
 *
 * SIZE, each pool's live bytes: a count of GiB (1 to 1024), or a size with
 * its unit (K, M, G, T: "256M") in whole 32 MiB blocks, from 64 MiB to
 * 1 TiB, for a quick run (the first touch of a page is the cost on a
 * machine whose page faults are slow). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mempool/mempool.h>

#include "args.h"
#include "mpbench.h"

#define MiB ((size_t)1 << 20)

static double now_ms(void) {
  return (double)mpb_now_ns() / 1e6;
}

#define CHECK(call)                                                            \
  do {                                                                         \
    mp_status_t st_ = (call);                                                  \
    if (st_ != MP_OK) {                                                        \
      fprintf(stderr, "%s: %s: %s\n", #call, mp_status_name(st_),              \
              mp_last_error());                                                \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

/* Fills a pool with 32 MiB blocks up to bytes, each block's first byte its
 * tag (pages touched: the memory is really there). */
static size_t fill(mp_pool_t *p, size_t bytes, void **v, unsigned tag) {
  size_t n = bytes / (32 * MiB);
  for (size_t i = 0; i < n; i++) {
    CHECK(mp_pool_alloc(p, 32 * MiB, NULL, &v[i]));
    memset(v[i], (int)(tag + i), 32 * MiB);
  }
  return n;
}

static int same(void **v, size_t n, unsigned tag) {
  for (size_t i = 0; i < n; i++)
    if (((unsigned char *)v[i])[32 * MiB - 1] != (unsigned char)(tag + i))
      return 0;
  return 1;
}

/* argv[1] (SIZE, above) into *bytes; false, after a message, when it is
 * none. */
static bool pool_bytes(int argc, char **argv, size_t *bytes) {
  uint64_t ngib;
  const char *s = argc > 1 ? argv[1] : "1";
  size_t len = strlen(s);
  if (len > 0 && s[len - 1] >= '0' && s[len - 1] <= '9') {
    if (!micro_count(argc, argv, 1, 1, 1, 1024, "GiB", &ngib))
      return false;
    *bytes = (size_t)ngib << 30;
    return true;
  }
  if (mp__parse_size(s, len, bytes) && *bytes % (32 * MiB) == 0 &&
      *bytes >= 64 * MiB && *bytes <= ((size_t)1 << 40))
    return true;
  fprintf(stderr,
          "%s: bad size '%s' (GiB from 1 to 1024, or a size such as 256M: "
          "whole 32 MiB blocks, from 64M to 1T)\n",
          argv[0], s);
  return false;
}

/* bytes as "N GiB" where whole, else "N MiB" (whole 32 MiB blocks). */
static const char *shown(size_t bytes, char *buf, size_t cap) {
  if (bytes % ((size_t)1 << 30) == 0)
    snprintf(buf, cap, "%zu GiB", bytes >> 30);
  else
    snprintf(buf, cap, "%zu MiB", bytes >> 20);
  return buf;
}

int main(int argc, char **argv) {
  uint64_t nrounds;
  size_t bytes;
  if (!pool_bytes(argc, argv, &bytes) ||
      !micro_count(argc, argv, 2, 5, 1, 100, "rounds", &nrounds)) {
    fprintf(stderr, "usage: bench_pause_resume [SIZE: GiB 1..1024, or 64M.."
                    "1T] [rounds 1..100] [device spec]\n");
    return 2;
  }
  double gib = (double)bytes / (double)((size_t)1 << 30);
  char size[32];
  shown(bytes, size, sizeof size);
  int rounds = (int)nrounds;
  char spec[128];
  if (argc > 3)
    snprintf(spec, sizeof spec, "%s", argv[3]);
  else
    snprintf(spec, sizeof spec, "host:capacity=%zuM", (bytes >> 20) * 3 / 2);
  mp_device_t *dev;
  CHECK(mp_device_open(spec, &dev));
  void **a = calloc(bytes / (32 * MiB), sizeof *a);
  void **b = calloc(bytes / (32 * MiB), sizeof *b);
  if (a == NULL || b == NULL)
    return 1;
  printf("device %s, %s of live blocks per pool, %d rounds\n",
         mp_device_name(dev), size, rounds);
  printf("| phase | keep content | ms (median) | ms per GiB |\n|---|---|---:|"
         "---:|\n");
  double t[4][100];
  for (int keep = 0; keep < 2; keep++) {
    mp_pool_t *p;
    CHECK(mp_pool_create(dev, NULL, &p));
    size_t n = fill(p, bytes, a, 1);
    for (int r = 0; r < rounds; r++) {
      size_t moved;
      CHECK(mpb_pool_pause_timed(p, keep ? MP_PAUSE_KEEP_CONTENT : 0,
                                 &t[2 * keep][r], &moved));
      CHECK(mpb_pool_resume_timed(p, &t[2 * keep + 1][r], &moved));
      if (keep && !same(a, n, 1)) {
        fprintf(stderr, "content lost across pause/resume\n");
        return 1;
      }
      for (size_t i = 0; !keep && i < n; i++) /* touch again, as a user would */
        memset(a[i], (int)(1 + i), 32 * MiB);
    }
    for (int ph = 0; ph < 2; ph++) {
      double m = mpb_median(t[2 * keep + ph], (size_t)rounds);
      printf("| %s | %s | %.1f | %.1f |\n", ph ? "resume" : "pause",
             keep ? "yes" : "no", m, m / gib);
    }
    for (size_t i = 0; i < n; i++)
      CHECK(mp_pool_free(p, a[i]));
    CHECK(mp_pool_destroy(p));
  }
  /* Colocation: two pools that do not fit together take turns. */
  mp_pool_t *trainer, *engine;
  CHECK(mp_pool_create(dev, NULL, &trainer));
  CHECK(mp_pool_create(dev, NULL, &engine));
  size_t na = fill(trainer, bytes, a, 3);
  CHECK(mp_pool_pause(trainer, MP_PAUSE_KEEP_CONTENT));
  size_t nb = fill(engine, bytes, b, 7);
  double t0 = now_ms();
  for (int r = 0; r < rounds; r++) {
    CHECK(mp_pool_pause(engine, MP_PAUSE_KEEP_CONTENT));
    CHECK(mp_pool_resume(trainer));
    CHECK(mp_pool_pause(trainer, MP_PAUSE_KEEP_CONTENT));
    CHECK(mp_pool_resume(engine));
  }
  double per = (now_ms() - t0) / rounds;
  /* A round trip pauses and resumes each pool once: bytes out and back
   * for each, 4 * bytes moved, each way counted as the table above counts a
   * pause or a resume (and mpbench's colocate figures). */
  char moved[32];
  shown(4 * bytes, moved, sizeof moved);
  int ok = same(b, nb, 7);
  CHECK(mp_pool_pause(engine, MP_PAUSE_KEEP_CONTENT));
  CHECK(mp_pool_resume(trainer));
  ok = ok && same(a, na, 3);
  for (size_t i = 0; i < na; i++)
    CHECK(mp_pool_free(trainer, a[i]));
  CHECK(mp_pool_destroy(trainer));
  CHECK(mp_pool_destroy(engine));
  printf("\ncolocate: two pools of %s on %s take turns: %.1f ms per "
         "round trip (%s moved: %.1f ms per GiB moved), content %s\n",
         size, spec, per, moved, per / (4 * gib), ok ? "kept" : "LOST");
  free(a);
  free(b);
  mp_device_close(dev);
  return ok ? 0 : 1;
}
