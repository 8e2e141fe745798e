/* The mpbench command end to end: what it writes, that the pool's figures
 * in results.json are the pool's own statistics, and that bad input stops
 * it with nothing written. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_files.h"
#include "cli_run.h"
#include "mpbench.h"

static char tmpdir[256];

static void make_tmp(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/mpbench-test-XXXXXX");
  cr_assert_not_null(mkdtemp(tmpdir));
}

static void drop_tmp(void) {
  rm_tree(tmpdir);
}

static int run(const char **args) {
  return mpb_test_run(args, NULL);
}

static bool exists(const char *dir, const char *name) {
  char p[1024];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return access(p, F_OK) == 0;
}

static unsigned long long json_u64(const char *obj, const char *key) {
  char k[64];
  snprintf(k, sizeof k, "\"%s\": ", key);
  const char *p = strstr(obj, k);
  cr_assert_not_null(p, "no %s in %s", key, obj);
  return strtoull(p + strlen(k), NULL, 10);
}

/* A trace of odd sizes that makes the pool split, cache and grow. */
static void write_trace(const char *path) {
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fputs("Thread,Time,Action,Pointer,Size,Stream\n", f);
  static const size_t sizes[] = {3000000, 700,     25000000, 1 << 20,
                                 123457,  9000000, 4096,     60000000};
  unsigned long long addr[8];
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < 8; i++) {
      addr[i] = 0x10000000ull * (unsigned long long)(i + 1);
      fprintf(f, "1,00:00:%02d.%06d,allocate,0x%llx,%zu,0\n", round, i, addr[i],
              sizes[(i + round) % 8]);
    }
    for (int i = 0; i < 8; i += 1 + round % 2)
      fprintf(f, "1,00:00:%02d.%06d,free,0x%llx,0,0\n", round, 100 + i,
              addr[i]);
    for (int i = 1; i < 8; i += 2)
      if (round % 2 == 0)
        fprintf(f, "1,00:00:%02d.%06d,free,0x%llx,0,0\n", round, 200 + i,
                addr[i]);
  }
  fclose(f);
}

Test(cli_results, pool_figures_in_results_json_are_the_pool_stats,
     .init = make_tmp, .fini = drop_tmp) {
  char trace[512], out[512], json[600];
  snprintf(trace, sizeof trace, "%s/odd.csv", tmpdir);
  snprintf(out, sizeof out, "%s/out", tmpdir);
  write_trace(trace);
  const char *args[] = {"replay",     "--out",    out,    "--allocator",
                        "pool",       "--device", "host", "--no-capacity",
                        "--no-plots", "--quiet",  trace,  NULL};
  cr_assert_eq(run(args), 0);
  snprintf(json, sizeof json, "%s/results.json", out);
  const char *obj = strstr(slurp(json), "\"allocator\": \"pool\"");
  cr_assert_not_null(obj);

  /* The same replay straight through mp_pool_*, on the device mpbench
   * measures on (host with a 16 GiB capacity). */
  mpb_workload_t w;
  cr_assert_eq(mpb_trace_load(trace, "odd", &w), MP_OK, "%s", mp_last_error());
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host:capacity=16G", &dev), MP_OK);
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  mp_pool_t *pool;
  cr_assert_eq(mp_pool_create(dev, &cfg, &pool), MP_OK, "%s", mp_last_error());
  void **ptr = calloc(w.nslots, sizeof *ptr);
  for (size_t i = 0; i < w.n; i++) {
    if (w.ev[i].op == MPB_ALLOC)
      cr_assert_eq(mp_pool_alloc(pool, w.ev[i].size, NULL, &ptr[w.ev[i].slot]),
                   MP_OK);
    else
      cr_assert_eq(mp_pool_free(pool, ptr[w.ev[i].slot]), MP_OK);
  }
  mp_stats_t st;
  cr_assert_eq(mp_pool_get_stats(pool, &st), MP_OK);
  cr_expect_eq(json_u64(obj, "peak_reserved_bytes"), st.peak_reserved_bytes);
  cr_expect_eq(json_u64(obj, "peak_live_bytes"), st.peak_requested_bytes);
  cr_expect_eq(json_u64(obj, "device_calls"),
               st.device_alloc_count + st.device_free_count);
  cr_expect_eq(json_u64(obj, "events"), w.n);
  free(ptr);
  mp_pool_destroy(pool);
  mp_device_close(dev);
  mpb_workload_free(&w);
}

Test(cli_results, run_writes_table_json_csv_and_plots, .init = make_tmp,
     .fini = drop_tmp) {
  char out[512];
  snprintf(out, sizeof out, "%s/a/b", tmpdir); /* made as needed */
  const char *args[] = {"run",
                        "--out",
                        out,
                        "--workload",
                        "random:n=300,max_size=1M,max_live=8M",
                        "--allocator",
                        "pool",
                        "--allocator",
                        "direct",
                        "--device",
                        "host",
                        "--quiet",
                        NULL};
  cr_assert_eq(run(args), 0);
  cr_expect(exists(out, "results.json"));
  cr_expect(exists(out, "results.csv"));
  cr_expect(exists(out, "results.md"));
  char path[600];
  snprintf(path, sizeof path, "%s/results.csv", out);
  const char *csv = slurp(path);
  cr_expect(strncmp(csv, "workload,allocator,", 19) == 0);
  cr_expect(strstr(csv, "\nrandom:n=300,max_size=1M,max_live=8M,") == NULL,
            "a workload name with commas must be quoted");
  cr_expect(strstr(csv, "\"random:n=300,max_size=1M,max_live=8M\",pool,") !=
            NULL);
  snprintf(path, sizeof path, "%s/results.json", out);
  const char *json = slurp(path);
  cr_expect(strstr(json, "\"min_capacity_exact\": true") != NULL, "%s", json);
  if (system("gnuplot -e 'set terminal png' >/dev/null 2>&1") == 0) {
    cr_expect(exists(out, "ratios.png"));
    cr_expect(exists(out, "bytes_random_n_300_max_size_1M_max_live_8M.png"));
  }
  /* No temporary folder is left behind. */
  DIR *d = opendir(out);
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    cr_expect(strncmp(e->d_name, ".mpbench-tmp", 12) != 0, "%s left",
              e->d_name);
  closedir(d);
}

Test(cli_results, out_folder_with_quotes_gets_its_plots, .init = make_tmp,
     .fini = drop_tmp) {
  if (system("gnuplot -e 'set terminal png' >/dev/null 2>&1") != 0)
    cr_skip_test("gnuplot with a png terminal is not installed");
  char out[512];
  snprintf(out, sizeof out, "%s/it's \"here\"", tmpdir);
  const char *args[] = {"run",          "--out",       out,    "--workload",
                        "random:n=200", "--allocator", "pool", "--no-capacity",
                        "--quiet",      NULL};
  cr_assert_eq(run(args), 0);
  cr_expect(exists(out, "ratios.png"));
  cr_expect(exists(out, "bytes_random_n_200.png"));
}

/* Runs that fail (out of memory on a small device) still get the plot of
 * what they did before the failure; the ratio chart, which has no bar to
 * draw, is left out instead of taking the byte plots down with it. A run
 * that fails at its first event has nothing to plot, and says so. */
Test(cli_results, failed_runs_keep_their_byte_plots, .init = make_tmp,
     .fini = drop_tmp) {
  if (system("gnuplot -e 'set terminal png' >/dev/null 2>&1") != 0)
    cr_skip_test("gnuplot with a png terminal is not installed");
  char out[512], log[600];
  snprintf(out, sizeof out, "%s/out", tmpdir);
  snprintf(log, sizeof log, "%s/stdout.txt", tmpdir);
  const char *args[] = {"run",
                        "--out",
                        out,
                        "--workload",
                        "random:n=200,max_size=4M,max_live=64M",
                        "--allocator",
                        "pool",
                        "--device",
                        "host:capacity=24M",
                        "--no-capacity",
                        NULL};
  cr_assert_eq(mpb_test_run(args, log), 0);
  const char *text = slurp(log);
  cr_assert(strstr(text, "pool (FAILED)") != NULL, "%s", text);
  cr_expect(strstr(text, "No plots") == NULL, "%s", text);
  cr_expect(exists(out, "bytes_random_n_200_max_size_4M_max_live_64M.png"));
  cr_expect(!exists(out, "ratios.png"));

  char out2[512];
  snprintf(out2, sizeof out2, "%s/out2", tmpdir);
  args[2] = out2;
  /* Every device allocation refused: no run gets a figure (a tiny capacity
   * no longer does it: a request that fits what is left takes a plain
   * segment of its size). */
  args[8] = "host:capacity=24M,fail_after=1";
  cr_assert_eq(mpb_test_run(args, log), 0);
  text = slurp(log);
  cr_expect(strstr(text, "No plots: no run got as far as a figure to plot") !=
                NULL,
            "%s", text);
  cr_expect(exists(out2, "results.json"));
  DIR *d = opendir(out2);
  cr_assert_not_null(d);
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    cr_expect(strstr(e->d_name, ".png") == NULL, "%s", e->d_name);
  closedir(d);
}

/* More workloads than the report once kept names for (256): every one
 * still gets its byte plot, and the ratio chart is still drawn. */
Test(cli_results, every_workload_of_a_large_run_gets_its_plot, .init = make_tmp,
     .fini = drop_tmp, .timeout = 300) {
  if (system("gnuplot -e 'set terminal png' >/dev/null 2>&1") != 0)
    cr_skip_test("gnuplot with a png terminal is not installed");
  enum { N = 258 };
  char dir[512], out[512], path[700];
  snprintf(dir, sizeof dir, "%s/traces", tmpdir);
  snprintf(out, sizeof out, "%s/out", tmpdir);
  cr_assert_eq(mkdir(dir, 0777), 0);
  for (int i = 0; i < N; i++) {
    snprintf(path, sizeof path, "%s/t%03d.csv", dir, i);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f,
            "Thread,Time,Action,Pointer,Size,Stream\n"
            "0,00:00:00.000001,allocate,0x1000,%d,0\n",
            1000 + i);
    fclose(f);
  }
  const char *args[] = {"run",     "--out",      out,           "--traces",
                        dir,       "--workload", "random:n=20", "--allocator",
                        "direct",  "--device",   "host",        "--no-capacity",
                        "--quiet", NULL};
  cr_assert_eq(run(args), 0);
  cr_expect(exists(out, "ratios.png"));
  cr_expect(exists(out, "bytes_random_n_20.png"));
  for (int i = 0; i < N; i++) {
    char name[64];
    snprintf(name, sizeof name, "bytes_t%03d.png", i);
    cr_expect(exists(out, name), "%s missing", name);
  }
}

/* Workload names that make the same file name ("a b" and "a_b": every
 * character but letters, digits, '.' and '-' becomes '_') get a plot each:
 * the second was drawn over the first, whose plot was lost. */
Test(cli_results, workloads_of_one_file_stem_get_a_plot_each, .init = make_tmp,
     .fini = drop_tmp) {
  if (system("gnuplot -e 'set terminal png' >/dev/null 2>&1") != 0)
    cr_skip_test("gnuplot with a png terminal is not installed");
  char dir[512], out[512], path[700];
  snprintf(dir, sizeof dir, "%s/traces", tmpdir);
  snprintf(out, sizeof out, "%s/out", tmpdir);
  cr_assert_eq(mkdir(dir, 0777), 0);
  snprintf(path, sizeof path, "%s/a b.csv", dir);
  write_trace(path);
  snprintf(path, sizeof path, "%s/a_b.csv", dir);
  write_trace(path);
  const char *args[] = {"run",    "--out",         out,           "--traces",
                        dir,      "--workload",    "random:n=20", "--allocator",
                        "direct", "--no-capacity", "--quiet",     NULL};
  cr_assert_eq(run(args), 0);
  size_t plots = 0;
  DIR *d = opendir(out);
  cr_assert_not_null(d);
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    plots += strncmp(e->d_name, "bytes_a", 7) == 0;
  closedir(d);
  cr_expect_eq(plots, 2, "%zu plots of the two workloads", plots);
  cr_expect(exists(out, "bytes_a_b.png"));
}

/* The block map of a run that failed ends where the run stopped: its
 * blocks still live then end there (they were drawn, and their tooltips
 * said they lived, up to the workload's last event, which never ran). */
Test(cli_results, a_failed_runs_block_map_ends_where_the_run_stopped,
     .init = make_tmp, .fini = drop_tmp) {
  char out[512], path[600];
  snprintf(out, sizeof out, "%s/out", tmpdir);
  const char *args[] = {"run",
                        "--out",
                        out,
                        "--workload",
                        "random:n=200,max_size=4M,max_live=64M",
                        "--allocator",
                        "pool",
                        "--device",
                        "host:capacity=24M",
                        "--no-capacity",
                        "--no-plots",
                        "--quiet",
                        NULL};
  cr_assert_eq(run(args), 0);
  snprintf(path, sizeof path, "%s/results.json", out);
  const char *json = slurp(path);
  cr_assert(strstr(json, "\"completed\": false") != NULL, "%s", json);
  unsigned long long ran = json_u64(json, "events");
  cr_assert_lt(ran, 400, "%s", json);
  snprintf(path, sizeof path, "%s/report.html", out);
  const char *map = strstr(slurp(path), "id=\"mp-blocks\">");
  cr_assert_not_null(map);
  cr_expect_eq(json_u64(map, "events"), ran);
  const char *b = strstr(map, "\"blocks\": [");
  cr_assert_not_null(b);
  b += strlen("\"blocks\": [");
  unsigned long long off, size, t0, t1;
  size_t n = 0, open = 0;
  int used = 0;
  while (sscanf(b, "[%llu,%llu,%llu,%llu]%n", &off, &size, &t0, &t1, &used) ==
         4) {
    cr_expect_leq(t1, ran, "block %zu lives to event %llu", n, t1);
    open += t1 == ran;
    n++;
    b += used + (b[used] == ',');
  }
  cr_expect_gt(n, 0);
  cr_expect_gt(open, 0, "no block was live when the run stopped");
}

/* A '|' in a workload's name (a trace file "a|b.csv") is escaped in
 * results.md's table: it split the name into a column of its own, and
 * every figure of the row stood under the wrong heading. A newline in it
 * (a file "a|b\nc.csv") is written '?': it split the row in two. */
Test(cli_results, a_bar_in_a_name_stays_in_its_table_cell, .init = make_tmp,
     .fini = drop_tmp) {
  char trace[512], out[512], path[600];
  snprintf(trace, sizeof trace, "%s/a|b\nc.csv", tmpdir);
  snprintf(out, sizeof out, "%s/out", tmpdir);
  write_trace(trace);
  const char *args[] = {"replay", "--out",      out,       "--allocator",
                        "direct", "--no-plots", "--quiet", "--no-capacity",
                        trace,    NULL};
  cr_assert_eq(run(args), 0);
  snprintf(path, sizeof path, "%s/results.md", out);
  const char *md = slurp(path);
  const char *row = strstr(md, "\n| a");
  cr_assert_not_null(row, "%s", md);
  row++;
  /* The header's cells, and the row's: bars not escaped by a backslash. */
  size_t head = 0, cells = 0;
  for (const char *c = md; *c != '\n'; c++)
    head += *c == '|';
  for (const char *c = row; *c != '\n' && *c != '\0'; c++)
    cells += *c == '|' && (c == row || c[-1] != '\\');
  cr_expect_eq(cells, head, "%s", md);
  cr_expect(strncmp(row, "| a\\|b?c | direct |", 19) == 0, "%s", md);
}

/* Whether s is all ASCII (JSON escapes everything else it holds). */
static bool all_ascii(const char *s) {
  for (; *s; s++)
    if ((unsigned char)*s >= 0x80)
      return false;
  return true;
}

/* A file name is bytes, not always UTF-8: results.json and report.html's
 * JSON hold each byte that is not part of a valid UTF-8 sequence as
 * U+FFFD, so that both load as JSON (json.load refused the raw byte). */
Test(cli_results, a_name_of_bytes_that_are_not_utf8_gives_valid_json,
     .init = make_tmp, .fini = drop_tmp) {
  char trace[512], out[512], path[600];
  snprintf(trace, sizeof trace, "%s/bad\xffname.csv", tmpdir);
  snprintf(out, sizeof out, "%s/out", tmpdir);
  write_trace(trace);
  const char *args[] = {"replay", "--out",      out,       "--allocator",
                        "direct", "--no-plots", "--quiet", "--no-capacity",
                        trace,    NULL};
  cr_assert_eq(run(args), 0);
  snprintf(path, sizeof path, "%s/results.json", out);
  const char *json = slurp(path);
  cr_expect(strstr(json, "\"workload\": \"bad\\ufffdname\"") != NULL, "%s",
            json);
  cr_expect(all_ascii(json), "%s", json);
  snprintf(path, sizeof path, "%s/report.html", out);
  const char *html = slurp(path);
  cr_expect(strstr(html, "\"bad\\ufffdname\"") != NULL);
  cr_expect(strchr(html, '\xff') == NULL);
}

/* Valid UTF-8 (2, 3 and 4 bytes) is written as it is; each byte of an
 * invalid sequence is U+FFFD: a stray continuation byte, an overlong form,
 * a surrogate, a code point past U+10FFFF, a sequence cut short, 0xff. */
Test(cli_results, json_keeps_valid_utf8_and_replaces_each_invalid_byte) {
  mpb_result_t *r = calloc(1, sizeof *r);
  cr_assert_not_null(r);
  snprintf(r->workload, sizeof r->workload,
           "\xc3\xa9|\xe2\x82\xac|\xf0\x9f\x98\x80|\x80|\xc0\xaf|"
           "\xed\xa0\x80|\xf4\x90\x80\x80|\xe2\x82|\xff|\xe2\x82");
  snprintf(r->allocator, sizeof r->allocator, "pool");
  char *json = NULL;
  size_t len;
  FILE *f = open_memstream(&json, &len);
  cr_assert_not_null(f);
  cr_assert_eq(mpb_report_json(f, r, 1), MP_OK);
  fclose(f);
  const char *want = "\"workload\": \"\xc3\xa9|\xe2\x82\xac|\xf0\x9f\x98\x80|"
                     "\\ufffd|\\ufffd\\ufffd|\\ufffd\\ufffd\\ufffd|"
                     "\\ufffd\\ufffd\\ufffd\\ufffd|\\ufffd\\ufffd|"
                     "\\ufffd|\\ufffd\\ufffd\"";
  cr_expect(strstr(json, want) != NULL, "%s", json);
  free(json);
  free(r);
}

/* The file f as text (a memstream: closed here). */
static char *closed_text(FILE *f, char **buf) {
  fclose(f);
  return *buf;
}

/* Calls are timed in whole nanoseconds, which results.csv and results.md
 * write whole; results.json wrote them with 6 significant digits, so a
 * call of 1 ms or more (cudaMalloc's, a device free that waits) read
 * 1.23457e+06 there and 1234567 in the other two. */
Test(cli_results, json_csv_and_md_write_the_same_nanoseconds) {
  mpb_result_t *r = calloc(1, sizeof *r);
  cr_assert_not_null(r);
  snprintf(r->workload, sizeof r->workload, "w");
  snprintf(r->allocator, sizeof r->allocator, "cuda-malloc");
  r->completed = true;
  r->ns_p50 = 1234567;
  r->ns_p99 = 98765432;
  r->timer_overhead_ns = 1000001;
  char *bufs[3] = {NULL, NULL, NULL};
  size_t lens[3];
  FILE *f[3];
  for (int i = 0; i < 3; i++) {
    f[i] = open_memstream(&bufs[i], &lens[i]);
    cr_assert_not_null(f[i]);
  }
  cr_assert_eq(mpb_report_json(f[0], r, 1), MP_OK);
  cr_assert_eq(mpb_report_csv(f[1], r, 1), MP_OK);
  mpb_report_markdown(f[2], r, 1);
  const char *json = closed_text(f[0], &bufs[0]);
  const char *csv = closed_text(f[1], &bufs[1]);
  const char *md = closed_text(f[2], &bufs[2]);
  cr_expect(strstr(json, "\"ns_per_event_p50\": 1234567,") != NULL, "%s", json);
  cr_expect(strstr(json, "\"ns_per_event_p99\": 98765432,") != NULL, "%s",
            json);
  cr_expect(strstr(json, "\"timer_overhead_ns\": 1000001,") != NULL, "%s",
            json);
  cr_expect(strstr(csv, ",1234567,98765432,") != NULL, "%s", csv);
  cr_expect(strstr(csv, ",1000001,") != NULL, "%s", csv);
  cr_expect(strstr(md, "| 1234567 | 98765432 |") != NULL, "%s", md);
  for (int i = 0; i < 3; i++)
    free(bufs[i]);
  free(r);
}

/* Allocator specs of a tuning sweep run past 95 bytes, and were cut
 * there: two that differ in their last option got rows of one name. They
 * are kept whole now; one too long to keep is bad usage, not cut. */
Test(cli_results, long_allocator_specs_keep_their_whole_name, .init = make_tmp,
     .fini = drop_tmp) {
  char trace[512], out[512], path[600];
  snprintf(trace, sizeof trace, "%s/t.csv", tmpdir);
  snprintf(out, sizeof out, "%s/out", tmpdir);
  write_trace(trace);
  const char *a1 = "pool:max_split=64M,release_threshold=1G,segment_bytes="
                   "32M,defrag_on_oom=1,history=0,align=512,virtual=1";
  const char *a2 = "pool:max_split=64M,release_threshold=1G,segment_bytes="
                   "32M,defrag_on_oom=1,history=0,align=512,virtual=0";
  const char *args[] = {"replay",  "--out",         out,   "--allocator",
                        a1,        "--allocator",   a2,    "--no-plots",
                        "--quiet", "--no-capacity", trace, NULL};
  cr_assert_eq(run(args), 0, "%s", mp_last_error());
  snprintf(path, sizeof path, "%s/results.csv", out);
  const char *csv = slurp(path);
  char row[300];
  snprintf(row, sizeof row, "\nt,\"%s\",", a1);
  cr_expect(strstr(csv, row) != NULL, "%s", csv);
  snprintf(row, sizeof row, "\nt,\"%s\",", a2);
  cr_expect(strstr(csv, row) != NULL, "%s", csv);
  /* Past what a result holds: refused before anything runs. */
  char huge[400]; /* a valid spec: max_split=000...064M */
  snprintf(huge, sizeof huge, "pool:max_split=");
  while (strlen(huge) < 300)
    strcat(huge, "0");
  strcat(huge, "64M");
  char out2[512];
  snprintf(out2, sizeof out2, "%s/out2", tmpdir);
  const char *bad[] = {"replay", "--out",   out2,  "--allocator",
                       huge,     "--quiet", trace, NULL};
  cr_expect_eq(run(bad), 2);
  cr_expect_eq(access(out2, F_OK), -1, "the output folder was created");
}

/* Traces named odd.csv in folders base/n1 and base/n2, replayed through
 * allocator: each gets a row named by its whole path. */
static void expect_a_row_per_odd_trace(const char *base, const char *n1,
                                       const char *n2, const char *allocator) {
  char d[2][1024], t[2][1024], out[1024], path[1024], w[1024];
  const char *names[2] = {n1, n2};
  for (int i = 0; i < 2; i++) {
    cr_assert_lt(snprintf(d[i], sizeof d[i], "%s/%s", base, names[i]), 1000);
    cr_assert_eq(mkdir(d[i], 0777), 0, "%s", d[i]);
    cr_assert_lt(snprintf(t[i], sizeof t[i], "%s/odd.csv", d[i]), 1000);
    write_trace(t[i]);
  }
  cr_assert_lt(snprintf(out, sizeof out, "%s/out", tmpdir), 1000);
  const char *args[] = {"replay",  "--out",   out,          "--allocator",
                        allocator, "--quiet", "--no-plots", "--no-capacity",
                        t[0],      t[1],      NULL};
  cr_assert_eq(run(args), 0);
  cr_assert_lt(snprintf(path, sizeof path, "%s/results.json", out), 1000);
  const char *json = slurp(path);
  for (int i = 0; i < 2; i++) {
    cr_assert_lt(snprintf(w, sizeof w, "\"workload\": \"%s/odd\"", d[i]), 1000);
    cr_expect(strstr(json, w) != NULL, "%s", json);
  }
}

/* Traces of one file name deep in long folders are named by their paths,
 * which were cut at 159 bytes: past it the rows could not be told apart.
 * The path is kept whole now. */
Test(cli_results, traces_in_deep_folders_keep_their_whole_path,
     .init = make_tmp, .fini = drop_tmp) {
  char deep[700];
  /* Three folders of 100 bytes (a file name holds at most 255). */
  snprintf(deep, sizeof deep, "%s", tmpdir);
  for (int k = 0; k < 3; k++) {
    strcat(deep, "/");
    for (int i = 0; i < 100; i++)
      strcat(deep, "d");
    cr_assert_eq(mkdir(deep, 0777), 0, "%s", deep);
  }
  expect_a_row_per_odd_trace(deep, "run1", "run2", "direct");
}

Test(cli_results, traces_with_the_same_file_name_get_rows_of_their_own,
     .init = make_tmp, .fini = drop_tmp) {
  expect_a_row_per_odd_trace(tmpdir, "one", "two", "pool");
}

/* A trace named as a built-in workload that runs beside it (graph.csv and
 * --workload graph) is named by its path: the two rows looked the same
 * and were drawn into one plot. */
Test(cli_results, a_trace_named_as_a_workload_gets_rows_of_its_own,
     .init = make_tmp, .fini = drop_tmp) {
  char dir[512], out[512], path[700];
  snprintf(dir, sizeof dir, "%s/traces", tmpdir);
  snprintf(out, sizeof out, "%s/out", tmpdir);
  cr_assert_eq(mkdir(dir, 0777), 0);
  snprintf(path, sizeof path, "%s/graph.csv", dir);
  write_trace(path);
  const char *args[] = {"run",    "--out",         out,          "--traces",
                        dir,      "--workload",    "graph",      "--allocator",
                        "direct", "--no-capacity", "--no-plots", "--quiet",
                        NULL};
  cr_assert_eq(run(args), 0);
  char w[800];
  snprintf(path, sizeof path, "%s/results.json", out);
  const char *json = slurp(path);
  snprintf(w, sizeof w, "\"workload\": \"%s/graph\"", dir);
  cr_expect(strstr(json, w) != NULL, "%s", json);
  cr_expect(strstr(json, "\"workload\": \"graph\"") != NULL, "%s", json);
}

Test(cli_results, malformed_trace_stops_with_its_line_and_writes_nothing,
     .init = make_tmp, .fini = drop_tmp) {
  char trace[512], out[512];
  snprintf(trace, sizeof trace, "%s/bad.csv", tmpdir);
  snprintf(out, sizeof out, "%s/out", tmpdir);
  FILE *f = fopen(trace, "w");
  fputs("Thread,Time,Action,Pointer,Size,Stream\n"
        "1,00:00:00.000001,allocate,0x1000,64,0\n"
        "1,00:00:00.000002,allocate,0x2000,sixty,0\n",
        f);
  fclose(f);
  const char *args[] = {"replay", "--out", out, "--quiet", trace, NULL};
  cr_expect_eq(run(args), 2);
  cr_expect(strstr(mp_last_error(), "bad.csv:3:") != NULL, "%s",
            mp_last_error());
  cr_expect_eq(access(out, F_OK), -1, "the output folder was created");
}

/* What a trace had that its replay skipped or changed (a free of a pointer
 * it never allocated, an allocation of a live address) is noted in
 * results.md, once per trace, and in results.json: it was said on stdout
 * only, and the files the README points to showed the figures without it. */
Test(cli_results, trace_notes_are_in_results_md_and_json, .init = make_tmp,
     .fini = drop_tmp) {
  char trace[512], out[512], md[600], json[600];
  snprintf(trace, sizeof trace, "%s/odd.csv", tmpdir);
  snprintf(out, sizeof out, "%s/out", tmpdir);
  FILE *f = fopen(trace, "w");
  cr_assert_not_null(f);
  fputs("Thread,Time,Action,Pointer,Size,Stream\n"
        "1,00:00:00.000001,allocate,0x1000,4096,0\n"
        "1,00:00:00.000002,free,0x9000,4096,0\n"
        "1,00:00:00.000003,allocate,0x1000,8192,0\n"
        "1,00:00:00.000004,free,0x1000,8192,0\n",
        f);
  fclose(f);
  const char *args[] = {"replay",      "--out",      out,
                        "--quiet",     "--no-plots", "--no-capacity",
                        "--allocator", "pool",       "--allocator",
                        "direct",      trace,        NULL};
  cr_assert_eq(run(args), 0, "%s", mp_last_error());
  snprintf(md, sizeof md, "%s/results.md", out);
  const char *text = slurp(md);
  const char *note = strstr(text, "Trace notes:");
  cr_expect_not_null(note, "%s", text);
  const char *odd = "- odd: 1 frees of never-allocated pointers skipped, 0 "
                    "'allocate failure' rows skipped, 1 allocations of a "
                    "live address (old block freed first), 0 zero-byte "
                    "allocations\n";
  const char *at = note ? strstr(note, odd) : NULL;
  cr_expect_not_null(at, "%s", text);
  cr_expect(at == NULL || strstr(at + 1, "- odd:") == NULL, "noted twice: %s",
            text);
  snprintf(json, sizeof json, "%s/results.json", out);
  text = slurp(json);
  cr_expect_eq(json_u64(text, "trace_unknown_frees"), 1, "%s", text);
  cr_expect_eq(json_u64(text, "trace_implicit_frees"), 1, "%s", text);
  cr_expect_eq(json_u64(text, "trace_failure_rows"), 0, "%s", text);
  cr_expect_eq(json_u64(text, "trace_zero_size_allocs"), 0, "%s", text);
}

Test(cli_results, unwritable_out_is_bad_usage_before_any_replay,
     .init = make_tmp, .fini = drop_tmp) {
  char file[512], out[600];
  snprintf(file, sizeof file, "%s/a-file", tmpdir);
  FILE *f = fopen(file, "w");
  cr_assert_not_null(f);
  fclose(f);
  snprintf(out, sizeof out, "%s/out", file);
  const char *args[] = {
      "run",         "--out",         out,          "--quiet",
      "--workload",  "random:n=2000", "--no-plots", "--no-capacity",
      "--allocator", "pool",          NULL};
  /* 2 (bad usage or input, found before the run) rather than 1 (a failure
   * while writing, found after the whole run). */
  cr_expect_eq(run(args), 2);
  cr_expect(strstr(mp_last_error(), "a-file is not a folder") != NULL, "%s",
            mp_last_error());
  struct stat sb;
  cr_expect(stat(file, &sb) == 0 && S_ISREG(sb.st_mode));
}

Test(cli_results, out_that_does_not_exist_yet_is_made) {
  cr_expect_eq(mpb_report_check_dir("/tmp/mpbench-nonexistent/a/b/"), MP_OK,
               "%s", mp_last_error());
  cr_expect_eq(access("/tmp/mpbench-nonexistent", F_OK), -1,
               "the check created something");
  cr_expect_eq(mpb_report_check_dir("relative/x"), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mpb_report_check_dir("/proc/self/status/x"), MP_EINVAL);
}

/* A folder whose permissions allow writing but which takes no new entry
 * (/proc: root may write by its permissions, yet nothing can be made in
 * it) fails the check, before any run, and the check leaves nothing
 * behind where it can write. Failed before (as root): the check passed,
 * and the results were lost after the whole run. */
Test(cli_results, an_out_where_nothing_can_be_made_fails_before_the_run,
     .init = make_tmp, .fini = drop_tmp) {
  cr_expect_eq(mpb_report_check_dir("/proc/mpbench-x"), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "/proc") != NULL, "%s", mp_last_error());
  char out[600];
  snprintf(out, sizeof out, "%s/new/out", tmpdir);
  cr_expect_eq(mpb_report_check_dir(out), MP_OK, "%s", mp_last_error());
  DIR *d = opendir(tmpdir);
  cr_assert_not_null(d);
  size_t entries = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    entries += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
  closedir(d);
  cr_expect_eq(entries, 0, "the check left %zu entries in %s", entries, tmpdir);
}

Test(cli_results, bad_arguments_exit_2_and_write_nothing, .init = make_tmp,
     .fini = drop_tmp) {
  char out[512];
  snprintf(out, sizeof out, "%s/out", tmpdir);
  const char *a1[] = {"run", "--out", out, "--bogus", NULL};
  cr_expect_eq(run(a1), 2);
  const char *a2[] = {"run", "--out", out, "--allocator", "tcmalloc", NULL};
  cr_expect_eq(run(a2), 2);
  const char *a3[] = {"run",          "--out",       out, "--allocator",
                      "pool:bogus=1", "--no-traces", NULL};
  cr_expect_eq(run(a3), 2);
  const char *a4[] = {"replay", "--out", out, "/nonexistent/t.csv", NULL};
  cr_expect_eq(run(a4), 2);
  const char *a5[] = {"run", "--out", out, "--workload", "llm:bogus=1", NULL};
  cr_expect_eq(run(a5), 2);
  const char *a6[] = {"replay", "--out", out, NULL};
  cr_expect_eq(run(a6), 2);
  const char *a7[] = {"frobnicate", NULL};
  cr_expect_eq(run(a7), 2);
  const char *a8[] = {"run", "--capacity-budget", "soon", NULL};
  cr_expect_eq(run(a8), 2);
  const char *a11[] = {"run", "--stream-work", "-1", NULL};
  cr_expect_eq(run(a11), 2);
  const char *a12[] = {"run", "--stream-work", "2000000", NULL};
  cr_expect_eq(run(a12), 2);
  const char *a13[] = {"run", "--stream-work", "5us", NULL};
  cr_expect_eq(run(a13), 2);
  const char *a9[] = {"list", "--out", out, NULL};
  cr_expect_eq(run(a9), 2);
  const char *a10[] = {"replay", "--out", out, "/tmp", NULL};
  cr_expect_eq(run(a10), 2);
  cr_expect(strstr(mp_last_error(), "/tmp is a folder") != NULL, "%s",
            mp_last_error());
  cr_expect_eq(access(out, F_OK), -1, "the output folder was created");
  const char *help[] = {"--help", NULL};
  cr_expect_eq(run(help), 0);
}

/* --traces DIR and --no-traces contradict each other: the folder was
 * dropped without a word and only the built-in workloads ran. */
Test(cli_results, traces_and_no_traces_together_are_bad_usage, .init = make_tmp,
     .fini = drop_tmp) {
  char out[512];
  snprintf(out, sizeof out, "%s/out", tmpdir);
  const char *args[] = {
      "run",           "--out",      out,           "--traces",    tmpdir,
      "--no-traces",   "--workload", "random:n=20", "--allocator", "direct",
      "--no-capacity", "--quiet",    NULL};
  cr_expect_eq(run(args), 2);
  cr_expect_eq(access(out, F_OK), -1, "the output folder was created");
  const char *bound[] = {"bound",      "--traces",    tmpdir,    "--no-traces",
                         "--workload", "random:n=20", "--quiet", NULL};
  cr_expect_eq(mpb_test_run(bound, "/dev/null"), 2);
}

/* --no-capacity searches nothing, so a --capacity-budget or
 * --capacity-total beside it was dropped without a word: the user who gave
 * one meant a search. */
Test(cli_results, a_capacity_budget_beside_no_capacity_is_bad_usage,
     .init = make_tmp, .fini = drop_tmp) {
  char out[512];
  snprintf(out, sizeof out, "%s/out", tmpdir);
  const char *opts[] = {"--capacity-budget", "--capacity-total"};
  for (size_t i = 0; i < 2; i++) {
    const char *args[] = {"run",        "--out",         out,
                          "--workload", "random:n=20",   "--allocator",
                          "direct",     "--no-capacity", opts[i],
                          "5",          "--quiet",       NULL};
    cr_expect_eq(run(args), 2, "%s beside --no-capacity was accepted", opts[i]);
  }
  cr_expect_eq(access(out, F_OK), -1, "the output folder was created");
}

/* A trace file in tmpdir (its path in trace) and where --out points (out),
 * for the tests of bad usage below. */
static void out_and_trace(char *out, char *trace, size_t len) {
  snprintf(out, len, "%s/out", tmpdir);
  snprintf(trace, len, "%s/t.csv", tmpdir);
  write_trace(trace);
}

/* Each command line of cmds exits 2 (bad usage), and out is not made. */
static void expect_bad_usage(const char **const *cmds, size_t n,
                             const char *out) {
  for (size_t i = 0; i < n; i++)
    cr_expect_eq(run(cmds[i]), 2, "command line %zu was accepted", i);
  cr_expect_eq(access(out, F_OK), -1, "the output folder was created");
}

/* replay runs the FILEs given and nothing else: --traces and --no-traces
 * (run's) were dropped silently, as --workload is not. */
Test(cli_results, replay_refuses_the_options_of_run, .init = make_tmp,
     .fini = drop_tmp) {
  char out[512], trace[512];
  out_and_trace(out, trace, sizeof out);
  const char *a1[] = {"replay",        "--out",   out,
                      "--no-capacity", "--quiet", "--traces",
                      tmpdir,          trace,     NULL};
  const char *a2[] = {"replay",  "--out",       out,   "--no-capacity",
                      "--quiet", "--no-traces", trace, NULL};
  const char **const cmds[] = {a1, a2};
  expect_bad_usage(cmds, 2, out);
}

/* An option that takes one value, given twice, is ambiguous (which one was
 * meant?), as a key given twice in an option string is: the last one won
 * silently. */
Test(cli_results, an_option_of_one_value_given_twice_is_bad_usage,
     .init = make_tmp, .fini = drop_tmp) {
  char out[512], out2[512];
  snprintf(out, sizeof out, "%s/out", tmpdir);
  snprintf(out2, sizeof out2, "%s/out2", tmpdir);
  const char *twice[][3] = {{"--out", out, out2},
                            {"--device", "host", "host:capacity=8G"},
                            {"--traces", tmpdir, tmpdir},
                            {"--blockmap", "pool", "none"},
                            {"--capacity-budget", "1", "2"},
                            {"--capacity-total", "1", "2"},
                            {"--stream-work", "0", "5"}};
  for (size_t i = 0; i < sizeof twice / sizeof *twice; i++) {
    const char *args[] = {"run",
                          "--quiet",
                          "--no-capacity",
                          "--workload",
                          "random:n=10",
                          twice[i][0],
                          twice[i][1],
                          twice[i][0],
                          twice[i][2],
                          i == 0 ? NULL : "--out",
                          out,
                          NULL};
    cr_expect_eq(run(args), 2, "%s twice was accepted", twice[i][0]);
  }
  cr_expect_eq(access(out, F_OK), -1, "the output folder was created");
  cr_expect_eq(access(out2, F_OK), -1, "the output folder was created");
}

/* The same trace file, workload or allocator twice made two rows of one
 * name (and one plot file for both), where rows are named so that no two
 * look the same. */
Test(cli_results, the_same_trace_workload_or_allocator_twice_is_bad_usage,
     .init = make_tmp, .fini = drop_tmp) {
  char out[512], trace[512];
  out_and_trace(out, trace, sizeof out);
  const char *a1[] = {"replay",  "--out", out,   "--no-capacity",
                      "--quiet", trace,   trace, NULL};
  const char *a2[] = {
      "run",        "--out",       out,          "--quiet",     "--no-capacity",
      "--workload", "random:n=10", "--workload", "random:n=10", NULL};
  const char *a3[] = {"bound", "--quiet", trace, trace, NULL};
  const char *a4[] = {"replay",  "--out",       out,      "--no-capacity",
                      "--quiet", "--allocator", "direct", "--allocator",
                      "direct",  trace,         NULL};
  /* "NAME:", options left empty, is NAME (both ran before, as two rows
   * that looked the same). */
  const char *a5[] = {"replay",  "--out",       out,    "--no-capacity",
                      "--quiet", "--allocator", "pool", "--allocator",
                      "pool:",   trace,         NULL};
  const char *a6[] = {"run",           "--out",      out,       "--quiet",
                      "--no-capacity", "--workload", "random:", "--workload",
                      "random",        NULL};
  const char **const cmds[] = {a1, a2, a3, a4, a5, a6};
  expect_bad_usage(cmds, 6, out);
}

/* One trace file by two paths (DIR/./t.csv, a link to it) ran twice, as
 * two rows of the same figures ("t" and "./t"), which the same path twice
 * may not do. */
Test(cli_results, the_same_trace_file_by_another_path_is_bad_usage,
     .init = make_tmp, .fini = drop_tmp) {
  char out[512], trace[512], dotted[520], link[520];
  out_and_trace(out, trace, sizeof out);
  snprintf(dotted, sizeof dotted, "%s/./t.csv", tmpdir);
  snprintf(link, sizeof link, "%s/l.csv", tmpdir);
  cr_assert_eq(symlink(trace, link), 0);
  const char *a1[] = {"replay",  "--out", out,    "--no-capacity",
                      "--quiet", trace,   dotted, NULL};
  const char *a2[] = {"replay",  "--out", out,  "--no-capacity",
                      "--quiet", trace,   link, NULL};
  const char *a3[] = {"bound", "--quiet", link, dotted, NULL};
  const char **const cmds[] = {a1, a2, a3};
  expect_bad_usage(cmds, 3, out);
}

Test(cli_results, report_html_is_written_with_the_chosen_block_map,
     .init = make_tmp, .fini = drop_tmp) {
  const char *args[] = {"run",         "--workload",    "cnn:batches=5",
                        "--allocator", "direct",        "--allocator",
                        "pool",        "--blockmap",    "direct",
                        "--no-plots",  "--no-capacity", "--quiet",
                        "--out",       tmpdir,          NULL};
  cr_assert_eq(run(args), 0);
  char path[600];
  snprintf(path, sizeof path, "%s/report.html", tmpdir);
  const char *maps = strstr(slurp(path), "id=\"mp-blocks\">");
  cr_assert_not_null(maps);
  cr_expect(strncmp(strstr(maps, "\"allocator\": "),
                    "\"allocator\": \"direct\"", 21) == 0);
  /* A --blockmap that is not run is bad usage. */
  const char *bad[] = {"run",         "--workload",    "cnn:batches=5",
                       "--allocator", "pool",          "--blockmap",
                       "direct",      "--no-capacity", "--quiet",
                       "--out",       tmpdir,          NULL};
  cr_expect_eq(run(bad), 2);
}

/* A total too long for the clock in nanoseconds ("inf", 1e11 s) is no
 * limit, as 0 is: converted to a nanosecond deadline it wrapped (or was
 * undefined), and the search it should have left unbounded never ran,
 * every pair reporting only its upper bound. */
/* Numbers on the command line are plain decimals (seconds may have a
 * fraction and an exponent, or be inf): strtod and strtoul also took hex,
 * leading blanks and a '+', which no other value of mpbench takes. */
Test(cli_results, numbers_in_hex_or_with_blanks_or_signs_are_bad_usage,
     .init = make_tmp, .fini = drop_tmp) {
  char out[512];
  snprintf(out, sizeof out, "%s/out", tmpdir);
  const char *bad[][2] = {
      {"--stream-work", " 5"},       {"--stream-work", "+5"},
      {"--stream-work", "0x10"},     {"--capacity-budget", "0x10"},
      {"--capacity-budget", " 5"},   {"--capacity-budget", "+5"},
      {"--capacity-total", "0x1p4"}, {"--capacity-total", "infinity"},
      {"--capacity-total", "\t1"}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    const char *args[] = {"run",     "--out",      out,
                          "--quiet", "--workload", "random:n=10",
                          bad[i][0], bad[i][1],    NULL};
    cr_expect_eq(run(args), 2, "%s '%s' was accepted", bad[i][0], bad[i][1]);
  }
  cr_expect_eq(access(out, F_OK), -1, "the output folder was created");
}

Test(cli_results, capacity_total_beyond_the_clock_is_no_limit, .init = make_tmp,
     .fini = drop_tmp) {
  char out[512], json[600];
  snprintf(out, sizeof out, "%s/out", tmpdir);
  snprintf(json, sizeof json, "%s/results.json", out);
  static const char *const totals[] = {"inf", "1e11"};
  for (size_t i = 0; i < 2; i++) {
    const char *args[] = {"run",
                          "--out",
                          out,
                          "--quiet",
                          "--no-traces",
                          "--no-plots",
                          "--workload",
                          "random:n=200",
                          "--allocator",
                          "pool",
                          "--capacity-total",
                          totals[i],
                          NULL};
    cr_assert_eq(run(args), 0, "%s", mp_last_error());
    const char *j = slurp(json);
    cr_expect(strstr(j, "\"min_capacity_exact\": true") != NULL,
              "--capacity-total %s: %s", totals[i], j);
  }
}
