/* test_preload_rules.c - CUDA's rules kept under the shim, on the strict
 * fake libcuda.so.1 (tests/fakecuda): rules_prog relies on cuMemFree's
 * ordering. Without the shim the fake keeps it; under the shim the pool
 * must (the shim adds the program's streams to the pool and frees with
 * mp_pool_free_after_all). */
#include "spawn.h"

static spawn_result_t r;

/* rules_prog MODE [ARG] (MODE NULL: its default rule) run with preload
 * (LD_PRELOAD=... or none) and the pool options conf (NULL: none) on the
 * fake driver's cuda device: it must say "ok". */
static void rules_ok(const char *preload, const char *conf, const char *mode,
                     const char *arg) {
  const char *argv[] = {MP_RULES_PROG, mode, mode ? arg : NULL, NULL};
  const char *env[] = {preload, "MEMPOOL_DEVICE=cuda", conf, NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert_str_eq(r.out, "ok\n");
}

Test(preload_rules, without_the_shim_mem_free_keeps_cuda_ordering) {
  rules_ok("LD_PRELOAD=", NULL, NULL, NULL);
}

Test(preload_rules, under_the_shim_mem_free_keeps_cuda_ordering) {
  rules_ok("LD_PRELOAD=" MP_SHIM, NULL, NULL, NULL);
}

/* Streams the program destroys are forgotten: 70 000 made and destroyed in
 * turn (more than a pool's table holds at once) are all served, and no
 * destroyed handle is ever used. */
Test(preload_rules, under_the_shim_destroyed_streams_are_forgotten,
     .timeout = 300) {
  rules_ok("LD_PRELOAD=" MP_SHIM, NULL, "streams", NULL);
}

/* A cuStreamDestroy the driver refuses (here a stream of the primary
 * context, destroyed while a context the program made is current) changes
 * nothing: the stream lives on, and a cuMemFree still waits for its work.
 * The shim made the pools forget the stream before the real destroy and
 * left it forgotten when the destroy failed: the freed block went to the
 * next allocation while the stream's kernel still read it. */
Test(preload_rules, without_the_shim_a_refused_stream_destroy_changes_nothing) {
  rules_ok("LD_PRELOAD=", NULL, "refused_destroy", NULL);
}

Test(preload_rules, under_the_shim_a_refused_stream_destroy_changes_nothing) {
  rules_ok("LD_PRELOAD=" MP_SHIM, NULL, "refused_destroy", NULL);
}

/* CU_STREAM_PER_THREAD is another stream in each thread, under the shim as
 * without it: a block thread A freed on its per-thread stream while A's
 * kernel still reads it is not thread B's to overwrite. */
static void per_thread_rules(const char *preload) {
  rules_ok(preload, NULL, "per_thread", NULL);
}

Test(preload_rules, without_the_shim_per_thread_streams_are_apart) {
  per_thread_rules("LD_PRELOAD=");
}

Test(preload_rules, under_the_shim_per_thread_streams_are_apart) {
  per_thread_rules("LD_PRELOAD=" MP_SHIM);
}

/* A block freed with cuMemFreeAsync on another thread's per-thread stream
 * than the one it was allocated on (the same handle, another stream) is
 * freed on the freeing thread's stream: the allocating thread's stream
 * may not reuse it before the freeing stream's kernel is done. */
static void per_thread_free_rules(const char *preload) {
  rules_ok(preload, NULL, "per_thread_free", NULL);
}

Test(preload_rules, without_the_shim_a_free_on_another_threads_stream) {
  per_thread_free_rules("LD_PRELOAD=");
}

Test(preload_rules, under_the_shim_a_free_on_another_threads_stream) {
  per_thread_free_rules("LD_PRELOAD=" MP_SHIM);
}

/* cuMemFree of a block a kernel still reads on the per-thread stream of a
 * thread that never allocated (the shim never met that stream): the block
 * is not handed to another stream before that kernel is done. The shim
 * waits for it through the legacy stream, which a per-thread stream (a
 * blocking one) is ordered with; under the shim the pool is capped at the
 * two blocks the program holds, so the allocation gets the freed block
 * itself (rules_prog checks it) and must wait rather than grow. */
Test(preload_rules,
     without_the_shim_an_unseen_per_thread_stream_is_waited_for) {
  rules_ok("LD_PRELOAD=", NULL, "unseen_per_thread", NULL);
}

Test(preload_rules, under_the_shim_an_unseen_per_thread_stream_is_waited_for) {
  rules_ok("LD_PRELOAD=" MP_SHIM, "MEMPOOL_CONF=max_bytes=2M",
           "unseen_per_thread", "same");
}

/* A stream made after another was destroyed may get its handle (a driver
 * may reuse it; the fake does with FAKECUDA_REUSE_STREAMS=1): a block
 * allocated on the dead stream and freed with cuMemFreeAsync on the new
 * one is freed on the new one, not on the dead one whose work is done, so
 * a third stream may not reuse it before the new stream's kernel is. */
static void reused_handle_rules(const char *preload) {
  const char *argv[] = {MP_RULES_PROG, "reused_handle", NULL};
  const char *env[] = {preload, "MEMPOOL_DEVICE=cuda",
                       "FAKECUDA_REUSE_STREAMS=1", NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert_str_eq(r.out, "ok\n");
}

Test(preload_rules, without_the_shim_a_free_on_a_reused_stream_handle) {
  reused_handle_rules("LD_PRELOAD=");
}

Test(preload_rules, under_the_shim_a_free_on_a_reused_stream_handle) {
  reused_handle_rules("LD_PRELOAD=" MP_SHIM);
}

/* A second cuMemFree of a block is the driver's error under the shim too,
 * with the pool's memory in plain segments (a block at a segment's start
 * has the address the driver gave the pool): the free must not reach the
 * driver and free the pool's segment under it. */
static void double_free_rules(const char *preload, const char *conf) {
  rules_ok(preload, conf, "double_free", NULL);
}

Test(preload_rules, without_the_shim_a_second_free_is_refused) {
  double_free_rules("LD_PRELOAD=", "MEMPOOL_CONF=");
}

Test(preload_rules, under_the_shim_a_second_free_is_refused) {
  double_free_rules("LD_PRELOAD=" MP_SHIM, "MEMPOOL_CONF=virtual=0");
  double_free_rules("LD_PRELOAD=" MP_SHIM, "MEMPOOL_CONF=virtual=1");
}

/* A freed pool block answers cuMemGetAddressRange and cuPointerGetAttribute
 * as freed memory does without the shim, not with the cached segment that
 * holds it (virtual=0) or the chunk mapped there (virtual=1). */
static void freed_range_rules(const char *preload, const char *conf) {
  rules_ok(preload, conf, "freed_range", NULL);
}

Test(preload_rules, without_the_shim_a_freed_block_has_no_range) {
  freed_range_rules("LD_PRELOAD=", "MEMPOOL_CONF=");
}

Test(preload_rules, under_the_shim_a_freed_block_has_no_range) {
  freed_range_rules("LD_PRELOAD=" MP_SHIM, "MEMPOOL_CONF=virtual=0");
  freed_range_rules("LD_PRELOAD=" MP_SHIM, "MEMPOOL_CONF=virtual=1");
}

/* A context the program makes (cuCtxCreate) is not the primary context the
 * pool's memory lives in: its allocations are the driver's, in it, and go
 * with it when the program destroys it (with its streams, which no free
 * may touch afterwards). */
static void own_context_rules(const char *preload) {
  rules_ok(preload, NULL, "own_context", NULL);
}

Test(preload_rules, without_the_shim_a_destroyed_context_takes_its_memory) {
  own_context_rules("LD_PRELOAD=");
}

Test(preload_rules, under_the_shim_a_destroyed_context_takes_its_memory) {
  own_context_rules("LD_PRELOAD=" MP_SHIM);
}

/* A stream of a context the program made (cuCtxCreate) on device 0 or 1,
 * used while device 0's primary context is current: its stream-ordered
 * allocations get what the driver gives them, under the shim as without
 * it, a block of the current context may be freed on it (the shim waits
 * for the stream, which the pool cannot order on), and the shim neither
 * makes a pool for that context's device nor
 * creates the device's primary context to tell (the stream's creation
 * under the shim made device 1's pool, and with it its primary context,
 * before). */
static void other_context_rules(const char *ordinal, const char *count) {
  const char *argv[] = {MP_RULES_PROG, "other_context", ordinal, NULL};
  const char *none[] = {"LD_PRELOAD=", "MEMPOOL_DEVICE=cuda", count, NULL};
  const char *shim[] = {"LD_PRELOAD=" MP_SHIM, "MEMPOOL_DEVICE=cuda", count,
                        NULL};
  spawn(argv, none, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert(strstr(r.out, "primary retains 0,") != NULL, "%s", r.out);
  /* The driver served both (the fake refused the stream, 400, until it
   * found streams of a made context from another one: then the two runs
   * agreed on a refusal, and the shim's free answered 1 to the driver's
   * 400). */
  char served[64];
  snprintf(served, sizeof served, "allocation 0 on device %s,", ordinal);
  cr_assert(strstr(r.out, served) != NULL, "%s", r.out);
  cr_assert(strstr(r.out, "freed on it 0\n") != NULL, "%s", r.out);
  static char driver[sizeof r.out];
  snprintf(driver, sizeof driver, "%s", r.out);
  spawn(argv, shim, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert_str_eq(r.out, driver);
}

Test(preload_rules, a_made_contexts_stream_is_the_drivers) {
  other_context_rules("0", NULL);
  other_context_rules("1", "FAKECUDA_DEVICE_COUNT=2");
}

/* Stream-ordered pairs on a stream of the current primary context: the
 * stream's context names the device's pool, so the shim asks the driver
 * neither for the current context nor for its device (it asked twice and
 * once per allocation before). */
Test(preload_rules, a_streams_context_names_its_pool_without_more_questions) {
  const char *argv[] = {MP_RULES_PROG, "pair_calls", NULL};
  const char *shim[] = {"LD_PRELOAD=" MP_SHIM, "MEMPOOL_DEVICE=cuda", NULL};
  spawn(argv, shim, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert_str_eq(r.out, "context questions 0\n");
}

/* cuMemAlloc and cuMemFree during a global-mode capture of a non-blocking
 * stream (the legacy stream never meets it) are refused as the driver
 * refuses them, the capture invalidated, the block kept: the pool served
 * them (CUDA_SUCCESS), the free while the pool's events met the capture. */
static void calls_in_capture_rules(const char *preload, const char *how) {
  rules_ok(preload, NULL, "calls_in_capture", how);
}

Test(preload_rules, without_the_shim_calls_in_a_global_capture_are_refused) {
  calls_in_capture_rules("LD_PRELOAD=", NULL);
  calls_in_capture_rules("LD_PRELOAD=", "per_thread");
}

Test(preload_rules, under_the_shim_calls_in_a_global_capture_are_refused) {
  calls_in_capture_rules("LD_PRELOAD=" MP_SHIM, NULL);
  calls_in_capture_rules("LD_PRELOAD=" MP_SHIM, "per_thread");
}

/* The same with the capture begun by cuStreamBeginCaptureToGraph (CUDA
 * 12.3: a capture into the program's graph, its mode cuStreamBeginCapture's)
 * called directly, found by cuGetProcAddress, and of the per-thread stream:
 * the shim must see it begin as it sees cuStreamBeginCapture. */
static void calls_in_capture_to_graph(const char *preload) {
  rules_ok(preload, NULL, "calls_in_capture", "to_graph");
  rules_ok(preload, NULL, "calls_in_capture", "to_graph_proc");
  rules_ok(preload, NULL, "calls_in_capture", "to_graph_per_thread");
}

Test(preload_rules,
     without_the_shim_calls_in_a_capture_to_a_graph_are_refused) {
  calls_in_capture_to_graph("LD_PRELOAD=");
}

Test(preload_rules, under_the_shim_calls_in_a_capture_to_a_graph_are_refused) {
  calls_in_capture_to_graph("LD_PRELOAD=" MP_SHIM);
}

/* cuMemFree of a pool block during a capture is refused exactly where the
 * driver refuses it, in every capture mode, from a thread in every mode,
 * the one that began the capture or another (cuda.h,
 * cuThreadExchangeStreamCaptureMode): the same lines with and without the
 * shim. */
static void answers_as_without_the_shim(const char *mode, const char *rt,
                                        const char *refused) {
  static spawn_result_t base;
  const char *argv[] = {MP_RULES_PROG, mode, rt ? "rt" : NULL, rt, NULL};
  const char *none[] = {"LD_PRELOAD=", "MEMPOOL_DEVICE=cuda", NULL};
  const char *shim[] = {"LD_PRELOAD=" MP_SHIM, "MEMPOOL_DEVICE=cuda", NULL};
  spawn(argv, none, &base);
  cr_assert(base.exited && base.code == 0, "out: %s\nerr: %s", base.out,
            base.err);
  cr_assert_neq(strstr(base.out, refused), NULL, "%s", base.out);
  spawn(argv, shim, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert_str_eq(r.out, base.out);
}

Test(preload_rules, under_the_shim_frees_in_a_capture_answer_as_the_driver) {
  answers_as_without_the_shim("free_modes", NULL, "free 900, end 901");
}

/* A second free of a pool block during a capture, the block freed before
 * it: refused as the driver refuses it, with the capture error where the
 * capture prohibits the call in the freeing thread's mode (the fake driver
 * asks that first, as cuda.h words it: such a thread "is prohibited from
 * potentially unsafe API calls", cuThreadExchangeStreamCaptureMode), and
 * the capture then invalidated; else as memory the driver does not know.
 * The shim answered CUDA_ERROR_INVALID_VALUE in every mode and left the
 * capture valid (lines "free 1, end 0"). */
Test(preload_rules, under_the_shim_second_frees_in_a_capture_answer_alike) {
  answers_as_without_the_shim("double_free_modes", NULL, "free 900, end 901");
}

Test(preload_rules,
     under_the_shim_runtime_second_frees_in_a_capture_answer_alike) {
  answers_as_without_the_shim("double_free_modes", MP_STAND_RUNTIME,
                              "free 900, end 901");
}

Test(preload_rules,
     under_the_shim_second_page_locked_frees_in_a_capture_answer_alike) {
  answers_as_without_the_shim("double_free_host_modes", NULL,
                              "free 900, end 901");
}

/* The runtime's cudaFree and cudaMalloc (of a stand-in runtime over the
 * fake driver, as the real one calls the driver) during a capture: the
 * shim serves the pool's blocks itself, and must refuse where the runtime
 * would (cudaErrorStreamCaptureUnsupported, the capture invalidated),
 * including captures of non-blocking streams, which the legacy stream
 * does not report. */
Test(preload_rules, under_the_shim_runtime_frees_in_a_capture_answer_alike) {
  answers_as_without_the_shim("free_modes", MP_STAND_RUNTIME,
                              "free 900, end 901");
}

Test(preload_rules, under_the_shim_runtime_mallocs_in_a_capture_answer_alike) {
  answers_as_without_the_shim("alloc_modes", MP_STAND_RUNTIME,
                              "alloc 900, end 901");
}

/* A cudaFree the shim answers itself (a double free, an interior pointer
 * of its pool's memory: cudaErrorInvalidValue) is also the runtime's last
 * error, as the runtime's own refusal is (cudaGetLastError, then
 * cudaSuccess); before, the runtime's last error stayed cudaSuccess. */
Test(preload_rules, under_the_shim_a_refused_cuda_free_is_the_last_error) {
  answers_as_without_the_shim("last_error", MP_STAND_RUNTIME,
                              "double free 1, last error 1 then 0; interior "
                              "1, last error 1 then 0");
}

/* cudaMallocAsync / cudaFreeAsync on another device's stream: the stream's
 * device serves, without the shim and under it (where the pool of device
 * 1 serves, not the driver); the shim refused both before. */
Test(preload_rules, runtime_stream_ordered_calls_follow_the_streams_device) {
  const char *argv[] = {MP_RULES_PROG, "cross_device", "rt", MP_STAND_RUNTIME,
                        NULL};
  const char *none[] = {"LD_PRELOAD=", "MEMPOOL_DEVICE=cuda",
                        "FAKECUDA_DEVICE_COUNT=2", NULL};
  const char *shim[] = {"LD_PRELOAD=" MP_SHIM, "MEMPOOL_DEVICE=cuda",
                        "FAKECUDA_DEVICE_COUNT=2", NULL};
  spawn(argv, none, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert_str_eq(r.out, "ordinals 1 0, driver allocations 2\n");
  spawn(argv, shim, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert_str_eq(r.out, "ordinals 1 0, driver allocations 0\n");
}

/* A cudaMallocAsync the shim's pool refuses for want of memory sets the
 * runtime's last error with a call of the runtime's own (cudaMalloc of
 * SIZE_MAX), in relaxed capture mode: in the caller's (global) mode it
 * would invalidate another thread's global capture. */
static void oom_in_capture_rules(const char *preload) {
  const char *argv[] = {MP_RULES_PROG, "oom_in_capture", "rt", MP_STAND_RUNTIME,
                        NULL};
  const char *env[] = {preload, "MEMPOOL_DEVICE=cuda",
                       "MEMPOOL_CONF=max_bytes=64M", NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert_str_eq(r.out, "ok\n");
}

Test(preload_rules, without_the_shim_an_oom_leaves_a_global_capture_valid) {
  oom_in_capture_rules("LD_PRELOAD=");
}

Test(preload_rules, under_the_shim_an_oom_leaves_a_global_capture_valid) {
  oom_in_capture_rules("LD_PRELOAD=" MP_SHIM);
}

Test(preload_rules, under_the_shim_mallocs_in_a_capture_answer_as_the_driver) {
  answers_as_without_the_shim("alloc_modes", NULL, "alloc 900, end 901");
}

/* A free that no capture's mode can prohibit in the freeing thread is not
 * checked with the driver: 50 frees during a relaxed capture make no
 * cuMemAlloc (before, each made a one-byte one). */
Test(preload_rules, under_the_shim_frees_no_mode_prohibits_ask_nothing) {
  rules_ok("LD_PRELOAD=" MP_SHIM, NULL, "free_probes", NULL);
}

/* The same with CUDA 10.0's cuStreamBeginCapture (no mode, so global),
 * found by cuGetProcAddress at 10000: the shim must see it begin too. */
Test(preload_rules,
     without_the_shim_calls_in_a_capture_begun_by_v1_are_refused) {
  rules_ok("LD_PRELOAD=", NULL, "calls_in_capture", "v1");
}

Test(preload_rules, under_the_shim_calls_in_a_capture_begun_by_v1_are_refused) {
  rules_ok("LD_PRELOAD=" MP_SHIM, NULL, "calls_in_capture", "v1");
}

/* A host function (cuLaunchHostFunc) "must not make any CUDA API calls"
 * (cuda.h, cuLaunchHostFunc, cuStreamAddCallback): the driver refuses a
 * cuMemFree, cuMemFreeAsync or cuMemFreeHost made from one with
 * CUDA_ERROR_NOT_PERMITTED (800) and the memory stays the program's. The
 * shim served the pool's blocks without a driver call and freed them; it
 * must refuse them as the driver does, and answer the range queries as
 * the driver does there, the same lines with and without it. So too the
 * frees it answers itself, without the driver: a double free, an interior
 * pointer, a page-locked block given to a device free, a page-locked
 * block freed before, a device block given to cuMemFreeHost (before: 1,
 * and under cudaFree a call of the runtime from the host function to raise
 * the runtime's last error). */
Test(preload_rules, under_the_shim_calls_from_a_host_function_are_refused) {
  answers_as_without_the_shim(
      "host_fn", NULL,
      "free 800, free_async 800, host_flags 800, "
      "free_host 800, "
      "mem_info 800, range 800, attribute 800, ipc 800, host_dev 800, "
      "double_free 800, interior 800, pinned 800, host_twice 800, "
      "host_dev_free 800\n"
      "free after 0, again refused\n");
}

/* The same for the runtime's cudaFree and cudaFreeAsync (the stand-in
 * runtime over the fake; cudaErrorNotPermitted is 800 too,
 * driver_types.h). */
Test(preload_rules, under_the_shim_runtime_frees_from_a_host_function_refused) {
  answers_as_without_the_shim(
      "host_fn", MP_STAND_RUNTIME,
      "free 800, free_async 800, host_flags 800, "
      "free_host 800, "
      "mem_info 800, range 800, attribute 800, ipc 800, host_dev 800, "
      "double_free 800, interior 800, pinned 800, host_twice 800, "
      "host_dev_free 800\n"
      "free after 0, again refused\n");
}

/* A free refused in a host function is no free in the trace or the
 * report: three allocations (a block freed before the host function, the
 * block and one more), three frees. */
static void host_fn_traced(const char *rt) {
  char dir[64], trace[128], env_trace[160];
  scratch_dir(dir, sizeof dir);
  snprintf(trace, sizeof trace, "%s/run.csv", dir);
  snprintf(env_trace, sizeof env_trace, "MEMPOOL_TRACE=%s", trace);
  const char *argv[] = {MP_RULES_PROG, "host_fn", rt ? "rt" : NULL, rt, NULL};
  const char *env[] = {"LD_PRELOAD=" MP_SHIM, "MEMPOOL_DEVICE=cuda", env_trace,
                       "MEMPOOL_REPORT=stderr", NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert_eq(count_lines(trace, ",allocate,"), 3, "%s", r.out);
  cr_assert_eq(count_lines(trace, ",free,"), 3, "%s", r.out);
  cr_assert_neq(strstr(r.err, "\"allocate\": 3, "), NULL, "%s", r.err);
  cr_assert_neq(strstr(r.err, "\"free\": 3, "), NULL, "%s", r.err);
  unlink(trace);
  rmdir(dir);
}

Test(preload_rules, a_free_refused_in_a_host_function_is_not_traced) {
  host_fn_traced(NULL);
  host_fn_traced(MP_STAND_RUNTIME);
}
