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
