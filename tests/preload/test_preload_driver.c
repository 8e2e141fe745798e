/* test_preload_driver.c - the driver-API hooks, on the fake libcuda.so.1
 * (tests/fakecuda): direct calls, dlsym and cuGetProcAddress all end in
 * the shim, which serves from the pool on the emulated device or on the
 * cuda backend driving the fake itself (where the pool's own driver calls
 * must reach the real functions, never the hooks), while other names,
 * unknown pointers and other devices stay the driver's. */
#include "spawn.h"

static spawn_result_t r;

Test(preload_driver, without_the_shim_direct_calls_reach_the_driver) {
  const char *argv[] = {MP_DRV_PROG, "plain", NULL};
  const char *env[] = {"LD_PRELOAD=", NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
}

/* extra: one more "K=V" for the environment, or NULL. */
static void preloaded_with(const char *device, const char *report,
                           const char *extra, const char *extra2) {
  char env_device[64], env_report[256];
  snprintf(env_device, sizeof env_device, "MEMPOOL_DEVICE=%s", device);
  snprintf(env_report, sizeof env_report, "MEMPOOL_REPORT=%s", report);
  const char *argv[] = {MP_DRV_PROG, "preloaded", device, NULL};
  const char *env[] = {"LD_PRELOAD=" MP_SHIM,
                       env_device,
                       env_report,
                       "FAKECUDA_DEVICE_COUNT=2",
                       extra,
                       extra2,
                       NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "%s: out: %s\nerr: %s", device, r.out,
            r.err);
  cr_assert_str_eq(r.out, "ok\n");
}

static void preloaded(const char *device, const char *report) {
  preloaded_with(device, report, NULL, NULL);
}

Test(preload_driver, every_route_ends_in_the_shim_on_the_host_device) {
  preloaded("host", "stderr");
  cr_assert(strstr(r.err, "\"mode\": \"pool\"") != NULL, "%s", r.err);
}

/* A cap is what cuMemGetInfo_v2 says on the cuda backend too (the fake's
 * device is 16 GiB, the pool's cap 64 MiB). */
Test(preload_driver, mem_info_reports_the_cap_on_the_cuda_backend) {
  const char *argv[] = {MP_DRV_PROG, "preloaded", "cuda", NULL};
  const char *env[] = {"LD_PRELOAD=" MP_SHIM,        "MEMPOOL_DEVICE=cuda",
                       "MEMPOOL_CONF=max_bytes=64M", "FAKECUDA_DEVICE_COUNT=2",
                       "DRV_PROG_TOTAL=67108864",    NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert_str_eq(r.out, "ok\n");
}

/* cuMemAllocAsync on another device's stream takes from that device (cuda.h:
 * "the memory pool current to the stream's device"), and cuMemFreeAsync
 * orders a free on any stream: the fake driver alone, then the shim. The
 * shim refused both with CUDA_ERROR_INVALID_VALUE (the current device's
 * pool cannot order on another context's stream). */
Test(preload_driver, stream_ordered_calls_follow_the_streams_device) {
  const char *plain[] = {MP_DRV_PROG, "plain", "-", "cross", NULL};
  const char *penv[] = {"LD_PRELOAD=", "FAKECUDA_DEVICE_COUNT=2", NULL};
  spawn(plain, penv, &r);
  cr_assert(r.exited && r.code == 0, "driver: out: %s\nerr: %s", r.out, r.err);
  const char *argv[] = {MP_DRV_PROG, "preloaded", "cuda", "cross", NULL};
  const char *env[] = {"LD_PRELOAD=" MP_SHIM, "MEMPOOL_DEVICE=cuda",
                       "FAKECUDA_DEVICE_COUNT=2", NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "shim: out: %s\nerr: %s", r.out, r.err);
  cr_assert_str_eq(r.out, "ok\n");
}

/* A device whose pool cannot be made is the driver's from then on: its
 * calls cost the shim no more driver calls than a device without the
 * shim's interest (each asked GetState, and where the primary context was
 * active a retain and a release, on every call). Device 1 (1 MiB) gets a
 * cap below the alignment from the fraction that gives device 0 (16 GiB)
 * 10 KiB. */
Test(preload_driver, a_device_without_a_pool_costs_no_driver_calls_per_call) {
  const char *argv[] = {MP_DRV_PROG, "preloaded", "cuda", "failed", NULL};
  const char *env[] = {"LD_PRELOAD=" MP_SHIM,
                       "MEMPOOL_DEVICE=cuda",
                       "MEMPOOL_CONF=max_fraction=0.0000006",
                       "FAKECUDA_DEVICE_COUNT=2",
                       "FAKECUDA_DEVICE=capacity=16G",
                       "FAKECUDA_DEVICE_1=capacity=1M",
                       NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert_str_eq(r.out, "ok\n");
  cr_expect(strstr(r.err, "no pool for CUDA device 1") != NULL, "%s", r.err);
}

/* The same program in passthrough mode, where no device ever gets a pool:
 * the shim still asks whose memory it passes through (for a reset), and
 * answers from the handle it saw last. */
Test(preload_driver, passthrough_costs_no_driver_calls_per_call) {
  const char *argv[] = {MP_DRV_PROG, "preloaded", "cuda", "failed", NULL};
  const char *env[] = {"LD_PRELOAD=" MP_SHIM, "MEMPOOL_PRELOAD=passthrough",
                       "FAKECUDA_DEVICE_COUNT=2", NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert_str_eq(r.out, "ok\n");
}

/* The process-wide pause when a device's pool is made while the others are
 * paused: the resume refused that pool (not paused), paused the others
 * again, and the process could never be resumed. */
Test(preload_driver, resume_after_a_pool_made_while_paused_resumes_the_rest) {
  const char *argv[] = {MP_DRV_PROG, "preloaded", "cuda", "pause", NULL};
  const char *env[] = {"LD_PRELOAD=" MP_SHIM, "MEMPOOL_DEVICE=cuda",
                       "FAKECUDA_DEVICE_COUNT=2", NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert_str_eq(r.out, "ok\n");
}

/* A process-wide resume that fails at one device undoes the others as they
 * were paused: device 0, paused without its content, was paused again
 * with it (a page-locked copy of memory the caller had given up). */
Test(preload_driver, a_failed_resume_pauses_the_others_as_they_were) {
  const char *argv[] = {MP_DRV_PROG, "preloaded", "cuda", "undo", NULL};
  const char *env[] = {"LD_PRELOAD=" MP_SHIM, "MEMPOOL_DEVICE=cuda",
                       "FAKECUDA_DEVICE_COUNT=2",
                       "FAKECUDA_DEVICE_1=capacity=64M", NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert_str_eq(r.out, "ok\n");
}

/* The pool's cuda backend opens the same libcuda.so.1 and resolves it from
 * inside the shim: it must get the driver's functions, or every allocation
 * would recurse into the hooks. */
Test(preload_driver, pool_on_the_cuda_backend_reaches_the_real_driver) {
  char dir[64], report[128];
  scratch_dir(dir, sizeof dir);
  snprintf(report, sizeof report, "%s/report.json", dir);
  preloaded("cuda", report);
  cr_assert_eq(
      sh("python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); "
         "sys.exit(0 if d[\"mode\"]==\"pool\" and "
         "d[\"device\"].startswith(\"cuda:0\") and "
         "d[\"calls\"][\"allocate\"]==5 and d[\"calls\"][\"free\"]==5 and "
         "d[\"bypassed\"][\"other_device\"]==0 and "
         "d[\"pool\"][\"device_alloc_count\"]>=1 else 1)' %s",
         report),
      0, "report: %s", (slurp(report, r.out, sizeof r.out), r.out));
  unlink(report);
  rmdir(dir);
}

/* With MEMPOOL_DEVICE unset the shim asks for the GPU: a driver that fails
 * to start is said on stderr, with the driver's reason, and every call
 * goes to CUDA; the shim never quietly serves from the emulated host
 * device instead. */
Test(preload_driver, a_failing_driver_is_said_not_hidden_behind_host) {
  const char *argv[] = {MP_DRV_PROG, "plain", NULL};
  const char *env[] = {"LD_PRELOAD=" MP_SHIM,
                       "MEMPOOL_DEVICE=", "MEMPOOL_REPORT=stderr",
                       "FAKECUDA_INIT_ERROR=999", NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited, "err: %s", r.err);
  cr_assert(strstr(r.err, "cannot open MEMPOOL_DEVICE 'cuda'") != NULL &&
                strstr(r.err, "CUDA_ERROR_UNKNOWN") != NULL,
            "err: %s", r.err);
  cr_assert(strstr(r.err, "\"mode\": \"passthrough\"") != NULL, "err: %s",
            r.err);
  cr_assert_null(strstr(r.err, "\"device\": \"host"), "err: %s", r.err);
}

/* MEMPOOL_SNAPSHOT with two CUDA devices in use: one pickle holds both
 * pools, each segment says its device and device_traces has one list per
 * ordinal, each with that device's allocations. */
Test(preload_driver, snapshot_holds_every_devices_pool) {
  char dir[64], snap[128], e1[160];
  scratch_dir(dir, sizeof dir);
  snprintf(snap, sizeof snap, "%s/two.pickle", dir);
  snprintf(e1, sizeof e1, "MEMPOOL_SNAPSHOT=%s", snap);
  preloaded_with("cuda", "/dev/null", e1, "MEMPOOL_CONF=history=256");
  cr_assert_eq(
      sh("python3 -c 'import pickle,sys; d=pickle.load(open(sys.argv[1],"
         "\"rb\")); tr=d[\"device_traces\"]; "
         "a=[sum(1 for e in t if e[\"action\"]==\"alloc\") for t in tr]; "
         "devs={s[\"device\"] for s in d[\"segments\"]}; "
         "print(a, devs); "
         "sys.exit(0 if len(tr)==2 and a[0]>0 and a[1]>0 and devs=={0,1} "
         "else 1)' %s",
         snap),
      0, "snapshot %s", snap);
  unlink(snap);
  rmdir(dir);
}
