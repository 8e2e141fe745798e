/* test_preload_starts_under_sanitizers.c - any program starts and ends
 * cleanly under the shim, in every build: in a sanitizer build MP_SHIM
 * preloads the sanitizer's runtime and then the instrumented shim, and the
 * runtime resolves its interceptors through the shim's dlsym before it has
 * started (issue 16: every process crashed there, /bin/true included). */
#include "spawn.h"

static spawn_result_t r;

/* Where stderr holds a sanitizer's report (ASan, LSan, TSan, UBSan, or
 * ASan's refusal to start behind another object), or NULL. */
static const char *sanitizer_report(const char *err) {
  static const char *const marks[] = {"Sanitizer",
                                      "runtime error:", "ASan runtime"};
  for (size_t i = 0; i < sizeof marks / sizeof *marks; i++) {
    const char *at = strstr(err, marks[i]);
    if (at != NULL)
      return at;
  }
  return NULL;
}

static void starts_cleanly(const char *const *argv, const char *const *env) {
  spawn(argv, env, &r);
  cr_assert(r.exited && r.code == 0, "%s: %s %d\nout: %s\nerr: %s", argv[0],
            r.exited ? "exit" : "signal", r.code, r.out, r.err);
  cr_assert_null(sanitizer_report(r.err), "%s: err: %s", argv[0], r.err);
}

Test(preload_starts_under_sanitizers, true_exits_cleanly) {
  const char *argv[] = {"/bin/true", NULL};
  const char *env[] = {"LD_PRELOAD=" MP_SHIM, NULL};
  starts_cleanly(argv, env);
}

Test(preload_starts_under_sanitizers, fake_driver_program_exits_cleanly) {
  const char *argv[] = {MP_DRV_PROG, "preloaded", "host", NULL};
  const char *env[] = {"LD_PRELOAD=" MP_SHIM, "MEMPOOL_DEVICE=host",
                       "FAKECUDA_DEVICE_COUNT=2", NULL};
  starts_cleanly(argv, env);
  cr_assert_str_eq(r.out, "ok\n");
}
