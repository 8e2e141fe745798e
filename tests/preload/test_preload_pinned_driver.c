/* test_preload_pinned_driver.c - cuMemHostAlloc, cuMemAllocHost_v2 and
 * cuMemFreeHost of a driver-API program on the fake libcuda.so.1, under
 * the shim on the cuda backend: the host pool serves them with a few
 * page-locked chunks from the driver, write-combined memory and pointers
 * the pool did not hand out go to the driver, the report counts them and
 * the JSON trace marks each. Memory the program registers
 * (cuMemHostRegister) stays the driver's: neither counted nor traced.
 * Without the shim every request is a driver call. */
#include "spawn.h"

#define N 40

static spawn_result_t r;

static void run(bool shim, const char *report, const char *trace) {
  char env_report[256], env_trace[256], n[16];
  snprintf(env_report, sizeof env_report, "MEMPOOL_REPORT=%s", report);
  snprintf(env_trace, sizeof env_trace, "MEMPOOL_TRACE=%s", trace);
  snprintf(n, sizeof n, "%d", N);
  const char *argv[] = {MP_PINNED_DRV_PROG, n, NULL};
  const char *env[] = {shim ? "LD_PRELOAD=" MP_SHIM : "LD_PRELOAD=",
                       "MEMPOOL_DEVICE=cuda", env_report, env_trace, NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert(strstr(r.out, "ok\n") != NULL, "%s", r.out);
}

Test(preload_pinned_driver, without_the_shim_every_request_is_a_driver_call) {
  run(false, "/dev/null", "");
  cr_assert_eq(word_value(r.out, "driver_host_allocs"), 2 * N + 1);
}

Test(preload_pinned_driver, host_pool_serves_pinned_memory_on_the_fake) {
  char dir[64], report[128], trace[128];
  scratch_dir(dir, sizeof dir);
  snprintf(report, sizeof report, "%s/report.json", dir);
  snprintf(trace, sizeof trace, "%s/trace.json", dir);
  run(true, report, trace);
  /* The pool's one chunk, plus the write-combined one: each buffer is
   * freed before the next is asked for, and cuMemFreeHost, which
   * synchronizes the devices, hands it back at once (under load a free
   * that waited for a marker made the pool grow: a CI run saw 3 chunks). */
  long long drv = word_value(r.out, "driver_host_allocs");
  cr_assert_eq(drv, 2, "%lld driver allocations: %s", drv, r.out);
  cr_assert_eq(
      sh("python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); "
         "h=d[\"host_pool\"]; "
         "sys.exit(0 if d[\"device\"].startswith(\"cuda\") and "
         "d[\"calls\"][\"pinned\"]==%d and "
         "h[\"alloc_count\"]==%d and h[\"free_count\"]==%d and "
         "h[\"device_alloc_count\"]==%lld and "
         "h[\"peak_reserved_bytes\"]>=h[\"reserved_bytes\"]>0 else 1)' %s",
         2 * N + 1, 2 * N, 2 * N, drv - 1, report),
      0, "report: %s", (slurp(report, r.out, sizeof r.out), r.out));
  /* Every pinned allocation and free is an event of the trace, with its
   * address and size: the same addresses freed as allocated. The
   * registered buffer is none of them. */
  long long reg = word_value(r.out, "registered");
  cr_assert_gt(reg, 0, "%s", r.out);
  cr_assert_eq(
      sh("python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); "
         "ev=d[\"traceEvents\"]; "
         "a=[e[\"args\"] for e in ev if e.get(\"name\")==\"pinned\"]; "
         "f=[e[\"args\"] for e in ev if e.get(\"name\")==\"pinned_free\"]; "
         "ok=len(a)==%d and len(f)==%d and all(x[\"size\"]>0 for x in a); "
         "ok=ok and sorted(x[\"ptr\"] for x in a)==sorted(x[\"ptr\"] for x "
         "in f); "
         "ok=ok and all(int(x[\"ptr\"],16)!=%lld for x in a+f); "
         "sys.exit(0 if ok else 1)' %s",
         2 * N + 1, 2 * N + 1, reg, trace),
      0, "trace: %s", trace);
  unlink(trace);
  unlink(report);
  rmdir(dir);
}

/* pinned_drv_prog's mode (double_free, bad_flags), with or without the
 * shim: it must answer as the driver does. */
static void run_mode_with(bool shim, const char *mode, const char *device,
                          const char *extra) {
  const char *argv[] = {MP_PINNED_DRV_PROG, "1", mode, NULL};
  const char *env[] = {shim ? "LD_PRELOAD=" MP_SHIM : "LD_PRELOAD=", device,
                       extra, NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert(strstr(r.out, "ok\n") != NULL, "%s", r.out);
}

static void run_mode(bool shim, const char *mode) {
  run_mode_with(shim, mode, "MEMPOOL_DEVICE=cuda", NULL);
}

/* run_mode on a fake driver with two devices. */
static void run_mode_on_two(bool shim, const char *mode) {
  run_mode_with(shim, mode, "MEMPOOL_DEVICE=cuda", "FAKECUDA_DEVICE_COUNT=2");
}

/* cuMemFreeHost(NULL) is the driver's CUDA_ERROR_INVALID_VALUE under the
 * shim too, also with the host device serving pinned memory (which
 * answered success, as cudaFreeHost(NULL) is). */
Test(preload_pinned_driver, a_free_of_null_is_the_drivers_answer) {
  run_mode(false, "free_null");
  run_mode(true, "free_null");
  run_mode_with(true, "free_null", "MEMPOOL_DEVICE=host", NULL);
}

/* A page-locked block is any device's (the host pool's chunks are
 * PORTABLE): its cuMemFreeHost waits for the work of every device the
 * shim has, not only the first one's, before the pool hands it out again. */
Test(preload_pinned_driver, under_the_shim_a_free_waits_for_other_devices) {
  run_mode_on_two(true, "other_device");
}

/* Page-locked memory is the context's that allocated it: a reset of device
 * 0 leaves a block asked for while device 1 was current (its content, its
 * flags, its free) and takes device 0's. Under the shim one host pool
 * served both from chunks of device 0's primary context, so the reset
 * took device 1's block too; each device has its own pool now. */
Test(preload_pinned_driver,
     without_the_shim_a_reset_leaves_other_devices_pinned_memory) {
  run_mode_on_two(false, "other_reset");
}

Test(preload_pinned_driver,
     under_the_shim_a_reset_leaves_other_devices_pinned_memory) {
  run_mode_on_two(true, "other_reset");
}

/* A second cuMemFreeHost of a block the host pool served is refused as the
 * driver refuses it: passed on, it would free the pool's chunk under it. */
Test(preload_pinned_driver, without_the_shim_a_second_free_is_refused) {
  run_mode(false, "double_free");
}

Test(preload_pinned_driver, under_the_shim_a_second_free_is_refused) {
  run_mode(true, "double_free");
}

/* The device-memory frees (cuMemFree, cuMemFreeAsync, and cudaFree of a
 * stand-in runtime over the driver) of page-locked memory: an address
 * inside a live block, and a block freed already. Each is the driver's
 * CUDA_ERROR_INVALID_VALUE and leaves the block to its cuMemFreeHost.
 * Under the shim the address lies in a chunk of the host pool, which the
 * driver allocated for the pool, not for the program: the shim passed it
 * on to the driver all the same (it looked only in the device pools),
 * handing the driver a pointer inside, or at the start of, one of its own
 * live page-locked allocations. It answers them itself now, as it does
 * for the device pools' memory: no call reaches the driver. */
static void run_device_free(bool shim) {
  const char *argv[] = {MP_PINNED_DRV_PROG, "1", "device_free",
                        MP_STAND_RUNTIME, NULL};
  const char *env[] = {shim ? "LD_PRELOAD=" MP_SHIM : "LD_PRELOAD=",
                       "MEMPOOL_DEVICE=cuda", NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert(strstr(r.out, "ok\n") != NULL, "%s", r.out);
}

Test(preload_pinned_driver,
     without_the_shim_a_device_free_of_pinned_memory_is_refused) {
  run_device_free(false);
  cr_assert_eq(word_value(r.out, "driver_frees"), 5, "%s", r.out);
}

Test(preload_pinned_driver,
     under_the_shim_a_device_free_of_pinned_memory_stays_off_the_driver) {
  run_device_free(true);
  cr_assert_eq(word_value(r.out, "driver_frees"), 0,
               "a pointer in the host pool's chunk reached the driver: %s",
               r.out);
}

/* Page-locked memory through the entry points cuGetProcAddress answers
 * (nvcc's static runtime, cuda-python): the real driver's cuMemFreeHost
 * was given blocks inside the host pool's chunks (refused, or the chunk
 * freed under the pool), and its allocations bypassed the pool. Under the
 * shim the pool serves them all: one chunk from the driver. */
Test(preload_pinned_driver, without_the_shim_looked_up_entry_points_agree) {
  run_mode(false, "proc");
  cr_assert_eq(word_value(r.out, "driver_host_allocs"), 6);
}

Test(preload_pinned_driver, under_the_shim_looked_up_entry_points_agree) {
  run_mode(true, "proc");
  cr_assert_eq(word_value(r.out, "driver_host_allocs"), 1, "%s", r.out);
}

/* Mapped page-locked memory (CU_MEMHOSTALLOC_DEVICEMAP, the runtime's
 * cudaHostAllocMapped: zero-copy buffers) has a device pointer:
 * cuMemHostGetDevicePointer "will fail if the CU_MEMHOSTALLOC_DEVICEMAP
 * flag was not specified at the time the memory was allocated" (cuda.h).
 * The host pool served such requests from chunks made PORTABLE only, so
 * under the shim the program's cuMemHostGetDevicePointer failed. */
Test(preload_pinned_driver,
     without_the_shim_mapped_memory_has_a_device_pointer) {
  run_mode(false, "mapped");
}

Test(preload_pinned_driver, under_the_shim_mapped_memory_has_a_device_pointer) {
  run_mode(true, "mapped");
}

/* cuMemHostGetFlags "Passes back the flags pFlags that were specified when
 * allocating the pinned host buffer p" and "will fail if the pointer does
 * not reside in an allocation performed by cuMemAllocHost() or
 * cuMemHostAlloc()" (cuda.h). Under the shim it reached the driver, which
 * answered the host pool chunk's flags (PORTABLE | DEVICEMAP) for every
 * block, and success for a block the program had freed. */
Test(preload_pinned_driver,
     without_the_shim_host_flags_are_the_ones_asked_for) {
  run_mode(false, "flags");
}

Test(preload_pinned_driver, under_the_shim_host_flags_are_the_ones_asked_for) {
  run_mode(true, "flags");
}

/* cuPointerGetAttribute's RANGE_START_ADDR and RANGE_SIZE are "the
 * allocation referenced by the device pointer ptr" (cuda.h), which for
 * page-locked memory under unified addressing is its host address. Under
 * the shim the driver answered the host pool's whole chunk: a library that
 * registers or caches by that range (as for device memory, which the shim
 * answers with the block) took in other blocks' memory. */
Test(preload_pinned_driver, without_the_shim_a_pinned_range_is_its_allocation) {
  run_mode(false, "range");
}

Test(preload_pinned_driver, under_the_shim_a_pinned_range_is_its_allocation) {
  run_mode(true, "range");
}

/* cuMemHostGetDevicePointer "Passes back the device pointer pdptr
 * corresponding to the mapped, pinned host buffer p allocated by
 * cuMemHostAlloc" (cuda.h); memory the program freed is no such buffer:
 * CUDA_ERROR_INVALID_VALUE. Under the shim the driver answered for a freed
 * block too (the host pool's chunk holding it stays registered). */
Test(preload_pinned_driver,
     without_the_shim_a_freed_block_has_no_device_pointer) {
  run_mode(false, "devptr");
}

Test(preload_pinned_driver,
     under_the_shim_a_freed_block_has_no_device_pointer) {
  run_mode(true, "devptr");
}

/* cuMemGetAddressRange gives "the allocation ... that contains the input
 * pointer dptr" (cuda.h); with unified addressing a page-locked block's
 * host address is its device pointer, so its range is the block's, as
 * cuPointerGetAttribute's RANGE_START_ADDR says. Under the shim the driver
 * answered the host pool's whole chunk for a live block and its range
 * for a freed one. */
Test(preload_pinned_driver,
     without_the_shim_a_pinned_address_range_is_its_allocation) {
  run_mode(false, "addr_range");
}

Test(preload_pinned_driver,
     under_the_shim_a_pinned_address_range_is_its_allocation) {
  run_mode(true, "addr_range");
}

/* Page-locked calls while a capture is under way answer as the driver
 * does (cuda.h, cuThreadExchangeStreamCaptureMode: they are potentially
 * unsafe calls). Relaxed: both succeed and the capture stays valid; under
 * the shim the free synchronized the devices (cuCtxSynchronize, refused
 * during a capture), failed with CUDA_ERROR_UNKNOWN and invalidated the
 * program's capture. Global: both are
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidate it; under the shim
 * the allocation succeeded from the pool. */
static void run_capture_as(bool shim, const char *how, const char *mode) {
  char dir[64], report[128], e1[160];
  scratch_dir(dir, sizeof dir);
  snprintf(report, sizeof report, "%s/report.json", dir);
  snprintf(e1, sizeof e1, "MEMPOOL_REPORT=%s", report);
  const char *argv[] = {MP_PINNED_DRV_PROG, "1", how, mode, NULL};
  const char *env[] = {shim ? "LD_PRELOAD=" MP_SHIM : "LD_PRELOAD=",
                       "MEMPOOL_DEVICE=cuda", e1, NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert(strstr(r.out, "ok\n") != NULL, "%s", r.out);
  /* A block freed during the capture went back to the host pool at the
   * first call after it, or at exit: nothing is left allocated there. */
  if (shim)
    cr_assert_eq(
        sh("python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); "
           "h=d[\"host_pool\"]; "
           "sys.exit(0 if h[\"allocated_bytes\"]==0 and "
           "h[\"alloc_count\"]==h[\"free_count\"] else 1)' %s",
           report),
        0, "report: %s", (slurp(report, r.out, sizeof r.out), r.out));
  unlink(report);
  rmdir(dir);
}

static void run_capture(bool shim, const char *mode) {
  run_capture_as(shim, "capture", mode);
}

/* A block freed during a capture, and no page-locked call after it: the
 * exit report counted it still allocated in the host pool (a leak the
 * program did not make). */
Test(preload_pinned_driver,
     under_the_shim_a_block_freed_in_a_capture_is_free_in_the_exit_report) {
  run_capture_as(true, "capture_exit", NULL);
}

Test(preload_pinned_driver,
     without_the_shim_pinned_calls_in_a_relaxed_capture) {
  run_capture(false, "relaxed");
}

Test(preload_pinned_driver, under_the_shim_pinned_calls_in_a_relaxed_capture) {
  run_capture(true, "relaxed");
}

Test(preload_pinned_driver, without_the_shim_pinned_calls_in_a_global_capture) {
  run_capture(false, "global");
}

Test(preload_pinned_driver, under_the_shim_pinned_calls_in_a_global_capture) {
  run_capture(true, "global");
}

/* Flags no driver knows: the host pool served them (CUDA_SUCCESS). */
Test(preload_pinned_driver, without_the_shim_unknown_flags_are_refused) {
  run_mode(false, "bad_flags");
}

Test(preload_pinned_driver, under_the_shim_unknown_flags_are_refused) {
  run_mode(true, "bad_flags");
}

/* A process whose first pinned call reaches the driver (write-combined
 * memory; every call in passthrough mode) and that loads the CUDA runtime
 * only afterwards: the shim looked the runtime up on that first call,
 * found none and kept the empty answer, so every runtime call the shim
 * passes on (cudaMalloc in passthrough mode, cudaMallocManaged in any)
 * failed with cudaErrorInitializationError (3) for the rest of the
 * process. */
static void run_late_runtime(const char *mode_env) {
  const char *argv[] = {MP_PINNED_DRV_PROG, "1", "late_runtime",
                        MP_LATE_RUNTIME, NULL};
  const char *env[] = {"LD_PRELOAD=" MP_SHIM, "MEMPOOL_DEVICE=cuda", mode_env,
                       NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert(strstr(r.out, "ok\n") != NULL, "%s", r.out);
}

Test(preload_pinned_driver, a_runtime_loaded_after_a_driver_pinned_call) {
  run_late_runtime("MEMPOOL_PRELOAD=passthrough");
}
