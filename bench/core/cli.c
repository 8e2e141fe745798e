/* cli.c - mpbench's command line: parse, load every workload, run every
 * (workload, allocator) pair, report.
 *
 * Everything that can be wrong with the input (options, allocator names and
 * options, workload parameters, trace files) is checked before the first
 * replay runs, so a bad argument or a malformed trace stops the run with a
 * message and writes nothing. Exit status: 0 done (a workload that ran out
 * of memory under an allocator is a result, not an error), 1 a failure
 * while running or writing, 2 bad usage or input. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* internal.h for mp__fail (usage errors through mp_last_error);
 * device/backend.h for mp__device_vm_granularity (mpbench bound's granule). */
#include "device/backend.h"
#include "internal.h"
#include "mpbench.h"
#include "pool/pool_internal.h"

static void mpb_list(FILE *out) {
  fputs("Built-in workloads (NAME or NAME:key=val,...):\n", out);
  mpb_workload_help(out);
  fputs("\nAllocators (--allocator NAME):\n", out);
  mpb_allocator_help(out);
  fputs("\nPool options (pool:KEY=VAL,..., host-pool:KEY=VAL,..., "
        "$MEMPOOL_CONF):\n",
        out);
  (void)mp_pool_config_help(out, "text");
}

static void mpb_usage(FILE *out) {
  fputs(
      "mpbench - replay allocation traces and built-in workloads through "
      "every\nallocator side by side, and report fragmentation and speed.\n"
      "\n"
      "Usage:\n"
      "  mpbench [run] [OPTIONS]              built-in workloads and every "
      "trace\n"
      "  mpbench replay [OPTIONS] FILE...     the given traces (CSV or "
      "snapshot)\n"
      "  mpbench bound [OPTIONS] [FILE...]    per workload, the granule bound "
      "and what\n"
      "                                       an offline placement holds "
      "(traces and\n"
      "                                       workloads as for run, or the "
      "FILEs; a\n"
      "                                       table on stdout)\n"
      "  mpbench list                         workloads, parameters, "
      "allocators\n"
      "  mpbench --help\n"
      "With no arguments mpbench runs the full suite (as `mpbench run`).\n"
      "\n"
      "Options:\n"
      "  --out DIR           write results.json, results.csv, results.md, "
      "report.html\n"
      "                      and PNG plots into DIR (default: out); files "
      "appear\n"
      "                      whole or not at all; an --out that cannot be "
      "written\n"
      "                      is found before the run (exit 2); a file there "
      "that is a\n"
      "                      symbolic link is written through to its "
      "target; the\n"
      "                      files of the last run there that this one does "
      "not\n"
      "                      write (a plot of a workload not run again) are "
      "removed\n"
      "                      (DIR/.run-files lists them), nothing else\n"
      "  --workload SPEC     (run) a built-in workload, NAME or "
      "NAME:key=val,...;\n"
      "                      repeatable. Given, only these run (plus traces "
      "only\n"
      "                      with an explicit --traces). Default: all of "
      "them\n"
      "  --traces DIR        (run) replay every *.csv in DIR and in its "
      "subfolders\n"
      "                      one level down (DIR/*.csv, DIR/*/*.csv),\n"
      "                      each file once (not again through a link to "
      "it).\n"
      "                      Default: $MEMPOOL_TRACES, else shared/traces "
      "found\n"
      "                      next to the source tree or the executable "
      "(not with\n"
      "                      --no-traces, nor with bound's FILEs)\n"
      "  --no-traces         (run, bound without FILEs) built-in workloads "
      "only\n"
      "  --allocator NAME    repeatable; default: all (see `mpbench list`);\n"
      "                      bound: none, each one given adds its ratio "
      "column\n"
      "  --device SPEC       device to run on: host, host:capacity=8G,..., "
      "cuda,\n"
      "                      cuda:N. Default: $MEMPOOL_DEVICE, else cuda "
      "where a\n"
      "                      GPU is usable, else host. Each replay gets a "
      "fresh\n"
      "                      device; on host without capacity= a roomy one "
      "(the\n"
      "                      larger of 16G and 4x the peak live bytes + 1G)\n"
      "  --no-capacity       skip the search for the smallest capacity "
      "(not with\n"
      "                      --capacity-budget or --capacity-total)\n"
      "  --capacity-budget S seconds the capacity search may take per "
      "(workload,\n"
      "                      allocator) pair (default 15); past it the "
      "result is\n"
      "                      an upper bound, shown as <= SIZE; 0 or inf: no "
      "limit\n"
      "  --capacity-total S  seconds all capacity searches together may take "
      "(default\n"
      "                      300), so the suite ends in bounded time; past "
      "it each\n"
      "                      search only checks its upper bound; 0 or inf: "
      "no limit\n"
      "  --stream-work US    on workloads with several streams: after each "
      "event,\n"
      "                      US microseconds of work on its stream and no "
      "catching\n"
      "                      up after frees, so streams run behind the host "
      "(the\n"
      "                      measured run; the capacity search still catches "
      "up).\n"
      "                      Default 0: the device catches up after each "
      "free.\n"
      "                      bound: only with --allocator (its replays)\n"
      "  --no-plots          no PNG plots (report.html is still written)\n"
      "  --blockmap NAME     the allocator whose block map (each block's "
      "address over\n"
      "                      time) report.html shows: one of those run; "
      "default pool,\n"
      "                      else the first one run; none: no block map\n"
      "  --quiet             no progress bar and no notes on stderr\n"
      "  -h, --help          this text\n"
      "\n"
      "Traces: RMM's logging CSV, header Thread,Time,Action,Pointer,Size,"
      "Stream;\n"
      "Time HH:MM:SS.ffffff, Action allocate|free|allocate failure, "
      "Pointer hex\n"
      "or (nil), Size and Stream decimal (at most 4096 streams besides 0,\n"
      "each replayed on a device stream of its own). A malformed line stops\n"
      "the run with the file and line number; so do a free whose size is\n"
      "neither its allocation's nor 0, a free of (nil) with a size, a trace\n"
      "whose live bytes overflow, and one with no allocation of a nonzero\n"
      "size. Skipped and\n"
      "counted (a note says how many): 'allocate failure' rows, frees of\n"
      "pointers the trace never allocated (logs that began mid-run), and\n"
      "double frees (a second free of a block, its address not allocated\n"
      "again between; the note names the first one's line). An\n"
      "allocation of an address still live frees the old block first. "
      "Blocks\n"
      "still live at the end are freed there.\n"
      "A file that starts with byte 0x80 is read as a PyTorch memory "
      "snapshot\n"
      "pickle (torch.cuda.memory._dump_snapshot): the first device trace "
      "with an\n"
      "allocation, 'alloc' as allocate and 'free_completed' as free "
      "('free_requested'\n"
      "where a trace has no free_completed); a bad pickle stops the run "
      "naming the\n"
      "byte offset.\n"
      "Each stream of a trace gets a stream of its own on the device and "
      "frees\n"
      "are stream-ordered. A trace does not say how far behind the device "
      "ran,\n"
      "so after each free on a workload with several streams the device is "
      "let\n"
      "catch up (outside the timed calls): a freed block is reusable from "
      "every\n"
      "stream at the next event, and the figures are the same from run to "
      "run.\n"
      "\n"
      "Figures per (workload, allocator):\n"
      "  peak live       most bytes the workload had requested at once\n"
      "  peak reserved   most device memory the allocator held (its stats; "
      "for\n"
      "                  jemalloc, what its extent hooks got from the "
      "device)\n"
      "  ratio           peak reserved / peak live (1.0 is the limit)\n"
      "  utilization     peak live / peak reserved (GMLake's figure)\n"
      "  avg waste       mean over events of (reserved - live) / reserved, "
      "taken\n"
      "                  after each event (0 while nothing is reserved)\n"
      "  ext. frag       1 - largest free block / free bytes, at peak live "
      "(pools)\n"
      "  device calls    device allocations + frees during the workload\n"
      "  ns p50, p99     time of one allocate or free call "
      "(CLOCK_MONOTONIC), less\n"
      "                  the clock's own cost (median of back-to-back reads, "
      "in\n"
      "                  results.json as timer_overhead_ns)\n"
      "  min capacity    smallest host device capacity at which the "
      "workload\n"
      "                  completes: bisection between peak live and peak\n"
      "                  reserved, to max(1 MiB, 0.1% of peak live), a fresh\n"
      "                  device per probe\n"
      "\n"
      "Figures of `mpbench bound` per workload (G: the device's "
      "virtual-memory\n"
      "granule, 2 MiB on host and CUDA; 2 MiB where it has none):\n"
      "  granule bound   ceil(peak live / G) granules / peak live: the best "
      "any\n"
      "                  allocator that maps whole granules can do\n"
      "  offline         an offline placement that knows every lifetime in "
      "advance\n"
      "                  puts each allocation (rounded up to the pool's "
      "alignment)\n"
      "                  at a fixed offset of one flat range, no two live "
      "ones\n"
      "                  overlapping: greedy first fit, the best of largest "
      "size,\n"
      "                  longest lifetime, size x lifetime and earliest start "
      "first,\n"
      "                  then rounds of largest first with jittered sizes "
      "(order:\n"
      "                  the one that won). ceil(highest end / G) granules / "
      "peak\n"
      "                  live, and raw: highest end / peak live\n"
      "  offline unmapping  the most granules that live blocks of the "
      "placement\n"
      "                  touch at once, in bytes / peak live: what it maps if "
      "each\n"
      "                  granule is unmapped as soon as it is empty (virtual "
      "memory)\n"
      "  ALLOC live granules  per --allocator: the most granules its own "
      "live\n"
      "                  blocks touch at once in the replay, in bytes / peak "
      "live:\n"
      "                  what its placement would hold if its memory were "
      "granule-\n"
      "                  sized physical allocations, each unmapped where it "
      "lies\n"
      "                  empty and mapped again wherever a request needs it "
      "(CUDA\n"
      "                  maps a physical allocation at any granule-aligned "
      "address),\n"
      "                  so that free memory need not be contiguous (blocks "
      "that are\n"
      "                  not granule-aligned, as the direct allocator's on "
      "host,\n"
      "                  touch more than they hold); - where a tenant pauses\n"
      "  Streams and graph pools are ignored (the caught-up case); a paused "
      "tenant's\n"
      "  blocks are off the device. The placements are heuristics: an exact "
      "one may\n"
      "  hold less, never less than peak live. 1.05: impossible (granule "
      "bound above\n"
      "  it), not reached offline, or reached (unmapping: only so)\n",
      out);
  fputc('\n', out);
  mpb_list(out);
}

/* ---- traces ------------------------------------------------------------ */

typedef struct mpb_strv {
  char **v;
  size_t n, cap;
} mpb_strv_t;

/* false, with s unchanged, when out of memory. Through mp__host_* so
 * that a test can make it fail (fault.c). */
static bool mpb_strv_push(mpb_strv_t *s, const char *str) {
  if (s->n == s->cap) {
    size_t ncap = s->cap ? s->cap * 2 : 16;
    char **v = mp__host_realloc(s->v, ncap * sizeof *v);
    if (v == NULL)
      return false;
    s->v = v;
    s->cap = ncap;
  }
  size_t len = strlen(str) + 1;
  char *copy = mp__host_alloc(len);
  if (copy == NULL)
    return false;
  memcpy(copy, str, len);
  s->v[s->n++] = copy;
  return true;
}

/* The arguments could not be kept: said, exit status 1 (as every other
 * out of host memory of mpbench's). */
static int mpb_fail_oom(const char *what) {
  fprintf(stderr, "mpbench: out of host memory keeping %s\n", what);
  return 1;
}

/* A workload or allocator spec as it names its rows: "NAME:" (a colon with
 * no options after it) is NAME, so that "pool" and "pool:" are one
 * allocator, not two rows that look the same. At most n bytes with the
 * terminator (MPB_MAX_* + 1 do). */
static const char *mpb_spec_name(const char *spec, char *buf, size_t n) {
  size_t len = strlen(spec);
  if (len == 0 || len >= n || spec[len - 1] != ':' ||
      memchr(spec, ':', len - 1) != NULL)
    return spec;
  memcpy(buf, spec, len - 1);
  buf[len - 1] = '\0';
  return buf;
}

static bool mpb_strv_has(const mpb_strv_t *s, const char *str) {
  for (size_t i = 0; i < s->n; i++)
    if (strcmp(s->v[i], str) == 0)
      return true;
  return false;
}

static void mpb_strv_free(mpb_strv_t *s) {
  for (size_t i = 0; i < s->n; i++)
    free(s->v[i]);
  free(s->v);
  memset(s, 0, sizeof *s);
}

/* "pytorch/decomfl.csv" -> "pytorch/decomfl". */
static void mpb_trace_name(const char *rel, char *buf, size_t len) {
  snprintf(buf, len, "%s", rel);
  size_t n = strlen(buf);
  if (n > 4 && strcmp(buf + n - 4, ".csv") == 0)
    buf[n - 4] = '\0';
}

/* ---- the run ---------------------------------------------------------------
 */

typedef struct mpb_cli {
  const char *out_dir;
  const char *traces_dir;
  const char *device;
  const char *blockmap; /* NULL: pool, else the first allocator */
  /* --blockmap "NAME:" as NAME, as --allocator names it (mpb_spec_name) */
  char blockmap_name[MPB_MAX_ALLOCATOR + 1];
  bool no_traces, capacity, plots, quiet, replay;
  bool bound; /* `mpbench bound`: FILEs, or workloads and traces as run */
  double budget, total;
  unsigned stream_work_us;
  mpb_strv_t workloads, allocators, files;
} mpb_cli_t;

static void mpb_progress(const mpb_cli_t *c, size_t done, size_t total,
                         const char *what) {
  if (c->quiet || !isatty(2))
    return;
  enum { W = 30 };
  size_t fill = total ? done * W / total : W;
  char bar[W + 1];
  for (size_t i = 0; i < W; i++)
    bar[i] = i < fill ? '#' : '.';
  bar[W] = '\0';
  char shown[MPB_SHOWN];
  fprintf(stderr, "\r\033[K[%s] %zu/%zu %s", bar, done, total,
          mpb_shown(what, shown));
  if (done == total)
    fputs("\r\033[K", stderr);
  fflush(stderr);
}

/* fmt's message, arg (an option, a value, a message quoting them) shown
 * through mp__clip: each control byte '?', one too long for a line cut. */
static int mpb_fail_usage(const char *fmt, const char *arg) {
  char shown[640];
  fprintf(stderr, "mpbench: ");
  fprintf(stderr, fmt, mp__clip(arg, strlen(arg), shown, sizeof shown));
  fprintf(stderr, "\n(mpbench --help lists the options)\n");
  return 2;
}

/* Seconds: "inf", or a plain decimal (mp__read_decimal: a fraction and
 * an exponent if it likes, no hex, blanks, sign or nan, '.' under any
 * locale, nothing a double cannot hold: "1e-400" is not 0, no limit), at
 * least 0. MP_OK; MP_EINVAL for anything else; MP_ENOMEM where a long one
 * (64 characters or more) found no host memory to be read in, which says
 * nothing of the value. */
static mp_status_t mpb_parse_seconds(const char *val, double *out) {
  if (strcmp(val, "inf") == 0) {
    *out = HUGE_VAL;
    return MP_OK;
  }
  double v;
  mp_status_t st = mp__read_decimal(val, strlen(val), &v);
  if (st == MP_OK && v < 0)
    st = MP_EINVAL;
  if (st == MP_OK)
    *out = v;
  return st;
}

/* Options of `run` that `mpbench bound` has no use for: it writes no files
 * and searches no capacity, so given to it they would do nothing. */
static bool mpb_bound_ignores(const char *a) {
  static const char *const opts[] = {
      "--out",         "--blockmap", "--capacity-budget", "--capacity-total",
      "--no-capacity", "--no-plots"};
  for (size_t k = 0; k < sizeof opts / sizeof *opts; k++)
    if (strcmp(a, opts[k]) == 0)
      return true;
  return false;
}

/* The options that take one value; seen: a bit per option, in this order. */
static const char *const mpb_once[] = {
    "--out",        "--traces",          "--device",
    "--blockmap",   "--capacity-budget", "--capacity-total",
    "--stream-work"};

/* Whether option a takes one value and was given before (seen: a bit per
 * such option): twice is ambiguous, as a key twice in an option string. */
static bool mpb_given_twice(const char *a, unsigned *seen) {
  for (unsigned k = 0; k < sizeof mpb_once / sizeof *mpb_once; k++) {
    if (strcmp(a, mpb_once[k]) != 0)
      continue;
    bool twice = (*seen >> k) & 1u;
    *seen |= 1u << k;
    return twice;
  }
  return false;
}

/* Whether the option opt of mpb_once was given (seen: mpb_given_twice's). */
static bool mpb_given(unsigned seen, const char *opt) {
  for (unsigned k = 0; k < sizeof mpb_once / sizeof *mpb_once; k++)
    if (strcmp(opt, mpb_once[k]) == 0)
      return (seen >> k) & 1u;
  return false;
}

/* 2, after a message, where two of the trace files given are one file by
 * two paths ("t.csv" and "./t.csv", a link to it): it would run twice, as
 * rows of the same figures under two names, which the same path given
 * twice may not do. A file stat cannot read is for the load to refuse.
 * -1: they are distinct. */
static int mpb_files_distinct(const mpb_strv_t *files) {
  struct stat *sb = calloc(files->n ? files->n : 1, sizeof *sb);
  bool *known = calloc(files->n ? files->n : 1, sizeof *known);
  int rc = -1;
  if (sb == NULL || known == NULL) {
    fprintf(stderr, "mpbench: out of host memory\n");
    rc = 1;
  }
  for (size_t i = 0; i < files->n && rc < 0; i++) {
    known[i] = stat(files->v[i], &sb[i]) == 0;
    for (size_t j = 0; j < i && known[i] && rc < 0; j++) {
      if (!known[j] || sb[j].st_dev != sb[i].st_dev ||
          sb[j].st_ino != sb[i].st_ino)
        continue;
      char msg[2 * MPB_SHOWN + 96], sj[MPB_SHOWN], si[MPB_SHOWN];
      snprintf(msg, sizeof msg,
               "traces %s and %s are one file (its rows would be run "
               "twice)",
               mpb_shown(files->v[j], sj), mpb_shown(files->v[i], si));
      rc = mpb_fail_usage("%s", msg);
    }
  }
  free(sb);
  free(known);
  return rc;
}

static int mpb_parse(int argc, char **argv, mpb_cli_t *c) {
  int i = 1;
  unsigned seen = 0;
  if (argc > 1 && argv[1][0] != '-') {
    if (strcmp(argv[1], "run") == 0)
      c->replay = false;
    else if (strcmp(argv[1], "replay") == 0)
      c->replay = true;
    else if (strcmp(argv[1], "bound") == 0)
      c->bound = true;
    else if (strcmp(argv[1], "help") == 0 || strcmp(argv[1], "list") == 0) {
      if (argc > 2)
        return mpb_fail_usage("unexpected argument '%s'", argv[2]);
      if (argv[1][0] == 'h')
        mpb_usage(stdout);
      else
        mpb_list(stdout);
      return 0;
    } else
      return mpb_fail_usage("unknown command '%s' (run, replay, bound, list)",
                            argv[1]);
    i = 2;
  }
  for (; i < argc; i++) {
    const char *a = argv[i];
    const char *val = i + 1 < argc ? argv[i + 1] : NULL;
    bool takes = strcmp(a, "--out") == 0 || strcmp(a, "--workload") == 0 ||
                 strcmp(a, "--traces") == 0 || strcmp(a, "--allocator") == 0 ||
                 strcmp(a, "--device") == 0 || strcmp(a, "--blockmap") == 0 ||
                 strcmp(a, "--capacity-budget") == 0 ||
                 strcmp(a, "--capacity-total") == 0 ||
                 strcmp(a, "--stream-work") == 0;
    if (takes && val == NULL)
      return mpb_fail_usage("%s needs a value", a);
    if (takes)
      i++;
    if (mpb_given_twice(a, &seen))
      return mpb_fail_usage("%s given twice (which one was meant?)", a);
    if (c->bound && mpb_bound_ignores(a))
      return mpb_fail_usage("%s: bound prints one table on stdout and searches "
                            "no capacity; it does not take this option",
                            a);
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      mpb_usage(stdout);
      return 0;
    } else if (strcmp(a, "--out") == 0) {
      c->out_dir = val;
    } else if (strcmp(a, "--workload") == 0) {
      if (c->replay)
        return mpb_fail_usage("%s: replay takes trace files, not workloads", a);
      if (strlen(val) > MPB_MAX_NAME)
        return mpb_fail_usage("--workload %.60s...: longer than a result's "
                              "name holds",
                              val);
      char name[MPB_MAX_NAME + 1];
      val = mpb_spec_name(val, name, sizeof name);
      if (mpb_strv_has(&c->workloads, val))
        return mpb_fail_usage("--workload %s given twice (its rows would "
                              "look the same)",
                              val);
      if (!mpb_strv_push(&c->workloads, val))
        return mpb_fail_oom("the --workload arguments");
    } else if (strcmp(a, "--traces") == 0) {
      if (c->replay)
        return mpb_fail_usage("%s: replay takes trace files, not a folder", a);
      c->traces_dir = val;
    } else if (strcmp(a, "--allocator") == 0) {
      if (strlen(val) > MPB_MAX_ALLOCATOR) {
        char msg[160];
        snprintf(msg, sizeof msg,
                 "--allocator %.60s...: longer than the %d bytes a result's "
                 "name holds",
                 val, MPB_MAX_ALLOCATOR);
        return mpb_fail_usage("%s", msg);
      }
      char name[MPB_MAX_ALLOCATOR + 1];
      val = mpb_spec_name(val, name, sizeof name);
      if (mpb_allocator_check_name(val) != MP_OK)
        return mpb_fail_usage("%s", mp_last_error());
      if (mpb_strv_has(&c->allocators, val))
        return mpb_fail_usage("--allocator %s given twice (its rows would "
                              "look the same)",
                              val);
      if (!mpb_strv_push(&c->allocators, val))
        return mpb_fail_oom("the --allocator arguments");
    } else if (strcmp(a, "--device") == 0) {
      c->device = val;
    } else if (strcmp(a, "--blockmap") == 0) {
      /* Named as --allocator names its rows, so that the "pool:" run
       * (row "pool") is found by the same spelling. */
      c->blockmap =
          mpb_spec_name(val, c->blockmap_name, sizeof c->blockmap_name);
    } else if (strcmp(a, "--capacity-budget") == 0 ||
               strcmp(a, "--capacity-total") == 0) {
      mp_status_t st =
          mpb_parse_seconds(val, a[11] == 'b' ? &c->budget : &c->total);
      if (st == MP_ENOMEM) {
        fprintf(stderr, "mpbench: out of host memory reading %s\n", a);
        return 1;
      }
      if (st != MP_OK) {
        char msg[320];
        snprintf(msg, sizeof msg,
                 "bad %s '%.200s' (seconds: a plain decimal a double holds, "
                 "0 or more; or inf)",
                 a, val);
        return mpb_fail_usage("%s", msg);
      }
    } else if (strcmp(a, "--stream-work") == 0) {
      uint64_t us;
      if (!mp__parse_u64(val, strlen(val), &us) || us > 1000000)
        return mpb_fail_usage(
            "bad --stream-work '%s' (microseconds, 0 to 1000000)", val);
      c->stream_work_us = (unsigned)us;
    } else if (strcmp(a, "--no-capacity") == 0) {
      c->capacity = false;
    } else if (strcmp(a, "--no-traces") == 0) {
      if (c->replay)
        return mpb_fail_usage("%s: replay runs the trace files given", a);
      c->no_traces = true;
    } else if (strcmp(a, "--no-plots") == 0) {
      c->plots = false;
    } else if (strcmp(a, "--quiet") == 0) {
      c->quiet = true;
    } else if (a[0] == '-' && a[1] != '\0') {
      return mpb_fail_usage("unknown option '%s'", a);
    } else if (c->replay || c->bound) {
      if (mpb_strv_has(&c->files, a))
        return mpb_fail_usage("trace %s given twice (its rows would look the "
                              "same)",
                              a);
      if (!mpb_strv_push(&c->files, a))
        return mpb_fail_oom("the trace file arguments");
    } else {
      return mpb_fail_usage("unexpected argument '%s' (trace files go to "
                            "`mpbench replay`)",
                            a);
    }
  }
  if (c->replay && c->files.n == 0)
    return mpb_fail_usage("%s", "replay needs at least one trace file");
  int frc = mpb_files_distinct(&c->files);
  if (frc >= 0)
    return frc;
  /* A folder that would not be read is a mistake to say, not to drop. */
  if (c->traces_dir != NULL && c->no_traces)
    return mpb_fail_usage("--traces %s and --no-traces contradict each other",
                          c->traces_dir);
  /* A budget for a search that does not run would be dropped silently. */
  for (int k = 0; k < 2 && !c->capacity; k++) {
    const char *opt = k ? "--capacity-total" : "--capacity-budget";
    if (mpb_given(seen, opt))
      return mpb_fail_usage("%s: --no-capacity searches no capacity", opt);
  }
  if (c->traces_dir != NULL && c->files.n > 0)
    return mpb_fail_usage("--traces %s: bound replays the trace files given "
                          "(or, given none, the folder's)",
                          c->traces_dir);
  if (c->no_traces && c->files.n > 0)
    return mpb_fail_usage("%s", "--no-traces: bound replays the trace files "
                                "given (--no-traces is for built-in "
                                "workloads only)");
  /* bound replays only for its --allocator columns. */
  if (c->bound && c->allocators.n == 0 && mpb_given(seen, "--stream-work"))
    return mpb_fail_usage("%s", "--stream-work: bound replays nothing "
                                "without an --allocator");
  return -1; /* go on */
}

typedef struct mpb_job {
  mpb_workload_t *w;
  size_t nw;
} mpb_jobs_t;

static void mpb_jobs_free(mpb_jobs_t *j) {
  for (size_t i = 0; i < j->nw; i++)
    mpb_workload_free(&j->w[i]);
  free(j->w);
}

/* The name of trace file f at level (mpb_load: each one a longer part of
 * what was given): its file name less .csv, its path less .csv, its path,
 * ./ and its path. */
enum { MPB_NAME_LEVELS = 4 };
static void mpb_file_trace_name(const char *f, unsigned level, char *buf,
                                size_t len) {
  const char *base = strrchr(f, '/');
  if (level == 0)
    mpb_trace_name(base ? base + 1 : f, buf, len);
  else if (level == 1)
    mpb_trace_name(f, buf, len);
  else
    snprintf(buf, len, "%s%s", level == 3 && base == NULL ? "./" : "", f);
}

/* Whether a trace named name would share its rows' name with one of the
 * nspecs built-in workloads that run (named by their spec). */
static bool mpb_names_a_workload(const char *name, const char *const *specs,
                                 size_t nspecs) {
  for (size_t i = 0; i < nspecs; i++)
    if (strcmp(specs[i], name) == 0)
      return true;
  return false;
}

/* Loads or generates every workload; a bad one stops everything. */
static int mpb_load(const mpb_cli_t *c, mpb_jobs_t *jobs) {
  mpb_strv_t traces = {0}, names = {0};
  char dirbuf[PATH_MAX];
  const char *dir = NULL;
  int rc = 0;
  /* bound FILE... loads the files (and only the --workload given). */
  bool files = c->replay || c->files.n > 0;
  /* The built-in workloads to run: --workload's, or all of them. */
  size_t nbuilt = 0;
  const char *const *specs = (const char *const *)c->workloads.v;
  if (!c->replay) {
    if (c->workloads.n == 0 && !files) {
      specs = mpb_builtin_names;
      while (specs[nbuilt] != NULL)
        nbuilt++;
    } else {
      nbuilt = c->workloads.n;
    }
  }
  if (files) {
    /* Named by file name; where two names would be the same, or a name a
     * workload's, by the path as given, then with its extension, then as
     * ./FILE: no two rows of the results look the same. */
    size_t nf = c->files.n;
    unsigned char *level = calloc(nf ? nf : 1, 1);
    char(*nm)[PATH_MAX] = calloc(nf ? nf : 1, sizeof *nm);
    if (level == NULL || nm == NULL)
      rc = 1;
    for (bool again = rc == 0; again;) {
      for (size_t i = 0; i < nf; i++)
        mpb_file_trace_name(c->files.v[i], level[i], nm[i], sizeof nm[i]);
      again = false;
      for (size_t i = 0; i < nf; i++) {
        bool same = mpb_names_a_workload(nm[i], specs, nbuilt);
        for (size_t j = 0; j < nf && !same; j++)
          same = j != i && strcmp(nm[i], nm[j]) == 0;
        if (same && level[i] < MPB_NAME_LEVELS - 1) {
          level[i]++;
          again = true;
        }
      }
    }
    for (size_t i = 0; i < nf && rc == 0; i++)
      if (!mpb_strv_push(&traces, c->files.v[i]) ||
          !mpb_strv_push(&names, nm[i]))
        rc = 1;
    free(level);
    free(nm);
  } else if (!c->no_traces && (c->workloads.n == 0 || c->traces_dir)) {
    dir = c->traces_dir ? c->traces_dir : mpb_traces_dir(dirbuf, sizeof dirbuf);
    if (dir == NULL) {
      if (!c->quiet)
        fprintf(stderr, "mpbench: no traces folder found (set --traces DIR "
                        "or $MEMPOOL_TRACES); built-in workloads only\n");
    } else {
      char **rel = NULL, **same = NULL;
      size_t nrel = 0, nsame = 0;
      if (mpb_traces_scan(dir, &rel, &nrel, &same, &nsame) != MP_OK) {
        fprintf(stderr, "mpbench: %s\n", mp_last_error());
        return 2;
      }
      /* A link to a trace in the folder would have run it twice. */
      for (size_t i = 0; i < nsame && !c->quiet; i++) {
        char shown_dir[MPB_SHOWN], shown[MPB_SHOWN];
        fprintf(stderr, "mpbench: traces %s: %s (one file, replayed once)\n",
                mpb_shown(dir, shown_dir), mpb_shown(same[i], shown));
      }
      mpb_traces_free(same, nsame);
      for (size_t i = 0; i < nrel; i++) {
        char path[PATH_MAX * 2], nm[PATH_MAX * 2];
        snprintf(path, sizeof path, "%s/%s", dir, rel[i]);
        /* By its path where its name is a workload's (graph.csv). */
        mpb_trace_name(rel[i], nm, sizeof nm);
        if (mpb_names_a_workload(nm, specs, nbuilt))
          mpb_trace_name(path, nm, sizeof nm);
        if (!mpb_strv_push(&traces, path) || !mpb_strv_push(&names, nm))
          rc = 1;
      }
      mpb_traces_free(rel, nrel);
    }
  }
  if (rc != 0) {
    fprintf(stderr, "mpbench: out of host memory\n");
    goto out;
  }
  for (size_t i = 0; i < names.n; i++)
    if (strlen(names.v[i]) > MPB_MAX_NAME) {
      char shown[MPB_SHOWN];
      fprintf(stderr,
              "mpbench: trace %s: its name (%zu bytes) is longer than the %d "
              "a result holds; move it to a shorter path\n",
              mpb_shown(traces.v[i], shown), strlen(names.v[i]), MPB_MAX_NAME);
      rc = 2;
      goto out;
    }
  jobs->w = calloc(nbuilt + traces.n + 1, sizeof *jobs->w);
  if (jobs->w == NULL) {
    rc = 1;
    goto out;
  }
  for (size_t i = 0; i < nbuilt; i++) {
    if (mpb_workload_generate(specs[i], &jobs->w[jobs->nw]) != MP_OK) {
      fprintf(stderr, "mpbench: %s\n", mp_last_error());
      rc = 2;
      goto out;
    }
    jobs->nw++;
  }
  for (size_t i = 0; i < traces.n; i++) {
    if (!c->quiet && isatty(2)) {
      char shown[MPB_SHOWN];
      fprintf(stderr, "\r\033[Kloading %s", mpb_shown(traces.v[i], shown));
    }
    if (mpb_trace_load(traces.v[i], names.v[i], &jobs->w[jobs->nw]) != MP_OK) {
      if (!c->quiet && isatty(2))
        fputs("\r\033[K", stderr);
      fprintf(stderr, "mpbench: %s\n", mp_last_error());
      rc = 2;
      goto out;
    }
    jobs->nw++;
  }
  if (!c->quiet && isatty(2))
    fputs("\r\033[K", stderr);
out:
  mpb_strv_free(&traces);
  mpb_strv_free(&names);
  return rc;
}

/* Under bound's table: what each trace of jobs had that its replay skipped
 * or changed (trace.c), so that no figure hides it (run's table notes it
 * itself: mpb_report_markdown). */
static void mpb_trace_notes(const mpb_jobs_t *jobs) {
  bool noted = false;
  for (size_t w = 0; w < jobs->nw; w++) {
    const mpb_workload_t *x = &jobs->w[w];
    mpb_report_trace_note(stdout, x->name, x->unknown_frees, x->failure_rows,
                          x->implicit_frees, x->zero_size_allocs, &noted);
    mpb_report_double_free_note(stdout, x->name, x->double_frees,
                                x->double_free_at, &noted);
  }
}

/* Which of names can run on dev: into *allocs, the others with why into
 * *unavailable. 2 (after a message) where one cannot be made: a bad name
 * or option. */
static int mpb_check_allocators(const char *const *names, size_t nnames,
                                mp_device_t *dev, mpb_strv_t *allocs,
                                mpb_strv_t *unavailable) {
  for (size_t i = 0; i < nnames; i++) {
    char why[160], line[MPB_SHOWN + 200], shown[MPB_SHOWN];
    if (!mpb_allocator_available(names[i], dev, why, sizeof why)) {
      snprintf(line, sizeof line, "%s: %s", mpb_shown(names[i], shown), why);
      if (!mpb_strv_push(unavailable, line))
        return mpb_fail_oom("the allocators that cannot run");
      continue;
    }
    mpb_allocator_t *a;
    /* Made once to check its name and options; a device too small for
     * it (a child's range) is for the replays to report. */
    mp_status_t st = mpb_allocator_open(names[i], dev, NULL, &a);
    if (st == MP_OK) {
      mpb_allocator_close(a);
    } else if (st != MP_ENOMEM && st != MP_ELIMIT) {
      fprintf(stderr, "mpbench: allocator %s: %s\n", mpb_shown(names[i], shown),
              mp_last_error());
      return 2;
    }
    if (!mpb_strv_push(allocs, names[i]))
      return mpb_fail_oom("the allocators to run");
  }
  return 0;
}

/* mpbench bound: per workload, the granule bound and the offline placement
 * (offline.c), beside the ratio of each --allocator given (a replay
 * without the capacity search), as one table on stdout. */
static int mpb_bound(const mpb_cli_t *c) {
  mpb_jobs_t jobs = {0};
  mpb_strv_t allocs = {0}, unavailable = {0};
  mpb_offline_t *off = NULL;
  mpb_result_t *res = NULL;
  size_t *touched = NULL;
  mp_device_t *dev = NULL;
  int rc = 0;
  if (mp_device_open(c->device, &dev) != MP_OK) {
    char shown[MPB_SHOWN];
    fprintf(stderr, "mpbench: cannot open device %s: %s\n",
            c->device ? mpb_shown(c->device, shown) : "(default)",
            mp_last_error());
    return 2;
  }
  /* The granule the pool maps on this device; one without virtual memory
   * maps whole segments, for which CUDA's 2 MiB stands in. */
  size_t granule = (size_t)2 << 20;
  if (mp__device_vm_granularity(dev, &granule) != MP_OK)
    granule = (size_t)2 << 20;
  /* The alignment the pool rounds every block to (MEMPOOL_CONF's, if set). */
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  if (mp__config_validate(&cfg) != MP_OK) {
    /* A pool would refuse it: bound's alignment would be made up. */
    fprintf(stderr, "mpbench: bound: %s\n", mp_last_error());
    mp_device_close(dev);
    return 2;
  }
  size_t align = cfg.align ? cfg.align : 512;
  char devname[MPB_SHOWN]; /* the driver's name for it, shown */
  mpb_shown(mp_device_name(dev), devname);
  rc = mpb_check_allocators((const char *const *)c->allocators.v,
                            c->allocators.n, dev, &allocs, &unavailable);
  mp_device_close(dev);
  if (rc != 0 || (rc = mpb_load(c, &jobs)) != 0)
    goto out;
  if (jobs.nw == 0) {
    fprintf(stderr, "mpbench: nothing to run\n");
    rc = 2;
    goto out;
  }
  off = calloc(jobs.nw, sizeof *off);
  res = calloc(jobs.nw * (allocs.n ? allocs.n : 1), sizeof *res);
  touched = calloc(jobs.nw * (allocs.n ? allocs.n : 1), sizeof *touched);
  if (off == NULL || res == NULL || touched == NULL) {
    fprintf(stderr, "mpbench: out of host memory\n");
    rc = 1;
    goto out;
  }
  mpb_replay_opts_t ro = {.device_spec = c->device,
                          .stream_work_us = c->stream_work_us};
  uint64_t t0 = mpb_now_ns();
  for (size_t w = 0; w < jobs.nw; w++) {
    mpb_progress(c, w, jobs.nw, jobs.w[w].name);
    mp_status_t st =
        mpb_offline_place(&jobs.w[w], align, granule, NULL, 0, &off[w]);
    if (st != MP_OK) {
      /* Its message names the workload; EINVAL: blocks no range holds
       * (sizes past the address space), which is bad input. */
      if (!c->quiet && isatty(2))
        fputs("\r\033[K", stderr);
      fprintf(stderr, "mpbench: %s\n", mp_last_error());
      rc = st == MP_EINVAL ? 2 : 1;
      goto out;
    }
    for (size_t a = 0; a < allocs.n && st == MP_OK; a++) {
      /* Beside the ratio, the granules its live blocks touched at most
       * (not where a tenant pauses: its blocks leave the device). */
      mpb_touched_t tr;
      mpb_touched_init(&tr, granule);
      bool track = jobs.w[w].ntenants <= 1;
      ro.on_block = track ? mpb_touched_on_block : NULL;
      ro.on_block_ctx = track ? &tr : NULL;
      st = mpb_replay(&jobs.w[w], allocs.v[a], &ro, &res[w * allocs.n + a]);
      touched[w * allocs.n + a] = track ? mpb_touched_peak_bytes(&tr) : 0;
      mpb_touched_free(&tr);
    }
    if (st != MP_OK) {
      if (!c->quiet && isatty(2))
        fputs("\r\033[K", stderr);
      char shown[MPB_SHOWN];
      fprintf(stderr, "mpbench: %s: %s\n", mpb_shown(jobs.w[w].name, shown),
              mp_last_error());
      rc = 1;
      goto out;
    }
  }
  mpb_progress(c, jobs.nw, jobs.nw, "");
  printf("mpbench bound on %s: %zu workloads in %.1f s (granule %zu KiB, "
         "sizes rounded to %zu B)\n\n",
         devname, jobs.nw, (double)(mpb_now_ns() - t0) / 1e9, granule >> 10,
         align);
  mpb_report_bound(stdout, off, jobs.nw, res, touched, allocs.n);
  if (unavailable.n > 0) {
    printf("\nUnavailable here:\n");
    for (size_t i = 0; i < unavailable.n; i++)
      printf("- %s\n", unavailable.v[i]);
  }
  mpb_trace_notes(&jobs);
  fflush(stdout);
out:
  free(off);
  free(res);
  free(touched);
  mpb_jobs_free(&jobs);
  mpb_strv_free(&allocs);
  mpb_strv_free(&unavailable);
  return rc;
}

/* rc, or 1 (said on stderr) where what went to stdout did not all get
 * there (a full disk, a closed pipe): a table that was not printed is no
 * success. */
static int mpb_stdout_status(int rc) {
  int err = fflush(stdout) == 0 ? 0 : errno;
  if (err == 0 && !ferror(stdout))
    return rc;
  fprintf(stderr, "mpbench: writing to standard output failed: %s\n",
          err != 0 ? strerror(err) : "a write failed");
  return rc == 0 ? 1 : rc;
}

int mpb_main(int argc, char **argv) {
  /* Its own writes decide (tests and embedders call it more than once). */
  clearerr(stdout);
  mpb_cli_t c = {.out_dir = "out",
                 .capacity = true,
                 .plots = true,
                 .budget = 15,
                 .total = 300};
  int rc = mpb_parse(argc, argv, &c);
  mpb_jobs_t jobs = {0};
  mpb_result_t *res = NULL;
  mpb_blockmap_t *maps = NULL;
  size_t nmaps = 0;
  mp_device_t *dev = NULL;
  mpb_strv_t unavailable = {0}, allocs = {0};
  char shown_out[MPB_SHOWN]; /* --out as its messages show it */
  if (rc >= 0)
    goto out;
  if (c.bound) {
    rc = mpb_bound(&c);
    goto out;
  }
  rc = 0;
  /* The device and the allocators, checked before any work. */
  if (mp_device_open(c.device, &dev) != MP_OK) {
    char shown[MPB_SHOWN];
    fprintf(stderr, "mpbench: cannot open device %s: %s\n",
            c.device ? mpb_shown(c.device, shown) : "(default)",
            mp_last_error());
    rc = 2;
    goto out;
  }
  const char *const *names = (const char *const *)c.allocators.v;
  size_t nnames = c.allocators.n;
  if (nnames == 0) {
    names = mpb_default_allocators;
    while (names[nnames] != NULL)
      nnames++;
  }
  if ((rc = mpb_check_allocators(names, nnames, dev, &allocs, &unavailable)) !=
      0)
    goto out;
  char devname[MPB_SHOWN]; /* the driver's name for it, shown */
  mpb_shown(mp_device_name(dev), devname);
  mp_device_close(dev);
  dev = NULL;
  if (allocs.n == 0) {
    fprintf(stderr, "mpbench: none of the allocators can run on %s\n", devname);
    rc = 2;
    goto out;
  }
  /* The allocator whose block map report.html shows (SIZE_MAX: none). */
  size_t map_alloc = SIZE_MAX;
  for (size_t i = 0; i < allocs.n; i++)
    if (strcmp(allocs.v[i], c.blockmap ? c.blockmap : "pool") == 0)
      map_alloc = i;
  if (c.blockmap == NULL && map_alloc == SIZE_MAX)
    map_alloc = 0;
  if (c.blockmap != NULL && strcmp(c.blockmap, "none") != 0 &&
      map_alloc == SIZE_MAX) {
    char shown[MPB_SHOWN];
    fprintf(stderr, "mpbench: --blockmap %s is not one of the allocators run\n",
            mpb_shown(c.blockmap, shown));
    rc = 2;
    goto out;
  }
  if (mpb_report_check_dir(c.out_dir) != MP_OK) {
    fprintf(stderr, "mpbench: --out %s: %s\n", mpb_shown(c.out_dir, shown_out),
            mp_last_error());
    rc = 2;
    goto out;
  }
  if ((rc = mpb_load(&c, &jobs)) != 0)
    goto out;
  if (jobs.nw == 0) {
    fprintf(stderr, "mpbench: nothing to run\n");
    rc = 2;
    goto out;
  }
  if (c.plots && mpb_report_check_plots(c.out_dir, jobs.w, jobs.nw) != MP_OK) {
    fprintf(stderr, "mpbench: --out %s: %s\n", mpb_shown(c.out_dir, shown_out),
            mp_last_error());
    rc = 2;
    goto out;
  }
  size_t total = jobs.nw * allocs.n, done = 0;
  res = calloc(total, sizeof *res);
  maps = calloc(jobs.nw, sizeof *maps);
  if (res == NULL || maps == NULL) {
    fprintf(stderr, "mpbench: out of host memory\n");
    rc = 1;
    goto out;
  }
  uint64_t t0 = mpb_now_ns();
  /* A total the clock cannot reach in nanoseconds (inf, 1e11 s) is no
   * limit, as 0 is: converted, it would wrap or be undefined. */
  double total_ns = c.total * 1e9;
  mpb_replay_opts_t ro = {
      .device_spec = c.device,
      .capacity_search = c.capacity,
      .capacity_budget_s = c.budget,
      .stream_work_us = c.stream_work_us,
      .capacity_deadline_ns =
          c.total > 0 && total_ns < 0x1p63 ? t0 + (uint64_t)total_ns : 0};
  for (size_t w = 0; w < jobs.nw; w++) {
    for (size_t a = 0; a < allocs.n; a++) {
      char what[MPB_MAX_NAME + MPB_MAX_ALLOCATOR + 8];
      snprintf(what, sizeof what, "%s / %s", jobs.w[w].name, allocs.v[a]);
      mpb_progress(&c, done, total, what);
      ro.on_block = NULL;
      ro.on_block_ctx = NULL;
      if (a == map_alloc) {
        if (!mpb_blockmap_init(&maps[nmaps], &jobs.w[w], allocs.v[a])) {
          fprintf(stderr, "mpbench: out of host memory\n");
          rc = 1;
          goto out;
        }
        ro.on_block = mpb_blockmap_on_block;
        ro.on_block_ctx = &maps[nmaps++];
      }
      if (mpb_replay(&jobs.w[w], allocs.v[a], &ro, &res[done]) != MP_OK) {
        if (!c.quiet && isatty(2))
          fputs("\r\033[K", stderr);
        char shown[MPB_SHOWN];
        fprintf(stderr, "mpbench: %s: %s\n", mpb_shown(what, shown),
                mp_last_error());
        rc = 1;
        goto out;
      }
      /* A run that failed stopped there: so does its map. */
      if (a == map_alloc)
        mpb_blockmap_end(&maps[nmaps - 1], res[done].events);
      done++;
    }
  }
  mpb_progress(&c, done, total, "");
  double secs = (double)(mpb_now_ns() - t0) / 1e9;

  bool plotted;
  char why[512];
  if (mpb_report_write_maps(c.out_dir, res, done, maps, nmaps, c.plots,
                            &plotted, why, sizeof why) != MP_OK) {
    fprintf(stderr, "mpbench: writing results to %s: %s\n",
            mpb_shown(c.out_dir, shown_out), mp_last_error());
    rc = 1;
    goto out;
  }
  printf("mpbench on %s: %zu workloads x %zu allocators in %.1f s\n\n", devname,
         jobs.nw, allocs.n, secs);
  mpb_report_markdown(stdout, res, done);
  if (unavailable.n > 0) {
    printf("\nUnavailable here:\n");
    for (size_t i = 0; i < unavailable.n; i++)
      printf("- %s\n", unavailable.v[i]);
  }
  if (!plotted && c.plots)
    printf("\nNo plots: %s\n", why);
  /* Whole (a path to copy), but each control byte '?' (mp__clip). */
  char out_whole[PATH_MAX + 8];
  mp__clip(c.out_dir, strlen(c.out_dir), out_whole, sizeof out_whole);
  printf("\nResults: %s/results.json, %s/results.csv, %s/results.md, "
         "%s/report.html%s\n",
         out_whole, out_whole, out_whole, out_whole,
         plotted ? ", plots *.png" : "");
  fflush(stdout);
out:
  if (dev != NULL)
    mp_device_close(dev);
  free(res);
  for (size_t i = 0; i < nmaps; i++)
    mpb_blockmap_free(&maps[i]);
  free(maps);
  mpb_jobs_free(&jobs);
  mpb_strv_free(&unavailable);
  mpb_strv_free(&allocs);
  mpb_strv_free(&c.workloads);
  mpb_strv_free(&c.allocators);
  mpb_strv_free(&c.files);
  return mpb_stdout_status(rc);
}
