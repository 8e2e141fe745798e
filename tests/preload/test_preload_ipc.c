/* test_preload_ipc.c - sharing device memory with another process under the
 * shim, on the fake libcuda.so.1 (tests/fakecuda): ipc_prog does what
 * PyTorch's CUDA tensor sharing and vLLM's custom all-reduce do (a
 * CUipcMemHandle of the range start the driver answers, plus the offset
 * from it) and checks where the importer's write landed. The shim answers
 * the range with the pool block; a handle names the whole device
 * allocation, so only a block that starts its allocation may have one:
 * any other is refused, never shared at the wrong address. */
#include "spawn.h"

static spawn_result_t r;

/* ipc_prog `which` (or `capable which` where mode is "capable") with the
 * shim (MEMPOOL_CONF=conf; NULL: no shim) and extra ("K=V" or NULL) in the
 * environment. */
static void run_mode(const char *mode, const char *which, const char *conf,
                     const char *extra) {
  char env_conf[128];
  snprintf(env_conf, sizeof env_conf, "MEMPOOL_CONF=%s", conf ? conf : "");
  const char *argv[] = {MP_IPC_PROG, mode ? mode : which, mode ? which : NULL,
                        NULL};
  const char *env[] = {conf ? "LD_PRELOAD=" MP_SHIM : "LD_PRELOAD=",
                       "MEMPOOL_DEVICE=cuda", env_conf, extra, NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "%s: out: %s\nerr: %s", which, r.out,
            r.err);
}

static void run(const char *which, const char *conf, const char *extra) {
  run_mode(NULL, which, conf, extra);
}

Test(preload_ipc, without_the_shim_each_allocation_is_shared) {
  run("first", NULL, NULL);
  cr_assert_str_eq(r.out, "shared\n", "err: %s", r.err);
  run("second", NULL, NULL);
  cr_assert_str_eq(r.out, "shared\n", "err: %s", r.err);
}

/* The first block of a plain segment starts it: the handle is the
 * segment's, opened at the block's address. */
Test(preload_ipc, a_block_that_starts_its_plain_segment_is_shared) {
  run("first", "virtual=0", NULL);
  cr_assert_str_eq(r.out, "shared\n", "err: %s", r.err);
}

/* The second block lies inside the segment. A driver that takes a pointer
 * inside an allocation (FAKECUDA_IPC_INTERIOR=1, as a real one is seen to)
 * would export the segment, and the importer, adding the offset from the
 * block, wrote over the first block: silently wrong before the shim hooked
 * cuIpcGetMemHandle. It is refused now, and says why. */
Test(preload_ipc, a_block_inside_a_plain_segment_is_refused_not_misplaced) {
  run("second", "virtual=0", "FAKECUDA_IPC_INTERIOR=1");
  cr_assert_str_eq(r.out, "refused 801\n", "err: %s", r.err);
  cr_assert(strstr(r.err, "does not start the device allocation") != NULL, "%s",
            r.err);
  run("second", "virtual=0", NULL);
  cr_assert_str_eq(r.out, "refused 801\n", "err: %s", r.err);
}

/* The virtual range is cuMemCreate memory, which has no CUipcMemHandle
 * (cuda.h: "created with ::cuMemAlloc"): refused, with the way out. */
Test(preload_ipc, a_block_of_the_virtual_range_is_refused_with_the_reason) {
  run("first", "virtual=1", NULL);
  cr_assert(strncmp(r.out, "refused ", 8) == 0, "out: %s\nerr: %s", r.out,
            r.err);
  cr_assert(strstr(r.err, "MEMPOOL_CONF=virtual=0") != NULL, "%s", r.err);
  run("second", "virtual=1", "FAKECUDA_IPC_INTERIOR=1");
  cr_assert_str_eq(r.out, "refused 801\n", "err: %s", r.err);
  cr_assert(strstr(r.err, "MEMPOOL_CONF=virtual=0") != NULL, "%s", r.err);
}

/* NCCL asks cuPointerGetAttribute(IS_LEGACY_CUDA_IPC_CAPABLE) of the range
 * start before it takes the legacy IPC path. The driver says 1 for any
 * address of a cuMemAlloc allocation, so for a block inside a plain
 * segment it said 1 where the shim refuses the handle: it says 0 there
 * now, of the block's start and of any address in it, and the driver
 * answers for the block that starts its segment (1) and the virtual
 * range (0). cuPointerGetAttributes, which the shim did not hook, said
 * the driver's 1 and the segment's start: ipc_prog checks it says what
 * the singular says. ipc_prog also checks, in every run above, that the
 * attribute and cuIpcGetMemHandle agree, and that the answer is an
 * unsigned int. */
Test(preload_ipc, the_legacy_ipc_attribute_agrees_with_the_handle) {
  static const struct {
    const char *which, *conf, *out;
  } want[] = {
      {"first", NULL, "capable 1 1\n"},
      {"second", NULL, "capable 1 1\n"},
      {"first", "virtual=0", "capable 1 1\n"},
      {"second", "virtual=0", "capable 0 0\n"},
      {"first", "virtual=1", "capable 0 0\n"},
      {"second", "virtual=1", "capable 0 0\n"},
  };
  for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
    run_mode("capable", want[i].which, want[i].conf, NULL);
    cr_assert_str_eq(r.out, want[i].out, "%s %s: err: %s", want[i].which,
                     want[i].conf ? want[i].conf : "(no shim)", r.err);
  }
}
