/* `mpbench bound` end to end: its table for a trace file, with an
 * allocator's column, for a workload alone, and a malformed trace stopping
 * it with the line. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_run.h"
#include "mpbench.h"

static char tmpdir[256];
static char text[1 << 16];

static void make_tmp(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/mpbench-bound-XXXXXX");
  cr_assert_not_null(mkdtemp(tmpdir));
}

static void drop_tmp(void) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  cr_expect_eq(system(cmd), 0);
}

/* mpbench's stdout of args into text; its exit status. */
static int run_text(const char **args) {
  char out[512];
  snprintf(out, sizeof out, "%s/stdout", tmpdir);
  int rc = mpb_test_run(args, out);
  FILE *f = fopen(out, "r");
  cr_assert_not_null(f);
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  return rc;
}

static void write_file(const char *path, const char *body) {
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fputs("Thread,Time,Action,Pointer,Size,Stream\n", f);
  fputs(body, f);
  fclose(f);
}

/* tmpdir/small.csv, one 4 KiB block allocated and freed, its path in
 * trace. */
static void write_small(char *trace, size_t len) {
  snprintf(trace, len, "%s/small.csv", tmpdir);
  write_file(trace, "1,00:00:00.000001,allocate,0x1000,4096,0\n"
                    "1,00:00:00.000002,free,0x1000,4096,0\n");
}

/* 1 MiB and 2 MiB together, the 1 MiB goes, another 2 MiB comes: 4 MiB
 * live at most, placed in 4 MiB (largest first), two whole granules. */
Test(cli_bound, bound_prints_the_figures_of_each_trace, .init = make_tmp,
     .fini = drop_tmp) {
  char trace[512];
  snprintf(trace, sizeof trace, "%s/hand.csv", tmpdir);
  write_file(trace, "1,00:00:00.000001,allocate,0x1000,1048576,0\n"
                    "1,00:00:00.000002,allocate,0x200000,2097152,0\n"
                    "1,00:00:00.000003,free,0x1000,1048576,0\n"
                    "1,00:00:00.000004,allocate,0x400000,2097152,0\n"
                    "1,00:00:00.000005,free,0x200000,2097152,0\n"
                    "1,00:00:00.000006,free,0x400000,2097152,0\n");
  const char *args[] = {"bound",  "--device", "host", "--allocator",
                        "direct", "--quiet",  trace,  NULL};
  cr_assert_eq(run_text(args), 0, "%s", mp_last_error());
  cr_expect(strstr(text, "granule 2048 KiB") != NULL, "%s", text);
  cr_expect(strstr(text, "| granule bound | offline | offline raw |") != NULL,
            "%s", text);
  cr_expect(strstr(text, "| `direct` | `direct` live granules | 1.05 |") !=
                NULL,
            "%s", text);
  /* peak live, bound, offline, raw, its order, unmapping, its order, the
   * direct allocator (holds what is live), the granules its blocks touch
   * (on the host device its blocks are not granule-aligned: more than it
   * holds), and the verdict. */
  cr_expect(strstr(text, "| hand | 4.00 MiB | 1.000 | 1.000 | 1.000 | size | "
                         "1.000 | size | 1.000 | ") != NULL,
            "%s", text);
  cr_expect(strstr(text, " | reached offline |") != NULL, "%s", text);
}

/* bound rounds sizes to the pool's alignment, MEMPOOL_CONF's if set: a
 * MEMPOOL_CONF a pool refuses stops it, naming the setting. Before, an
 * unknown key left the defaults (exit 0), an alignment above 1 GiB was
 * used as given, and one of 2^63 blamed the trace. */
static void bound_refuses_conf(const char *conf, const char *said) {
  char trace[512];
  snprintf(trace, sizeof trace, "%s/ok.csv", tmpdir);
  write_file(trace, "1,00:00:00.000001,allocate,0x1000,4096,0\n"
                    "1,00:00:00.000002,free,0x1000,4096,0\n");
  cr_assert_eq(setenv("MEMPOOL_CONF", conf, 1), 0);
  const char *args[] = {"bound", "--device", "host", "--quiet", trace, NULL};
  int rc = run_text(args);
  unsetenv("MEMPOOL_CONF");
  cr_assert_eq(rc, 2, "%s: exit %d\n%s", conf, rc, text);
  cr_expect(strstr(mp_last_error(), said) != NULL, "%s: %s", conf,
            mp_last_error());
  cr_expect(strstr(text, "| ok |") == NULL, "%s: a table\n%s", conf, text);
}

Test(cli_bound, a_mempool_conf_a_pool_refuses_stops_bound, .init = make_tmp,
     .fini = drop_tmp) {
  bound_refuses_conf("bogus=1", "bogus");
  bound_refuses_conf("align=4K,bogus", "bogus");
  bound_refuses_conf("align=2G", "above 1 GiB");
  bound_refuses_conf("align=3K", "power of two");
}

Test(cli_bound, malformed_trace_stops_bound_with_its_line, .init = make_tmp,
     .fini = drop_tmp) {
  char trace[512];
  snprintf(trace, sizeof trace, "%s/bad.csv", tmpdir);
  write_file(trace, "1,00:00:00.000001,allocate,0x1000,64,0\n"
                    "1,00:00:00.000002,allocate,0x2000,sixty,0\n");
  const char *args[] = {"bound", "--device", "host", "--quiet", trace, NULL};
  cr_expect_eq(run_text(args), 2);
  cr_expect(strstr(mp_last_error(), "bad.csv:3:") != NULL, "%s",
            mp_last_error());
  cr_expect(strstr(text, "| workload |") == NULL, "a table: %s", text);
}

Test(cli_bound, bound_with_a_workload_and_no_file_runs_only_it,
     .init = make_tmp, .fini = drop_tmp) {
  const char *args[] = {"bound",   "--device",   "host",
                        "--quiet", "--workload", "adversarial:rounds=2,count=4",
                        NULL};
  cr_assert_eq(run_text(args), 0, "%s", mp_last_error());
  cr_expect(strstr(text, "1 workloads") != NULL, "%s", text);
  cr_expect(strstr(text, "| adversarial:rounds=2,count=4 |") != NULL, "%s",
            text);
}

/* An allocator whose replay fails is FAILED in its column, and why is
 * printed under the table, as `run` prints it (bound printed only
 * "(FAILED)"). */
Test(cli_bound, failed_replay_says_why, .init = make_tmp, .fini = drop_tmp) {
  char trace[512];
  write_small(trace, sizeof trace);
  const char *args[] = {
      "bound",   "--device", "host", "--allocator", "pool:max_bytes=1K",
      "--quiet", trace,      NULL};
  cr_assert_eq(run_text(args), 0, "%s", mp_last_error());
  cr_expect(strstr(text, "(FAILED)") != NULL, "%s", text);
  cr_expect(strstr(text, "small / pool:max_bytes=1K: MP_ELIMIT at event 1") !=
                NULL,
            "%s", text);
}

/* Options of `run` that bound has no use for (it writes no files and
 * searches no capacity) are bad usage, not silently dropped: `bound --out
 * DIR` exited 0 having written nothing there. */
Test(cli_bound, bound_refuses_the_options_it_does_not_use, .init = make_tmp,
     .fini = drop_tmp) {
  char trace[512], out[512];
  write_small(trace, sizeof trace);
  snprintf(out, sizeof out, "%s/out", tmpdir);
  const char *opts[][2] = {{"--out", out},
                           {"--blockmap", "pool"},
                           {"--capacity-budget", "5"},
                           {"--capacity-total", "5"},
                           {"--no-capacity", NULL},
                           {"--no-plots", NULL}};
  for (size_t i = 0; i < sizeof opts / sizeof *opts; i++) {
    const char *args[] = {"bound",    "--device", "host", "--quiet",
                          opts[i][0], opts[i][1], NULL,   NULL};
    args[opts[i][1] ? 6 : 5] = trace;
    cr_expect_eq(run_text(args), 2, "%s was accepted", opts[i][0]);
    cr_expect(strstr(text, "| workload |") == NULL, "a table: %s", text);
  }
  cr_expect_eq(access(out, F_OK), -1, "the output folder was created");
}

/* bound FILE... replays the files given: a --traces folder beside them was
 * dropped without a word (the table had the files' rows only). */
Test(cli_bound, bound_with_files_refuses_a_traces_folder, .init = make_tmp,
     .fini = drop_tmp) {
  char trace[512];
  write_small(trace, sizeof trace);
  const char *args[] = {"bound",    "--device", "host",       "--quiet",
                        "--traces", tmpdir,     "--workload", "random:n=20",
                        trace,      NULL};
  cr_expect_eq(run_text(args), 2);
  cr_expect(strstr(text, "| workload |") == NULL, "a table: %s", text);
  /* The folder alone is what bound replays then. */
  const char *alone[] = {"bound",      "--device",    "host",
                         "--quiet",    "--traces",    tmpdir,
                         "--workload", "random:n=20", NULL};
  cr_expect_eq(run_text(alone), 0, "%s", mp_last_error());
  cr_expect(strstr(text, "| small |") != NULL, "%s", text);
}

/* bound FILE... replays the files given: --no-traces beside them was
 * accepted and did nothing (the files' rows were printed). */
Test(cli_bound, bound_with_files_refuses_no_traces, .init = make_tmp,
     .fini = drop_tmp) {
  char trace[512];
  write_small(trace, sizeof trace);
  const char *args[] = {"bound",       "--device", "host", "--quiet",
                        "--no-traces", trace,      NULL};
  cr_expect_eq(run_text(args), 2);
  cr_expect(strstr(text, "| workload |") == NULL, "a table: %s", text);
  /* With built-in workloads only, it is what it says. */
  const char *alone[] = {"bound",       "--device",   "host",        "--quiet",
                         "--no-traces", "--workload", "random:n=20", NULL};
  cr_expect_eq(run_text(alone), 0, "%s", mp_last_error());
  cr_expect(strstr(text, "| random:n=20 |") != NULL, "%s", text);
}

/* --stream-work shapes the replays of the --allocator columns; with none
 * bound replays nothing, and the option was accepted and did nothing. */
Test(cli_bound, bound_refuses_stream_work_without_an_allocator,
     .init = make_tmp, .fini = drop_tmp) {
  char trace[512];
  write_small(trace, sizeof trace);
  const char *args[] = {"bound",         "--device", "host", "--quiet",
                        "--stream-work", "5",        trace,  NULL};
  cr_expect_eq(run_text(args), 2);
  cr_expect(strstr(text, "| workload |") == NULL, "a table: %s", text);
  const char *with[] = {"bound",       "--device", "host",          "--quiet",
                        "--allocator", "direct",   "--stream-work", "5",
                        trace,         NULL};
  cr_expect_eq(run_text(with), 0, "%s", mp_last_error());
  cr_expect(strstr(text, "| small |") != NULL, "%s", text);
}

/* A trace whose blocks no flat range can hold side by side (two of 2^63 - 1
 * bytes live together: they fit a size_t, rounded they end past it) is bad
 * input, exit 2 as a malformed trace is, with the trace named (it was exit
 * 1, a failure while running, and the placement's message named nothing). */
Test(cli_bound, a_trace_past_the_address_space_is_bad_input, .init = make_tmp,
     .fini = drop_tmp) {
  char trace[512];
  snprintf(trace, sizeof trace, "%s/huge.csv", tmpdir);
  write_file(trace,
             "1,00:00:00.000001,allocate,0x1000,9223372036854775807,0\n"
             "1,00:00:00.000002,allocate,0x2000,9223372036854775807,0\n");
  const char *args[] = {"bound", "--device", "host", "--quiet", trace, NULL};
  cr_expect_eq(run_text(args), 2);
  cr_expect(strstr(mp_last_error(), "huge: ") == mp_last_error(), "%s",
            mp_last_error());
  cr_expect(strstr(mp_last_error(), "address space") != NULL, "%s",
            mp_last_error());
  cr_expect(strstr(text, "| workload |") == NULL, "a table: %s", text);
}

/* What bound's replay of a trace skipped or changed (a free of a pointer it
 * never allocated, a second allocation of a live address) is noted under
 * its table, as run and replay note it: bound said nothing. */
Test(cli_bound, bound_notes_what_the_trace_had_that_was_skipped,
     .init = make_tmp, .fini = drop_tmp) {
  char trace[512];
  snprintf(trace, sizeof trace, "%s/odd.csv", tmpdir);
  write_file(trace, "1,00:00:00.000001,free,0x9000,64,0\n"
                    "1,00:00:00.000002,allocate,0x1000,4096,0\n"
                    "1,00:00:00.000003,allocate,0x1000,8192,0\n"
                    "1,00:00:00.000004,free,0x1000,8192,0\n");
  const char *args[] = {"bound", "--device", "host", "--quiet", trace, NULL};
  cr_assert_eq(run_text(args), 0, "%s", mp_last_error());
  cr_expect(strstr(text, "Trace notes:") != NULL, "%s", text);
  cr_expect(strstr(text, "- odd: 1 frees of never-allocated pointers "
                         "skipped") != NULL,
            "%s", text);
  cr_expect(strstr(text, "1 allocations of a live address") != NULL, "%s",
            text);
}

/* A trace given by a bare file name that makes a workload's name
 * (graph.csv beside --workload graph) gets a row named by the file name as
 * given, not one that looks like the workload's. */
Test(cli_bound, a_trace_named_as_a_workload_keeps_its_file_name,
     .init = make_tmp, .fini = drop_tmp) {
  cr_assert_eq(chdir(tmpdir), 0);
  write_file("graph.csv", "1,00:00:00.000001,allocate,0x1000,4096,0\n"
                          "1,00:00:00.000002,free,0x1000,4096,0\n");
  write_file("graph", "1,00:00:00.000001,allocate,0x1000,8192,0\n");
  const char *args[] = {"bound", "--device",  "host",  "--quiet", "--workload",
                        "graph", "graph.csv", "graph", NULL};
  cr_assert_eq(run_text(args), 0, "%s", mp_last_error());
  cr_expect(strstr(text, "| graph | ") != NULL, "%s", text);
  cr_expect(strstr(text, "| graph.csv | 4.00 KiB |") != NULL, "%s", text);
  cr_expect(strstr(text, "| ./graph | 8.00 KiB |") != NULL, "%s", text);
}
