/* test_preload_trace_order.c - a trace the shim records under threads is
 * in the order the addresses changed hands: no "allocate" of an address
 * that the trace still has live, no "free" of one it does not. In
 * passthrough mode every block is the real driver's (or runtime's); the
 * shim traced the free after the real call, so another thread's
 * allocation of the address just freed could be traced first, and a
 * replay freed the wrong block (hundreds of such rows in 40 000 with four
 * threads on the fake driver). rules_prog "trace_threads": four threads,
 * 5000 pairs of 64 KiB each. */
#include "spawn.h"

static spawn_result_t r;

/* Rows of the CSV trace at path out of order (an allocate of an address
 * live in the trace, a free of one not live), plus the blocks left live
 * at its end; 0 when in order. Column 3 the action, 4 the pointer. */
static int rows_out_of_order(const char *path) {
  return sh("awk -F, 'NR > 1 && $3 == \"allocate\" { if ($4 in live) bad++; "
            "live[$4] = 1 } NR > 1 && $3 == \"free\" { if (!($4 in live)) "
            "bad++; delete live[$4] } END { for (p in live) bad++; if (bad) "
            "print bad \" rows out of order or left live\" > \"/dev/stderr\"; "
            "exit bad != 0 }' %s",
            path);
}

/* Files of one run: its scratch folder, the CSV trace and the report. */
typedef struct run_files {
  char dir[64], trace[128], report[128];
} run_files_t;

/* Runs rules_prog WHAT (rt: through LIB's cudaMalloc and cudaFree) under
 * the shim in mode, tracing to f->trace and reporting to f->report. */
static void run_traced(const char *what, const char *mode, const char *lib,
                       run_files_t *f) {
  char e1[160], e2[160], e3[64];
  scratch_dir(f->dir, sizeof f->dir);
  snprintf(f->trace, sizeof f->trace, "%s/run.csv", f->dir);
  snprintf(f->report, sizeof f->report, "%s/report.json", f->dir);
  snprintf(e1, sizeof e1, "MEMPOOL_TRACE=%s", f->trace);
  snprintf(e2, sizeof e2, "MEMPOOL_REPORT=%s", f->report);
  snprintf(e3, sizeof e3, "MEMPOOL_PRELOAD=%s", mode);
  const char *drv[] = {MP_RULES_PROG, what, NULL};
  const char *rt[] = {MP_RULES_PROG, what, "rt", lib, NULL};
  const char *env[] = {
      "LD_PRELOAD=" MP_SHIM, "MEMPOOL_DEVICE=cuda", e1, e2, e3, NULL};
  spawn(lib != NULL ? rt : drv, env, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert_str_eq(r.out, "ok\n");
}

static void drop_files(run_files_t *f) {
  unlink(f->trace);
  unlink(f->report);
  rmdir(f->dir);
}

/* rules_prog trace_threads in mode: the CSV trace in order. */
static void trace_in_order(const char *mode, const char *lib) {
  run_files_t f;
  run_traced("trace_threads", mode, lib, &f);
  cr_assert_eq(count_lines(f.trace, ",allocate,"), 4 * 5000);
  cr_assert_eq(count_lines(f.trace, ",free,"), 4 * 5000);
  cr_assert_eq(rows_out_of_order(f.trace), 0,
               "%s: the trace has rows out of order", mode);
  drop_files(&f);
}

Test(preload_trace_order, passthrough_driver_frees_are_traced_before_reuse) {
  trace_in_order("passthrough", NULL);
}

Test(preload_trace_order, passthrough_runtime_frees_are_traced_before_reuse) {
  trace_in_order("passthrough", MP_STAND_RUNTIME);
}

/* In pool mode the pool's blocks were already traced first. */
Test(preload_trace_order, pool_frees_are_traced_before_reuse) {
  trace_in_order("pool", NULL);
}

/* A free the driver refuses (cuMemFree during a global capture), then the
 * real free after the capture: the report counts one allocation and one
 * free, and the trace has the block live until its real free. Traced
 * before the real call (above), the refused free was undone as a second
 * allocation: the report counted 2 and 2. */
static void refused_free_counted_once(const char *mode, const char *lib) {
  run_files_t f;
  run_traced("refused_free", mode, lib, &f);
  cr_expect_eq(
      sh("python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))"
         "[\"calls\"]; sys.exit(0 if c[\"allocate\"]==1 and c[\"free\"]==1 "
         "else 1)' %s",
         f.report),
      0, "%s: report: %s", mode, (slurp(f.report, r.out, sizeof r.out), r.out));
  cr_expect_eq(rows_out_of_order(f.trace), 0, "%s: the trace", mode);
  drop_files(&f);
}

Test(preload_trace_order, a_refused_passthrough_free_is_counted_once) {
  refused_free_counted_once("passthrough", NULL);
  refused_free_counted_once("passthrough", MP_STAND_RUNTIME);
}

Test(preload_trace_order, a_refused_pool_free_is_counted_once) {
  refused_free_counted_once("pool", NULL);
  refused_free_counted_once("pool", MP_STAND_RUNTIME);
}
