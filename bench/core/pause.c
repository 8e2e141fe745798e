/* pause.c - mp_pool_pause and mp_pool_resume timed, and the figures made
 * of them (ms per GiB, medians): one way of measuring for mpbench's
 * colocate workload and for bench_pause_resume. */
#include <stdlib.h>

#include "mpbench.h"

static size_t mpb_reserved(mp_pool_t *pool) {
  mp_stats_t s;
  return mp_pool_get_stats(pool, &s) == MP_OK ? s.reserved_bytes : 0;
}

mp_status_t mpb_pool_pause_timed(mp_pool_t *pool, unsigned flags, double *ms,
                                 size_t *bytes) {
  size_t held = mpb_reserved(pool);
  uint64_t t0 = mpb_now_ns();
  mp_status_t st = mp_pool_pause(pool, flags);
  uint64_t t1 = mpb_now_ns();
  *ms = (double)(t1 - t0) / 1e6;
  *bytes = held;
  return st;
}

mp_status_t mpb_pool_resume_timed(mp_pool_t *pool, double *ms, size_t *bytes) {
  uint64_t t0 = mpb_now_ns();
  mp_status_t st = mp_pool_resume(pool);
  uint64_t t1 = mpb_now_ns();
  *ms = (double)(t1 - t0) / 1e6;
  *bytes = mpb_reserved(pool);
  return st;
}

double mpb_ms_per_gib(double ms, size_t bytes) {
  return bytes ? ms / ((double)bytes / (double)((size_t)1 << 30)) : 0.0;
}

static int mpb_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

double mpb_median(double *v, size_t n) {
  if (n == 0)
    return 0.0;
  qsort(v, n, sizeof *v, mpb_cmp_double);
  return v[n / 2];
}
