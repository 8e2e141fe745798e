/* host_pairs - steady-state cost of one free + alloc pair in the host
 * (page-locked) pool, mp_host_pool_alloc / mp_host_pool_free, on
 * bench_pool_pairs' plan (pairs_plan.h: the same sizes and victims, 100
 * and 10 000 live blocks, log-uniform 512 B .. 16 MiB), so its rows stand
 * beside the device pool's.
 *
 * As in bench_pool_pairs: the live set is filled first, then a warm-up of
 * the same length as the timed phase runs, then the timed phase: free a
 * random live block, allocate a new random size in its place, every block
 * on the NULL stream (one stream). The host pool grows in plain segments
 * (page-locked memory has no virtual range: src/device/pinned.c), its
 * native path, so the "range" column bench_pool_pairs prints has no
 * meaning here. The device's page-locked memory is the host backend's
 * mmap, never touched, so nothing is committed; the host pool's cap is the
 * machine's physical memory (mempool/host_pool.h): a live set whose peak
 * does not fit is reported as refused, and the other rows still run.
 *
 *   bench_host_pairs [pairs=2000000] [device spec, default "host"]
 *
 * Instructions per pair: under callgrind with --instr-atstart=no, each
 * timed phase alone is dumped as "hostpool LIVE" (count_pairs.sh prints
 * them beside the device pool's rows). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <mempool/host_pool.h>
#include <mempool/mempool.h>

#include "args.h"
#include "pairs_plan.h"
#include "pairs_rows.h"

/* The plan p through a host pool of dev (default config): 0, or 1 after a
 * message when the pool refused a call. */
static int run_host_pool(mp_device_t *dev, const plan_t *p, result_t *r) {
  mp_host_pool_t *hp;
  if (mp_host_pool_create(dev, NULL, &hp) != MP_OK) {
    fprintf(stderr, "host pool: %s\n", mp_last_error());
    return 1;
  }
  void **live = calloc(p->live, sizeof(void *));
  int rc = live == NULL;
  for (size_t i = 0; rc == 0 && i < p->live; i++)
    rc = mp_host_pool_alloc(hp, p->init[i], NULL, &live[i]) != MP_OK;
  /* Warm-up and timed phase run the same sequence: a repeating workload. */
  mp_stats_t s0 = {0}, s1 = {0};
  double t0 = 0;
  for (int phase = 0; rc == 0 && phase < 2; phase++) {
    if (phase == 1) {
      mp_host_pool_get_stats(hp, &s0);
      count_begin();
      t0 = now_ns();
    }
    for (size_t i = 0; i < p->pairs; i++) {
      uint32_t v = p->victim[i];
      mp_host_pool_free(hp, live[v]);
      if (mp_host_pool_alloc(hp, p->sizes[i], NULL, &live[v]) != MP_OK) {
        live[v] = NULL;
        rc = 1;
        break;
      }
    }
  }
  double t1 = now_ns();
  if (rc == 0) {
    count_end("hostpool", p->live);
    mp_host_pool_get_stats(hp, &s1);
    pairs_result(r, &s0, &s1, t1 - t0, p->pairs);
    if (mp_host_pool_check(hp) != MP_OK)
      fprintf(stderr, "host pool check: %s\n", mp_last_error());
  } else {
    fprintf(stderr, "host pool, %zu live: %s\n", p->live,
            live == NULL ? "out of host memory" : mp_last_error());
  }
  mp_host_pool_destroy(hp);
  free(live);
  return rc;
}

int main(int argc, char **argv) {
  size_t pairs;
  if (!pairs_count(argc, argv, &pairs))
    return 2;
  const char *spec = argc > 2 ? argv[2] : "host";
  mp_device_t *dev = pairs_device(spec);
  if (dev == NULL)
    return 1;
  printf("host pool free+alloc pairs, sizes log-uniform 512 B .. 16 MiB, "
         "%zu pairs, device %s\n",
         pairs, mp_device_name(dev));
  printf("%-10s %8s %12s %12s %12s %14s %12s\n", "allocator", "live", "ns/pair",
         "dev allocs", "dev frees", "peak res/req", "free blocks");
  size_t lives[2] = {100, 10000};
  int rc = 0;
  for (int k = 0; k < 2; k++) {
    /* Made in bench_pool_pairs' order, so each plan is the same as its. */
    plan_t p = make_plan(lives[k], pairs);
    if (p.sizes == NULL) {
      fprintf(stderr, "%s: out of host memory for %zu pairs\n", argv[0], pairs);
      rc = 1;
      break;
    }
    result_t r = {0};
    if (run_host_pool(dev, &p, &r) == 0) {
      pairs_row("hostpool", lives[k], &r);
      putchar('\n');
    } else {
      rc = 1;
    }
    plan_free(&p);
  }
  mp_device_close(dev);
  return rc;
}
