/* report.c - what the shim writes at exit: the report and the snapshot;
 * and mempool_preload_snapshot, the snapshot whenever the program asks.
 *
 * $MEMPOOL_REPORT=path|stderr: JSON statistics at exit (record.c's
 * counters, the pool's statistics, graphs.c's graph pools, host.c's host
 * pool); "torch" holds every pool's torch.cuda.memory_stats() names, keyed
 * by device, as mp_pool_dump(pool, f, "torch") writes them.
 * $MEMPOOL_SNAPSHOT=path: every device's pool as one PyTorch snapshot
 * pickle at exit (each segment's "device" and device_traces[ordinal]; open
 * it in memory_viz; with MEMPOOL_CONF=history=N it carries the last N
 * events per pool), and mempool_preload_snapshot(path) writes one whenever
 * the program asks (through ctypes, say). "%p" in the paths stands for the
 * process id.
 *
 * A file at the top: it reads the others and none calls it (the exit is a
 * destructor, the snapshot an export). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hooks.h"

static void mp__torch_one(mp_pool_t *pool, int ordinal, void *ctx) {
  (void)ordinal;
  FILE *f = ctx;
  fprintf(f, "%s\n    \"%s\": ", ftell(f) > 0 ? "," : "",
          mp_device_name(mp_pool_device(pool)));
  if (mp_pool_dump(pool, f, "torch") != MP_OK)
    fputs("null", f);
}

/* The members of the report's "torch" object: mp_pool_dump's "torch" view
 * of every pool, keyed by device. NULL when there is no pool; free() it. */
static char *mp__torch_views(const mp__pl_t *pl) {
  char *buf = NULL;
  size_t len = 0;
  if (pl == NULL || pl->mode != MP__PL_POOL)
    return NULL;
  FILE *f = open_memstream(&buf, &len);
  if (f == NULL)
    return NULL;
  mp__pl_each_pool(pl, mp__torch_one, f);
  if (fclose(f) != 0 || len == 0) {
    free(buf);
    return NULL;
  }
  return buf;
}

/* n: record.c's counters; pool: the first pool's statistics, NULL in
 * passthrough; torch: mp__torch_views. */
static void mp__report(FILE *f, const mp__pl_t *pl, const mp__pl_counts_t *n,
                       const mp_stats_t *pool, const char *torch) {
  const char *mode = pl->mode == MP__PL_POOL ? "pool" : "passthrough";
  fprintf(f,
          "{\n  \"mode\": \"%s\",\n  \"device\": \"%s\",\n"
          "  \"calls\": {\"allocate\": %llu, \"allocate_failure\": %llu, "
          "\"free\": %llu, \"pinned\": %llu, \"managed\": %llu},\n"
          "  \"bypassed\": {\"capture\": %llu, \"other_device\": %llu, "
          "\"foreign_free\": %llu},\n"
          "  \"graph_pools\": %zu,\n"
          "  \"live_bytes\": %zu,\n  \"peak_live_bytes\": %zu",
          mode, pl->dev ? mp_device_name(pl->dev) : "",
          (unsigned long long)n->allocs, (unsigned long long)n->alloc_failures,
          (unsigned long long)n->frees, (unsigned long long)n->pinned,
          (unsigned long long)n->managed, (unsigned long long)n->bypass_capture,
          (unsigned long long)n->bypass_other_device,
          (unsigned long long)n->foreign_frees, mp__pl_graph_pools(), n->live,
          n->peak_live);
  if (pool != NULL) {
    const mp_stats_t s = *pool;
    fprintf(f,
            ",\n  \"pool\": {\"reserved_bytes\": %zu, "
            "\"peak_reserved_bytes\": %zu, \"allocated_bytes\": %zu, "
            "\"peak_allocated_bytes\": %zu, \"requested_bytes\": %zu, "
            "\"peak_requested_bytes\": %zu, \"largest_free_bytes\": %zu, "
            "\"alloc_count\": %llu, \"free_count\": %llu, "
            "\"device_alloc_count\": %llu, \"device_free_count\": %llu, "
            "\"oom_count\": %llu}",
            s.reserved_bytes, s.peak_reserved_bytes, s.allocated_bytes,
            s.peak_allocated_bytes, s.requested_bytes, s.peak_requested_bytes,
            s.largest_free_bytes, (unsigned long long)s.alloc_count,
            (unsigned long long)s.free_count,
            (unsigned long long)s.device_alloc_count,
            (unsigned long long)s.device_free_count,
            (unsigned long long)s.oom_count);
  }
  if (torch != NULL)
    fprintf(f, ",\n  \"torch\": {%s  }", torch);
  mp__pl_host_report(f, pl);
  fputs("\n}\n", f);
}

int mempool_preload_snapshot(const char *path) {
  return mp__pl_snapshot(mp__pl_get(), path);
}

/* Late among the destructors (the shim depends on nothing but libc and is
 * preloaded), so the program's and the runtime's own exit work is mostly
 * done. The pool is left alone: something may still free into it. A
 * process that never made a hooked call writes nothing, and neither does a
 * forked child. */
__attribute__((destructor)) static void mp__exit(void) {
  const mp__pl_t *pl = mp__pl_started();
  if (pl == NULL || mp__pl_record_forked())
    return;
  char sbuf[4096];
  const char *spath = mp__pl_env_path("MEMPOOL_SNAPSHOT", sbuf, sizeof sbuf);
  if (spath != NULL && !mp__pl_path_taken("MEMPOOL_SNAPSHOT", spath))
    (void)mp__pl_snapshot(pl, spath);
  mp_stats_t stats;
  mp_pool_t *first = mp__pl_pool_first(pl);
  bool have_stats = first != NULL && mp_pool_get_stats(first, &stats) == MP_OK;
  char *torch = mp__torch_views(pl);
  mp__pl_counts_t n;
  if (!mp__pl_record_close(&n)) {
    free(torch);
    return;
  }
  char buf[4096];
  const char *path = mp__pl_env_path("MEMPOOL_REPORT", buf, sizeof buf);
  if (path != NULL && (strcmp(path, "stderr") == 0 ||
                       !mp__pl_path_taken("MEMPOOL_REPORT", path))) {
    bool to_stderr = strcmp(path, "stderr") == 0;
    /* Close-on-exec, as the trace: a program another thread execs
     * meanwhile must not inherit it; and a write a signal interrupts (a
     * FIFO's reader behind, a handler without SA_RESTART) is made again,
     * not the report dropped (mp__pl_record_fopen). */
    FILE *f = to_stderr ? stderr : mp__pl_record_fopen(path);
    if (f == NULL) {
      fprintf(stderr, "mempool preload: cannot write MEMPOOL_REPORT '%s'\n",
              path);
    } else {
      mp__report(f, pl, &n, have_stats ? &stats : NULL, torch);
      /* A write that failed (a full disk) is said, as the trace's is. */
      errno = 0;
      bool bad = fflush(f) != 0 || ferror(f);
      if (!to_stderr)
        bad |= fclose(f) != 0;
      if (bad && !to_stderr)
        fprintf(stderr,
                "mempool preload: writing MEMPOOL_REPORT '%s' failed (%s); "
                "the report is incomplete\n",
                path, strerror(errno ? errno : EIO));
    }
  }
  free(torch);
}
