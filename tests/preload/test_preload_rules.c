/* test_preload_rules.c - CUDA's rules kept under the shim, on the strict
 * fake libcuda.so.1 (tests/fakecuda): rules_prog relies on cuMemFree's
 * ordering. Without the shim the fake keeps it; under the shim the pool
 * must (issue 9; /work/notes/issue9-library-todo.md, item 1). */
#include "spawn.h"

/* The shim-side fix enables the pending test (or build with
 * -DMP_ISSUE9_SHIM_FIXED=1 to see it fail today). */
#ifndef MP_ISSUE9_SHIM_FIXED
#define MP_ISSUE9_SHIM_FIXED 0
#endif

static spawn_result_t r;

Test(preload_rules, without_the_shim_mem_free_keeps_cuda_ordering) {
  const char *argv[] = {MP_RULES_PROG, NULL};
  const char *env[] = {"LD_PRELOAD=", NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert_str_eq(r.out, "ok\n");
}

Test(preload_rules, under_the_shim_mem_free_keeps_cuda_ordering,
     .disabled = !MP_ISSUE9_SHIM_FIXED) {
  const char *argv[] = {MP_RULES_PROG, NULL};
  const char *env[] = {"LD_PRELOAD=" MP_SHIM, "MEMPOOL_DEVICE=cuda", NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert_str_eq(r.out, "ok\n");
}
