/* test_preload_lookup.c - the shim's dlsym replacement: hooked names
 * resolve to the shim through every handle that has them, everything else
 * (and every RTLD_NEXT lookup, made from wherever) is glibc's answer. */
#include "spawn.h"

static spawn_result_t r;

Test(preload_lookup, without_the_shim_the_probes_hold) {
  const char *argv[] = {MP_LOOKUP_PROG, NULL};
  const char *env[] = {"LD_PRELOAD=", NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "%s", r.out);
}

Test(preload_lookup, under_the_shim_only_hooked_names_change) {
  const char *argv[] = {MP_LOOKUP_PROG, "preloaded", NULL};
  const char *env[] = {"LD_PRELOAD=" MP_SHIM, "MEMPOOL_DEVICE=host", NULL};
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "out: %s\nerr: %s", r.out, r.err);
  cr_assert_str_eq(r.out, "ok\n");
}
