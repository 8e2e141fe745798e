/* --blockmap names an allocator as --allocator does: "NAME:" (a colon and
 * no options) is NAME, the row the run gives it. Before, --allocator
 * pool: ran as "pool" while --blockmap pool: looked for "pool:", found no
 * such run and stopped the command (exit 2, "not one of the allocators
 * run"). A name that no run has is still refused. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "cli_files.h"
#include "cli_run.h"
#include "mpbench.h"

static char trace[128], out[128];

static void setup(void) {
  scratch_make();
  snprintf(trace, sizeof trace, "%s/t.csv", scratch_dir());
  snprintf(out, sizeof out, "%s/out", scratch_dir());
  put_text(trace, "Thread,Time,Action,Pointer,Size,Stream\n"
                  "0,00:00:00.000001,allocate,0x1000,4096,0\n"
                  "0,00:00:00.000002,allocate,0x2000,8192,0\n"
                  "0,00:00:00.000003,free,0x1000,4096,0\n"
                  "0,00:00:00.000004,free,0x2000,8192,0\n");
}

static int replay(const char *alloc, const char *blockmap, char *err,
                  size_t n) {
  const char *args[] = {
      "replay",        "--out",   out,          "--device", "host",
      "--allocator",   alloc,     "--blockmap", blockmap,   "--no-plots",
      "--no-capacity", "--quiet", trace,        NULL};
  return mpb_test_run_err(args, "/dev/null", err, n);
}

Test(cli_blockmap_spec_name, a_trailing_colon_names_the_same_run, .init = setup,
     .fini = scratch_drop) {
  char err[1024], path[256];
  cr_assert_eq(replay("pool:", "pool:", err, sizeof err), 0, "%s", err);
  snprintf(path, sizeof path, "%s/report.html", out);
  const char *page = slurp(path);
  const char *blocks = strstr(page, "id=\"mp-blocks\">");
  cr_assert_not_null(blocks);
  /* The map of the run "pool", with both of its blocks. */
  cr_expect(strstr(blocks, "\"allocator\": \"pool\", \"events\": 4, "
                           "\"blocks_total\": 2") != NULL,
            "%.300s", blocks);
  /* Given as --allocator pool, the same. */
  cr_assert_eq(replay("pool", "pool:", err, sizeof err), 0, "%s", err);
}

Test(cli_blockmap_spec_name, a_name_no_run_has_is_still_refused, .init = setup,
     .fini = scratch_drop) {
  char err[1024];
  cr_expect_eq(replay("pool:", "direct:", err, sizeof err), 2);
  cr_expect(strstr(err, "--blockmap direct") != NULL &&
                strstr(err, "is not one of the allocators run") != NULL,
            "%s", err);
  cr_expect_eq(replay("pool:virtual=0", "pool:", err, sizeof err), 2);
  cr_expect(strstr(err, "--blockmap pool is not one of") != NULL, "%s", err);
}
