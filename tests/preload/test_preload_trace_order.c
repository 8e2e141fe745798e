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

/* Runs rules_prog trace_threads (rt: through LIB's cudaMalloc and
 * cudaFree) under the shim in mode, and checks the CSV trace. */
static void trace_in_order(const char *mode, const char *lib) {
  char dir[64], trace[128], env_trace[160], env_mode[64];
  scratch_dir(dir, sizeof dir);
  snprintf(trace, sizeof trace, "%s/run.csv", dir);
  snprintf(env_trace, sizeof env_trace, "MEMPOOL_TRACE=%s", trace);
  snprintf(env_mode, sizeof env_mode, "MEMPOOL_PRELOAD=%s", mode);
  const char *drv[] = {MP_RULES_PROG, "trace_threads", NULL};
  const char *rt[] = {MP_RULES_PROG, "trace_threads", "rt", lib, NULL};
  const char *env[] = {"LD_PRELOAD=" MP_SHIM, "MEMPOOL_DEVICE=cuda", env_trace,
                       env_mode, NULL};
  spawn(lib != NULL ? rt : drv, env, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert_str_eq(r.out, "ok\n");
  cr_assert_eq(count_lines(trace, ",allocate,"), 4 * 5000);
  cr_assert_eq(count_lines(trace, ",free,"), 4 * 5000);
  /* Column 3 the action, 4 the pointer. */
  cr_assert_eq(sh("awk -F, 'NR > 1 && $3 == \"allocate\" { if ($4 in live) "
                  "bad++; live[$4] = 1 } NR > 1 && $3 == \"free\" { if (!($4 "
                  "in live)) bad++; delete live[$4] } END { if (bad) print "
                  "bad \" rows out of order\" > \"/dev/stderr\"; exit bad != 0 "
                  "}' %s",
                  trace),
               0, "%s: the trace has rows out of order", mode);
  unlink(trace);
  rmdir(dir);
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
