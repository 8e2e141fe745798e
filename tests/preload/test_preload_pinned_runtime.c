/* test_preload_pinned_runtime.c - cudaHostAlloc, cudaMallocHost and
 * cudaFreeHost of a program on the shared CUDA runtime, under the shim with
 * MEMPOOL_DEVICE=host: the host pool serves them (a few page-locked chunks
 * for many requests), the JSON trace marks each one and its free, and the
 * report's "host_pool" object counts them. */
#include "spawn.h"

#define N 40

/* One buffer is live at a time, each under 72 KB: one 2 MiB chunk serves
 * all 2N + 1 requests. cudaFreeHost synchronizes the device, so the freed
 * buffer serves the next request at once; it used to wait for a marker
 * the host device's stream thread had to see, and on a loaded machine the
 * pool grew 1 to 3 chunks instead (2026-11-30; a CI run failed on it). */
#define MAX_CHUNKS 1

static spawn_result_t r;

/* Runs pinned_rt_prog with n and mode under the shim on the host device,
 * its report in a scratch folder; expects it to exit 0, then the python
 * check (a sys.exit expression over the report's JSON d) to pass. */
static void run_and_check_report(const char *n, const char *mode,
                                 const char *check) {
  char dir[64], report[128], e1[160];
  scratch_dir(dir, sizeof dir);
  snprintf(report, sizeof report, "%s/report.json", dir);
  snprintf(e1, sizeof e1, "MEMPOOL_REPORT=%s", report);
  const char *argv[] = {MP_PINNED_RT_PROG, n, mode, NULL};
  const char *env[] = {"LD_PRELOAD=" MP_SHIM, "MEMPOOL_DEVICE=host", e1, NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert_eq(sh("python3 -c 'import json,sys; "
                  "d=json.load(open(sys.argv[1])); %s' %s",
                  check, report),
               0, "report: %s", (slurp(report, r.out, sizeof r.out), r.out));
  unlink(report);
  rmdir(dir);
}

Test(preload_pinned_runtime, host_pool_serves_and_records_pinned_memory) {
  char dir[64], trace[128], report[128], e1[160], e2[160], n[16];
  scratch_dir(dir, sizeof dir);
  snprintf(trace, sizeof trace, "%s/run.json", dir);
  snprintf(report, sizeof report, "%s/report.json", dir);
  snprintf(e1, sizeof e1, "MEMPOOL_TRACE=%s", trace);
  snprintf(e2, sizeof e2, "MEMPOOL_REPORT=%s", report);
  snprintf(n, sizeof n, "%d", N);
  const char *argv[] = {MP_PINNED_RT_PROG, n, NULL};
  const char *env[] = {"LD_PRELOAD=" MP_SHIM, "MEMPOOL_DEVICE=host", e1, e2,
                       NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert_eq(word_value(r.out, "pinned"), 2 * N + 1);
  cr_assert_eq(
      sh("python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); "
         "h=d[\"host_pool\"]; "
         "sys.exit(0 if d[\"calls\"][\"pinned\"]==%d and "
         "h[\"alloc_count\"]==%d and h[\"free_count\"]==%d and "
         "1<=h[\"device_alloc_count\"]<=%d and h[\"reserved_bytes\"]>0 and "
         "h[\"peak_reserved_bytes\"]>=h[\"reserved_bytes\"] else 1)' %s",
         2 * N + 1, 2 * N + 1, 2 * N + 1, MAX_CHUNKS, report),
      0, "report: %s", (slurp(report, r.out, sizeof r.out), r.out));
  cr_assert_eq(
      sh("python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); "
         "ev=d[\"traceEvents\"]; "
         "a=sum(1 for e in ev if e.get(\"name\")==\"pinned\"); "
         "f=sum(1 for e in ev if e.get(\"name\")==\"pinned_free\"); "
         "sys.exit(0 if a==%d and f==%d else 1)' %s",
         2 * N + 1, 2 * N + 1, trace),
      0);
  unlink(trace);
  unlink(report);
  rmdir(dir);
}

/* A free through the wrong call (cudaFreeHost of a cudaMalloc buffer,
 * cudaFree of a pinned one) is refused and changes nothing: the buffer's
 * own free then succeeds and nothing is left live. The refused
 * cudaFreeHost used to put the block back without its pool, so the later
 * cudaFree failed and the block leaked. */
Test(preload_pinned_runtime, a_free_with_the_wrong_call_leaves_the_buffer) {
  run_and_check_report("2", "wrong-free",
                       "sys.exit(0 if d[\"live_bytes\"]==0 and "
                       "d[\"pool\"][\"allocated_bytes\"]==0 and "
                       "d[\"host_pool\"][\"allocated_bytes\"]==0 else 1)");
}

/* 0 bytes: the runtime's cudaMallocHost and cudaHostAlloc succeed with a
 * NULL pointer (programs and frameworks ask for empty staging buffers:
 * PyTorch's pinned allocator called cudaHostAlloc with 0 before it learned
 * to skip it, Triton's pinned pool with a size of 0), as the runtime's
 * cudaMalloc does, which the shim already answers so (runtime.c). The
 * host pool path refused them with cudaErrorInvalidValue. Nothing is
 * allocated, recorded or counted. */
Test(preload_pinned_runtime, zero_bytes_is_success_with_a_null_pointer) {
  run_and_check_report("1", "zero",
                       "sys.exit(0 if d[\"calls\"].get(\"pinned\", 0)==0 and "
                       "d[\"live_bytes\"]==0 else 1)");
  cr_assert(strstr(r.out, "ok\n") != NULL, "%s", r.out);
}
