/* test_preload_reset.c - cuDevicePrimaryCtxReset (cudaDeviceReset) with
 * live pool blocks, on the fake libcuda.so.1 (tests/fakecuda): reset_prog
 * frees a block the reset destroyed (refused) and then allocates, writes
 * and reads back; "proc": the reset cuGetProcAddress answers. The reset
 * destroys the pool's memory with the context: the shim must forget the
 * device's pool and its blocks, never hand out or take back the destroyed
 * memory. */
#include "spawn.h"

static spawn_result_t r;

static void reset_rules(const char *preload, const char *conf,
                        const char *how) {
  const char *argv[] = {MP_RESET_PROG, how, NULL};
  const char *env[] = {preload, "MEMPOOL_DEVICE=cuda", conf, NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert_str_eq(r.out, "ok\n");
}

Test(preload_reset, without_the_shim_a_reset_destroys_the_blocks) {
  reset_rules("LD_PRELOAD=", "MEMPOOL_CONF=", NULL);
  reset_rules("LD_PRELOAD=", "MEMPOOL_CONF=", "proc");
}

Test(preload_reset, under_the_shim_a_reset_forgets_the_pool) {
  reset_rules("LD_PRELOAD=" MP_SHIM, "MEMPOOL_CONF=virtual=0", NULL);
  reset_rules("LD_PRELOAD=" MP_SHIM, "MEMPOOL_CONF=virtual=1", NULL);
}

/* cudaDeviceReset reaches the driver through cuGetProcAddress: the answer
 * for "cuDevicePrimaryCtxReset" must be the shim's too. */
Test(preload_reset, under_the_shim_a_reset_found_by_get_proc_address) {
  reset_rules("LD_PRELOAD=" MP_SHIM, "MEMPOOL_CONF=virtual=0", "proc");
}

/* A binary built before CUDA 11.0 calls the unversioned
 * cuDevicePrimaryCtxReset (cuda.h maps the name to _v2 only for those built
 * after), directly or as cuGetProcAddress answers it at CUDA 10.0: the
 * shim's reset too. Failed before: only _v2 was hooked, the pool kept
 * the destroyed memory and took back a block the reset had destroyed. */
Test(preload_reset,
     without_the_shim_the_unversioned_reset_destroys_the_blocks) {
  reset_rules("LD_PRELOAD=", "MEMPOOL_CONF=", "old");
  reset_rules("LD_PRELOAD=", "MEMPOOL_CONF=", "proc_old");
}

Test(preload_reset, under_the_shim_the_unversioned_reset_forgets_the_pool) {
  reset_rules("LD_PRELOAD=" MP_SHIM, "MEMPOOL_CONF=virtual=0", "old");
  reset_rules("LD_PRELOAD=" MP_SHIM, "MEMPOOL_CONF=virtual=1", "old");
  reset_rules("LD_PRELOAD=" MP_SHIM, "MEMPOOL_CONF=virtual=0", "proc_old");
}

/* Each reset destroys the pool's memory; what the shim kept of the pool
 * (its records, its device) must go too: 200 resets with blocks live and
 * cached leave the heap no bigger than a few bytes a reset (reset_prog
 * "many" measures it). */
Test(preload_reset, without_the_shim_resets_keep_nothing) {
  reset_rules("LD_PRELOAD=", "MEMPOOL_CONF=", "many");
}

Test(preload_reset, under_the_shim_resets_keep_nothing) {
  reset_rules("LD_PRELOAD=" MP_SHIM, "MEMPOOL_CONF=virtual=0", "many");
  reset_rules("LD_PRELOAD=" MP_SHIM, "MEMPOOL_CONF=virtual=1", "many");
}

/* The same with a graph captured (its allocations from a graph pool of
 * the device's pool) alive across each reset, destroyed after it. */
Test(preload_reset, without_the_shim_resets_with_live_graphs_keep_nothing) {
  reset_rules("LD_PRELOAD=", "MEMPOOL_CONF=", "many_graph");
}

Test(preload_reset, under_the_shim_resets_with_live_graphs_keep_nothing) {
  reset_rules("LD_PRELOAD=" MP_SHIM, "MEMPOOL_CONF=virtual=0", "many_graph");
}

/* The reset destroys page-locked memory too (cuda_runtime_api.h,
 * cudaDeviceReset: "memory allocations by ... ::cudaMallocHost"): under
 * the shim the host pool's chunks went with it, so a block from before is
 * not taken back and what is allocated after it comes from new chunks
 * (reset_prog "pinned"). */
Test(preload_reset, without_the_shim_a_reset_destroys_pinned_memory) {
  reset_rules("LD_PRELOAD=", "MEMPOOL_CONF=", "pinned");
}

Test(preload_reset, under_the_shim_a_reset_retires_the_host_pool) {
  reset_rules("LD_PRELOAD=" MP_SHIM, "MEMPOOL_CONF=virtual=0", "pinned");
}

/* Runs reset_prog how under the shim in mode (MEMPOOL_PRELOAD=...) with a
 * JSON trace, and checks the trace's events named alloc and free: four in
 * all, and each address's an allocation then its free, as many times as it
 * was handed out (a free after its allocation, before the address is
 * allocated again). */
static void reset_traced(const char *how, const char *mode, const char *alloc,
                         const char *free_name) {
  char dir[64], trace[128], env_trace[160];
  scratch_dir(dir, sizeof dir);
  snprintf(trace, sizeof trace, "%s/trace.json", dir);
  snprintf(env_trace, sizeof env_trace, "MEMPOOL_TRACE=%s", trace);
  const char *argv[] = {MP_RESET_PROG, how, NULL};
  const char *env[] = {"LD_PRELOAD=" MP_SHIM,
                       "MEMPOOL_DEVICE=cuda",
                       "MEMPOOL_CONF=virtual=0",
                       mode,
                       env_trace,
                       NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert_str_eq(r.out, "ok\n");
  cr_expect_eq(
      sh("python3 -c 'import json,sys; a,f=sys.argv[2],sys.argv[3]; "
         "d=json.load(open(sys.argv[1])); "
         "ev=[(e[\"name\"],e[\"args\"][\"ptr\"]) for e in "
         "d[\"traceEvents\"] if e.get(\"name\") in (a,f)]; "
         "seqs=[[n for n,q in ev if q==p] for p in {p for _,p in ev}]; "
         "ok=len(ev)==4 and all(len(s)%%2==0 and "
         "s==[a,f]*(len(s)//2) for s in seqs); "
         "sys.exit(0 if ok else 1)' %s %s %s",
         trace, alloc, free_name),
      0, "%s %s: the trace's %s/%s events do not pair up (%s)", how, mode,
      alloc, free_name, trace);
  unlink(trace);
  rmdir(dir);
}

/* Write-combined page-locked memory is the driver's (the shim leaves it to
 * the real cuMemHostAlloc) and goes with the reset too: the shim forgets
 * it at the reset, so the trace marks it freed there, and every pinned
 * block of the trace is freed once, after its allocation, before its
 * address is allocated again (reset_prog "pinned_wc"; MEMPOOL_PRELOAD
 * passthrough records the same). Failed before: the block stayed in the
 * shim's table, never freed in the trace, and a driver handing its address
 * out again after the reset was traced as a second allocation of a live
 * block. */
Test(preload_reset, a_reset_frees_write_combined_memory_in_the_trace) {
  reset_traced("pinned_wc", "MEMPOOL_PRELOAD=pool", "pinned", "pinned_free");
  reset_traced("pinned_wc", "MEMPOOL_PRELOAD=passthrough", "pinned",
               "pinned_free");
}

/* Device memory the driver hands out while the shim passes through
 * (MEMPOOL_PRELOAD=passthrough: every cuMemAlloc is the driver's) is the
 * primary context's, destroyed by its reset (cuda.h,
 * cuDevicePrimaryCtxReset: "Destroy all allocations"): the trace marks it
 * freed at the reset (reset_prog "real_dev"); the pool's blocks are traced
 * freed there too. Failed before: the passthrough block stayed in the
 * shim's table, never freed in the trace, and the driver handing its
 * address out again after the reset was traced as a second allocation of
 * a live block. */
Test(preload_reset, a_reset_frees_passthrough_device_memory_in_the_trace) {
  reset_traced("real_dev", "MEMPOOL_PRELOAD=passthrough", "allocate", "free");
  reset_traced("real_dev", "MEMPOOL_PRELOAD=pool", "allocate", "free");
}
