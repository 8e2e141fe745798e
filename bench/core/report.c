/* report.c - the results as a Markdown table, JSON, CSV and gnuplot PNGs
 * (and report.html, written by html.c).
 *
 * Files appear whole or not at all: everything is written into a temporary
 * folder inside the output folder (same file system), and only once all of
 * it is written are the files renamed into place; a failure removes the
 * temporary folder and leaves the output folder as it was (a rename that
 * fails midway puts back the files the renames before it replaced). The
 * folder's .run-files lists what a run wrote, so that the next removes those of
 * its files it does not write again (stale plots). Plots are drawn by one
 * gnuplot process from data files in that temporary folder; without gnuplot
 * everything else is still written and the caller is told why. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* internal.h for: mp__fail, mp__fmt_bytes (sizes written as the library writes
 * them). */
#include "internal.h"
#include "mpbench.h"

static const char *mpb_bytes(char *buf, size_t len, size_t b) {
  return mp__fmt_bytes(buf, len, b);
}

static const char *mpb_capacity_text(const mpb_result_t *r, char *buf,
                                     size_t len) {
  char b[32];
  switch (r->capacity_state) {
  case MPB_CAP_EXACT:
    snprintf(buf, len, "%s", mpb_bytes(b, sizeof b, r->min_capacity));
    break;
  case MPB_CAP_BOUND:
    snprintf(buf, len, "<= %s", mpb_bytes(b, sizeof b, r->min_capacity));
    break;
  case MPB_CAP_NA: snprintf(buf, len, "n/a"); break;
  default: snprintf(buf, len, "-"); break;
  }
  return buf;
}

/* s as a Markdown table cell: a '|' in it (a trace file "a|b.csv") would
 * end the cell, so it is escaped, and a control byte (a newline in a
 * file's name), which would end the row, is written '?'. */
static void mpb_md_cell(FILE *out, const char *s) {
  for (; *s; s++) {
    if (*s == '|')
      fputc('\\', out);
    fputc((unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s, out);
  }
}

/* The runs of r that failed, each with its error, under a table. */
static void mpb_report_failed(FILE *out, const mpb_result_t *r, size_t n) {
  bool any_failed = false;
  for (size_t i = 0; i < n; i++)
    if (!r[i].completed) {
      if (!any_failed)
        fprintf(out, "\nFailed runs (figures up to the failure):\n");
      any_failed = true;
      fputs("- ", out);
      mpb_md_cell(out, r[i].workload);
      fputs(" / ", out);
      mpb_md_cell(out, r[i].allocator);
      fprintf(out, ": %s\n", r[i].error);
    }
}

/* A trace note's start: the heading before the first (*noted false), then
 * "- NAME". */
static void mpb_note_start(FILE *out, const char *name, bool *noted) {
  if (!*noted)
    fprintf(out, "\nTrace notes:\n");
  *noted = true;
  fputs("- ", out);
  mpb_md_cell(out, name);
}

void mpb_report_trace_note(FILE *out, const char *name, uint64_t unknown_frees,
                           uint64_t failure_rows, uint64_t implicit_frees,
                           uint64_t zero_size_allocs, bool *noted) {
  if (unknown_frees + failure_rows + implicit_frees + zero_size_allocs == 0)
    return;
  mpb_note_start(out, name, noted);
  fprintf(out,
          ": %llu frees of never-allocated pointers skipped, %llu "
          "'allocate failure' rows skipped, %llu allocations of a live "
          "address (old block freed first), %llu zero-byte allocations\n",
          (unsigned long long)unknown_frees, (unsigned long long)failure_rows,
          (unsigned long long)implicit_frees,
          (unsigned long long)zero_size_allocs);
}

void mpb_report_double_free_note(FILE *out, const char *name, uint64_t count,
                                 const char *at, bool *noted) {
  if (count == 0)
    return;
  mpb_note_start(out, name, noted);
  fprintf(out,
          ": %llu double frees skipped (a second free of a block, its "
          "address not allocated again between), the first at ",
          (unsigned long long)count);
  mpb_md_cell(out, at);
  fputc('\n', out);
}

/* The trace notes of r's workloads, each once (its first row's). */
static void mpb_report_trace_notes(FILE *out, const mpb_result_t *r, size_t n) {
  bool noted = false;
  for (size_t i = 0; i < n; i++) {
    bool seen = false;
    for (size_t j = 0; j < i && !seen; j++)
      seen = strcmp(r[j].workload, r[i].workload) == 0;
    if (!seen) {
      mpb_report_trace_note(out, r[i].workload, r[i].unknown_frees,
                            r[i].failure_rows, r[i].implicit_frees,
                            r[i].zero_size_allocs, &noted);
      mpb_report_double_free_note(out, r[i].workload, r[i].double_frees,
                                  r[i].double_free_at, &noted);
    }
  }
}

mp_status_t mpb_report_markdown(FILE *out, const mpb_result_t *r, size_t n) {
  fprintf(out, "| workload | allocator | peak live | peak reserved | ratio | "
               "utilization | avg waste | ext. frag | device calls | ns p50 "
               "| ns p99 | min capacity |\n");
  fprintf(out, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (size_t i = 0; i < n; i++) {
    char a[32], b[32], c[48], f[16], d[24];
    if (r[i].has_device_calls)
      snprintf(d, sizeof d, "%llu", (unsigned long long)r[i].device_calls);
    else
      snprintf(d, sizeof d, "n/a");
    if (r[i].has_ext_frag)
      snprintf(f, sizeof f, "%.3f", r[i].ext_frag);
    else
      snprintf(f, sizeof f, "n/a");
    fputs("| ", out);
    mpb_md_cell(out, r[i].workload);
    fputs(" | ", out);
    mpb_md_cell(out, r[i].allocator);
    fprintf(out,
            "%s | %s | %s | %.3f | %.3f | %.3f | %s | %s | %.0f | "
            "%.0f | %s |\n",
            r[i].completed ? "" : " (FAILED)",
            mpb_bytes(a, sizeof a, r[i].peak_live),
            mpb_bytes(b, sizeof b, r[i].peak_reserved), r[i].ratio,
            r[i].utilization, r[i].avg_waste, f, d, r[i].ns_p50, r[i].ns_p99,
            mpb_capacity_text(&r[i], c, sizeof c));
  }
  bool any_graph = false;
  for (size_t i = 0; i < n; i++)
    if (r[i].graph_pinned > 0) {
      char a[32];
      if (!any_graph)
        fprintf(out, "\nMemory captured graphs pinned (at most at once):\n");
      any_graph = true;
      /* Names as the other lists write them: a newline in a trace's
       * file name would start a line of its own. */
      fputs("- ", out);
      mpb_md_cell(out, r[i].workload);
      fputs(" / ", out);
      mpb_md_cell(out, r[i].allocator);
      fprintf(out, ": %s\n", mpb_bytes(a, sizeof a, r[i].graph_pinned));
    }
  bool any_pause = false;
  for (size_t i = 0; i < n; i++)
    if (r[i].pauses > 0) {
      if (!any_pause)
        fprintf(out, "\nPause and resume (content kept), median per GiB "
                     "moved:\n\n| workload | allocator | pauses | pause "
                     "ms/GiB | resume ms/GiB |\n|---|---|---:|---:|---:|\n");
      any_pause = true;
      fputs("| ", out);
      mpb_md_cell(out, r[i].workload);
      fputs(" | ", out);
      mpb_md_cell(out, r[i].allocator);
      fprintf(out, " | %u | %.1f | %.1f |\n", r[i].pauses,
              r[i].pause_ms_per_gib, r[i].resume_ms_per_gib);
    }
  mpb_report_trace_notes(out, r, n);
  mpb_report_failed(out, r, n);
  return ferror(out) ? mp__fail(MP_EINVAL, "writing the table failed") : MP_OK;
}

void mpb_report_bound(FILE *out, const mpb_offline_t *o, size_t n,
                      const mpb_result_t *r, const size_t *touched,
                      size_t nalloc) {
  fputs("| workload | peak live | granule bound | offline | offline raw | "
        "order | offline unmapping | order |",
        out);
  for (size_t a = 0; a < nalloc; a++) {
    fputs(" `", out);
    mpb_md_cell(out, r[a].allocator);
    fputs("` | `", out);
    mpb_md_cell(out, r[a].allocator);
    fputs("` live granules |", out);
  }
  fputs(" 1.05 |\n|---|---:|---:|---:|---:|---|---:|---|", out);
  for (size_t a = 0; a < nalloc; a++)
    fputs("---:|---:|", out);
  fputs("---|\n", out);
  for (size_t i = 0; i < n; i++) {
    char b[32];
    fputs("| ", out);
    mpb_md_cell(out, o[i].workload);
    fprintf(out, " | %s | %.3f | %.3f | %.3f | %s | %.3f | %s |",
            mpb_bytes(b, sizeof b, o[i].peak_live), o[i].bound, o[i].ratio,
            o[i].raw, mpb_offline_orders[o[i].order], o[i].mapped_ratio,
            mpb_offline_orders[o[i].mapped_order]);
    for (size_t a = 0; a < nalloc; a++) {
      const mpb_result_t *x = &r[i * nalloc + a];
      fprintf(out, x->completed ? " %.3f |" : " %.3f (FAILED) |", x->ratio);
      size_t tb = touched != NULL ? touched[i * nalloc + a] : 0;
      if (tb > 0 && x->peak_live > 0)
        fprintf(out, " %.3f |", (double)tb / (double)x->peak_live);
      else
        fputs(" - |", out);
    }
    /* Whether 1.05 can be reached at all: not with whole granules; not by
     * these offline placements (heuristics: an exact one might), even
     * unmapping free granules at once; by one that unmaps; or as placed. */
    fprintf(out, " %s |\n",
            o[i].bound > 1.05          ? "impossible (granules)"
            : o[i].mapped_ratio > 1.05 ? "not reached offline"
            : o[i].ratio > 1.05        ? "reached offline, unmapping"
                                       : "reached offline");
  }
  mpb_report_failed(out, r, n * nalloc);
}

/* Bytes in the valid UTF-8 sequence at s (RFC 3629: no overlong form, no
 * surrogate, nothing past U+10FFFF), 0 where none begins. Stops at a NUL
 * (not a continuation byte). */
static size_t mpb_utf8_len(const unsigned char *s) {
  size_t n;
  uint32_t cp, least;
  if (s[0] < 0x80)
    return 1;
  if (s[0] >= 0xc2 && s[0] <= 0xdf) {
    n = 2, cp = s[0] & 0x1fu, least = 0x80;
  } else if ((s[0] & 0xf0) == 0xe0) {
    n = 3, cp = s[0] & 0x0fu, least = 0x800;
  } else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
    n = 4, cp = s[0] & 0x07u, least = 0x10000;
  } else {
    return 0;
  }
  for (size_t i = 1; i < n; i++) {
    if ((s[i] & 0xc0) != 0x80)
      return 0;
    cp = cp << 6 | (s[i] & 0x3fu);
  }
  if (cp < least || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
    return 0;
  return n;
}

/* Names are bytes (a file name need not be UTF-8): valid UTF-8 is written
 * as it is, each byte of anything else as U+FFFD, so that the output is
 * always JSON that loads. */
void mpb_json_str(FILE *out, const char *s) {
  fputc('"', out);
  for (const unsigned char *p = (const unsigned char *)s; *p;) {
    unsigned char c = *p;
    size_t n = mpb_utf8_len(p);
    if (n == 0)
      fputs("\\ufffd", out);
    else if (n > 1)
      fwrite(p, 1, n, out);
    else if (c == '"' || c == '\\')
      fprintf(out, "\\%c", c);
    else if (c < 0x20 || c == '<')
      fprintf(out, "\\u%04x", c);
    else
      fputc(c, out);
    p += n ? n : 1;
  }
  fputc('"', out);
}

/* A JSON number (null where v is no finite one): 6 significant digits,
 * or whole where it counts whole units. */
static void mpb_json_real(FILE *out, double v, bool whole) {
  if (!isfinite(v))
    fputs("null", out);
  else if (whole)
    fprintf(out, "%.0f", v);
  else
    fprintf(out, "%.6g", v);
}

static void mpb_json_num(FILE *out, double v) {
  mpb_json_real(out, v, false);
}

/* Nanoseconds are whole (timed calls, the clock's cost): written whole, as
 * results.csv and results.md write them, not cut to 6 digits. */
static void mpb_json_ns(FILE *out, double v) {
  mpb_json_real(out, v, true);
}

mp_status_t mpb_report_json(FILE *out, const mpb_result_t *r, size_t n) {
  fputs("[", out);
  for (size_t i = 0; i < n; i++) {
    const mpb_result_t *x = &r[i];
    fputs(i ? ",\n  {" : "\n  {", out);
    fputs("\"workload\": ", out);
    mpb_json_str(out, x->workload);
    fputs(", \"allocator\": ", out);
    mpb_json_str(out, x->allocator);
    fputs(", \"device\": ", out);
    mpb_json_str(out, x->device);
    fprintf(out, ", \"completed\": %s, \"error\": ",
            x->completed ? "true" : "false");
    mpb_json_str(out, x->error);
    fprintf(out,
            ", \"events\": %llu, \"peak_live_bytes\": %zu, "
            "\"peak_reserved_bytes\": %zu, \"graph_pinned_bytes\": %zu, "
            "\"ratio\": ",
            (unsigned long long)x->events, x->peak_live, x->peak_reserved,
            x->graph_pinned);
    mpb_json_num(out, x->ratio);
    fputs(", \"utilization\": ", out);
    mpb_json_num(out, x->utilization);
    fputs(", \"avg_waste\": ", out);
    mpb_json_num(out, x->avg_waste);
    fputs(", \"external_fragmentation\": ", out);
    if (x->has_ext_frag)
      mpb_json_num(out, x->ext_frag);
    else
      fputs("null", out);
    fputs(", \"device_calls\": ", out);
    if (x->has_device_calls)
      fprintf(out, "%llu", (unsigned long long)x->device_calls);
    else
      fputs("null", out);
    fputs(", \"ns_per_event_p50\": ", out);
    mpb_json_ns(out, x->ns_p50);
    fputs(", \"ns_per_event_p99\": ", out);
    mpb_json_ns(out, x->ns_p99);
    fputs(", \"timer_overhead_ns\": ", out);
    mpb_json_ns(out, x->timer_overhead_ns);
    fputs(", \"min_capacity_bytes\": ", out);
    if (x->capacity_state == MPB_CAP_EXACT ||
        x->capacity_state == MPB_CAP_BOUND)
      fprintf(out, "%zu", x->min_capacity);
    else
      fputs("null", out);
    fprintf(out,
            ", \"min_capacity_exact\": %s, \"capacity_probes\": %u, "
            "\"seconds\": ",
            x->capacity_state == MPB_CAP_EXACT ? "true" : "false",
            x->capacity_probes);
    mpb_json_num(out, x->seconds);
    fprintf(out, ", \"pauses\": %u, \"pause_ms_per_gib\": ", x->pauses);
    if (x->pauses > 0)
      mpb_json_num(out, x->pause_ms_per_gib);
    else
      fputs("null", out);
    fputs(", \"resume_ms_per_gib\": ", out);
    if (x->pauses > 0)
      mpb_json_num(out, x->resume_ms_per_gib);
    else
      fputs("null", out);
    fprintf(out,
            ", \"trace_unknown_frees\": %llu, \"trace_failure_rows\": %llu, "
            "\"trace_implicit_frees\": %llu, \"trace_zero_size_allocs\": "
            "%llu",
            (unsigned long long)x->unknown_frees,
            (unsigned long long)x->failure_rows,
            (unsigned long long)x->implicit_frees,
            (unsigned long long)x->zero_size_allocs);
    fprintf(out,
            ", \"trace_double_frees\": %llu, \"trace_first_double_free\": ",
            (unsigned long long)x->double_frees);
    if (x->double_frees > 0)
      mpb_json_str(out, x->double_free_at);
    else
      fputs("null", out);
    fputs("}", out);
  }
  fputs("\n]\n", out);
  return ferror(out) ? mp__fail(MP_EINVAL, "writing JSON failed") : MP_OK;
}

/* A control byte as a line of gnuplot's (its script, its data) takes it:
 * '?', as results.md writes it. A newline (a trace file's name may have
 * one) would end the command, or the data row, midway. */
static int mpb_gp_byte(char c) {
  return (unsigned char)c < 0x20 || c == 0x7f ? '?' : c;
}

/* s between two q, each q inside doubled: CSV's "..." and gnuplot's '...'
 * quoting alike; one_line: control bytes as '?' (gnuplot's, whose quotes
 * hold no line break; CSV's do). */
static void mpb_put_quoted(FILE *out, const char *s, char q, bool one_line) {
  fputc(q, out);
  for (; *s; s++) {
    if (*s == q)
      fputc(q, out);
    fputc(one_line ? mpb_gp_byte(*s) : *s, out);
  }
  fputc(q, out);
}

static void mpb_csv_str(FILE *out, const char *s) {
  if (strpbrk(s, ",\"\r\n") == NULL)
    fputs(s, out);
  else
    mpb_put_quoted(out, s, '"', false);
}

mp_status_t mpb_report_csv(FILE *out, const mpb_result_t *r, size_t n) {
  fputs("workload,allocator,device,completed,events,peak_live_bytes,"
        "peak_reserved_bytes,ratio,utilization,avg_waste,"
        "external_fragmentation,device_calls,ns_per_event_p50,"
        "ns_per_event_p99,min_capacity_bytes,min_capacity_exact,"
        "capacity_probes,seconds,timer_overhead_ns,pauses,pause_ms_per_gib,"
        "resume_ms_per_gib,error\n",
        out);
  for (size_t i = 0; i < n; i++) {
    const mpb_result_t *x = &r[i];
    mpb_csv_str(out, x->workload);
    fputc(',', out);
    mpb_csv_str(out, x->allocator);
    fputc(',', out);
    mpb_csv_str(out, x->device);
    fprintf(out, ",%s,%llu,%zu,%zu,%.6g,%.6g,%.6g,", x->completed ? "1" : "0",
            (unsigned long long)x->events, x->peak_live, x->peak_reserved,
            x->ratio, x->utilization, x->avg_waste);
    if (x->has_ext_frag)
      fprintf(out, "%.6g", x->ext_frag);
    fputc(',', out);
    if (x->has_device_calls)
      fprintf(out, "%llu", (unsigned long long)x->device_calls);
    fprintf(out, ",%.0f,%.0f,", x->ns_p50, x->ns_p99);
    if (x->capacity_state == MPB_CAP_EXACT ||
        x->capacity_state == MPB_CAP_BOUND)
      fprintf(out, "%zu", x->min_capacity);
    fprintf(out, ",%d,%u,%.3f,%.0f,%u,", x->capacity_state == MPB_CAP_EXACT,
            x->capacity_probes, x->seconds, x->timer_overhead_ns, x->pauses);
    if (x->pauses > 0)
      fprintf(out, "%.6g,%.6g", x->pause_ms_per_gib, x->resume_ms_per_gib);
    else
      fputc(',', out);
    fputc(',', out);
    mpb_csv_str(out, x->error);
    fputc('\n', out);
  }
  return ferror(out) ? mp__fail(MP_EINVAL, "writing CSV failed") : MP_OK;
}

/* ---- files ------------------------------------------------------------------
 */

static mp_status_t mpb_mkdir_p(const char *dir) {
  char path[4096];
  if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
    return mp__fail(MP_EINVAL, "output folder name too long");
  char sp[MPB_SHOWN];
  for (char *p = path + 1; *p; p++) {
    if (*p != '/')
      continue;
    *p = '\0';
    if (mkdir(path, 0777) != 0 && errno != EEXIST)
      return mp__fail(MP_EINVAL, "cannot create %s: %s", mpb_shown(path, sp),
                      strerror(errno));
    *p = '/';
  }
  if (mkdir(path, 0777) != 0 && errno != EEXIST)
    return mp__fail(MP_EINVAL, "cannot create %s: %s", mpb_shown(path, sp),
                    strerror(errno));
  struct stat sb;
  if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
    return mp__fail(MP_EINVAL, "%s is not a folder", mpb_shown(path, sp));
  return MP_OK;
}

/* Where name goes in dir (dest). A symbolic link there is written through:
 * the file it points to gets the new contents, as a user who linked
 * results.md into a docs folder expects (a rename onto the link would put a
 * file of mpbench's own in its place and leave the docs as they were). A
 * link that points nowhere, to a folder or to anything but a regular file,
 * and a folder of that name, are errors that name the file: nothing is
 * written then. *linked: whether dest is a link's target. */
static mp_status_t mpb_out_dest(const char *dir, const char *name, char *dest,
                                size_t len, bool *linked) {
  char path[4400];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  *linked = false;
  /* path, its link's text and its target as the messages show them */
  char sp[MPB_SHOWN], st_[MPB_SHOWN], sg[MPB_SHOWN];
  struct stat sb;
  if (lstat(path, &sb) != 0) {
    if (errno != ENOENT)
      return mp__fail(MP_EINVAL, "cannot use %s: %s", mpb_shown(path, sp),
                      strerror(errno));
    snprintf(dest, len, "%s", path);
    return MP_OK;
  }
  if (S_ISDIR(sb.st_mode))
    return mp__fail(MP_EINVAL, "%s is a folder: results not written",
                    mpb_shown(path, sp));
  if (!S_ISLNK(sb.st_mode)) {
    snprintf(dest, len, "%s", path);
    return MP_OK;
  }
  char to[4096];
  ssize_t n = readlink(path, to, sizeof to - 1);
  to[n < 0 ? 0 : n] = '\0';
  char *target = realpath(path, NULL);
  if (target == NULL) {
    if (errno == ENOENT)
      return mp__fail(MP_EINVAL,
                      "%s is a symbolic link to %s, which does not exist: "
                      "results not written",
                      mpb_shown(path, sp), mpb_shown(to, st_));
    return mp__fail(MP_EINVAL,
                    "%s is a symbolic link to %s, which cannot be used (%s): "
                    "results not written",
                    mpb_shown(path, sp), mpb_shown(to, st_), strerror(errno));
  }
  mp_status_t st = MP_OK;
  if (stat(target, &sb) != 0)
    st = mp__fail(MP_EINVAL, "%s is a symbolic link to %s (%s): %s",
                  mpb_shown(path, sp), mpb_shown(to, st_),
                  mpb_shown(target, sg), strerror(errno));
  else if (S_ISDIR(sb.st_mode))
    st = mp__fail(MP_EINVAL,
                  "%s is a symbolic link to the folder %s: results not "
                  "written",
                  mpb_shown(path, sp), mpb_shown(target, sg));
  else if (!S_ISREG(sb.st_mode))
    st = mp__fail(MP_EINVAL,
                  "%s is a symbolic link to %s, which is not a regular file: "
                  "results not written",
                  mpb_shown(path, sp), mpb_shown(target, sg));
  else if (snprintf(dest, len, "%s", target) >= (int)len)
    st = mp__fail(MP_EINVAL, "the target of %s is too long a path",
                  mpb_shown(path, sp));
  else
    *linked = true;
  free(target);
  return st;
}

/* A name for a new file beside path (in its folder, hidden):
 * ".NAME.mpbenchTAG-XXXXXX", for mkstemp. false where path has no folder
 * part or the name does not fit. */
static bool mpb_name_beside(const char *path, const char *tag, char *out,
                            size_t len) {
  const char *slash = strrchr(path, '/');
  if (slash == NULL)
    return false;
  int dirlen = (int)(slash - path);
  return snprintf(out, len, "%.*s/.%s.mpbench%s-XXXXXX", dirlen, path,
                  slash + 1, tag) < (int)len;
}

/* The file from (in the temporary folder) copied to a new file beside
 * target, with target's permissions, so that a rename replaces target in
 * one step (a rename cannot cross file systems, and a link's target may be
 * on another). staged: the new file's path. */
static mp_status_t mpb_stage_beside(const char *from, const char *target,
                                    char *staged, size_t len) {
  char sp[MPB_SHOWN];
  if (!mpb_name_beside(target, "", staged, len)) /* realpath's: absolute */
    return mp__fail(MP_EINVAL, "%s is too long a path", mpb_shown(target, sp));
  int out = mkstemp(staged);
  if (out < 0)
    return mp__fail(MP_EINVAL, "cannot write beside %s: %s",
                    mpb_shown(target, sp), strerror(errno));
  int in = open(from, O_RDONLY);
  int err = in < 0 ? errno : 0;
  char buf[65536];
  while (err == 0) {
    ssize_t n = read(in, buf, sizeof buf);
    if (n == 0)
      break;
    if (n < 0) {
      err = errno == EINTR ? 0 : errno;
      continue;
    }
    for (ssize_t w = 0; err == 0 && w < n;) {
      ssize_t k = write(out, buf + w, (size_t)(n - w));
      if (k > 0)
        w += k;
      else if (k == 0 || errno != EINTR)
        err = k == 0 ? EIO : errno;
    }
  }
  struct stat sb;
  if (err == 0 &&
      (stat(target, &sb) != 0 || fchmod(out, sb.st_mode & 07777) != 0))
    err = errno;
  if (in >= 0)
    close(in);
  if (close(out) != 0 && err == 0)
    err = errno;
  if (err != 0) {
    unlink(staged);
    return mp__fail(MP_EINVAL, "cannot write beside %s: %s",
                    mpb_shown(target, sp), strerror(err));
  }
  return MP_OK;
}

/* One result file's way into place: from (in the temporary folder, or
 * staged beside a link's target) to its destination; old, the file it
 * replaces, kept under a second name until every file is in place. */
typedef struct {
  char from[4400], to[4400], old[4400];
  bool staged, existed, kept, moved;
} mpb_move_t;

/* A second name (a hard link beside it, on the same file system) for the
 * file at path, if there is one: *existed says whether there is, *kept
 * whether it has the name old now. A file system without hard links keeps
 * nothing: the rename still replaces the file whole, but a later failure
 * cannot put it back. */
static void mpb_keep_old(const char *path, char *old, size_t len, bool *existed,
                         bool *kept) {
  struct stat sb;
  *existed = lstat(path, &sb) == 0;
  *kept = false;
  /* path: dir/name or an absolute path */
  if (!*existed || !mpb_name_beside(path, "-old", old, len))
    return;
  int fd = mkstemp(old); /* a free name, then the link takes it */
  if (fd < 0)
    return;
  close(fd);
  unlink(old);
  *kept = link(path, old) == 0;
}

/* After the rename of mv[failed] failed: each file moved before it is put
 * back as it was (the kept file renamed back, a file that was not there
 * removed). true when all were; else why says what is left of the first
 * that was not (its kept copy stays: the cleanup removes only what is no
 * longer needed). Two result names linked to one file keep two links of
 * it: renamed back onto the file it already is, a kept link stays and is
 * removed here. */
static bool mpb_put_back(mpb_move_t *mv, size_t failed, char *why, size_t len) {
  bool all = true;
  size_t lost = 0;
  for (size_t i = failed; i-- > 0;) {
    bool back;
    if (mv[i].kept) {
      back = rename(mv[i].old, mv[i].to) == 0;
      if (back) {
        unlink(mv[i].old); /* still there when it was a link of mv[i].to */
        mv[i].kept = false;
      } else if (all) {
        char sp[MPB_SHOWN], so[MPB_SHOWN];
        snprintf(why, len, "the run before's %s is kept as %s",
                 mpb_shown(mv[i].to, sp), mpb_shown(mv[i].old, so));
      }
    } else {
      back = !mv[i].existed && unlink(mv[i].to) == 0;
      char sp[MPB_SHOWN];
      if (!back && all)
        snprintf(why, len, "%s is this run's%s", mpb_shown(mv[i].to, sp),
                 mv[i].existed ? " (the run before's could not be kept)" : "");
    }
    lost += !back;
    all = all && back;
  }
  if (lost > 1) {
    size_t n = strlen(why);
    snprintf(why + n, len - n, " (and %zu more not put back)", lost - 1);
  }
  return all;
}

/* name in dir as the run will write it (mpb_out_dest), before the run:
 * where it is a symbolic link, a file must also be possible beside its
 * target (mpb_stage_beside makes one there), so one is made there and
 * removed again. */
static mp_status_t mpb_check_dest(const char *dir, const char *name) {
  char dest[4400], probe[4400];
  bool linked;
  mp_status_t st = mpb_out_dest(dir, name, dest, sizeof dest, &linked);
  if (st != MP_OK || !linked)
    return st;
  char sd[MPB_SHOWN], sg[MPB_SHOWN];
  if (!mpb_name_beside(dest, "", probe, sizeof probe))
    return mp__fail(MP_EINVAL, "%s is too long a path", mpb_shown(dest, sg));
  int fd = mkstemp(probe);
  if (fd < 0)
    return mp__fail(MP_EINVAL,
                    "%s/%s is a symbolic link to %s, beside which no file "
                    "can be made (%s): results could not be written",
                    mpb_shown(dir, sd), name, mpb_shown(dest, sg),
                    strerror(errno));
  close(fd);
  unlink(probe);
  return MP_OK;
}

/* The files mpbench always writes (plots come and go with the workloads). */
static const char *const mpb_out_names[] = {"results.json", "results.csv",
                                            "results.md", "report.html"};
/* Beside them, the names of every file the run wrote, so that the next run
 * into the folder can remove those it does not write again. */
#define MPB_OUT_LIST ".run-files"

mp_status_t mpb_report_check_dir(const char *dir) {
  char path[4096];
  if (dir == NULL || dir[0] == '\0')
    return mp__fail(MP_EINVAL, "empty output folder name");
  if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
    return mp__fail(MP_EINVAL, "output folder name too long");
  /* A result file already there that cannot be replaced (a link to nothing,
   * to a folder, into a folder nothing can be made in) fails now, not after
   * the run. */
  struct stat db;
  if (stat(dir, &db) == 0 && S_ISDIR(db.st_mode))
    for (size_t i = 0; i < sizeof mpb_out_names / sizeof *mpb_out_names; i++) {
      mp_status_t st = mpb_check_dest(dir, mpb_out_names[i]);
      if (st == MP_OK && i == 0)
        st = mpb_check_dest(dir, MPB_OUT_LIST);
      if (st != MP_OK)
        return st;
    }
  /* The nearest part of the path that exists decides: it must be a folder
   * this process can create entries in. Its permissions do not tell (root
   * passes them where nothing can be made, as in /proc), so an empty
   * folder is made there and removed again: nothing is left. */
  char sp[MPB_SHOWN], st_[MPB_SHOWN]; /* path, a link's text, shown */
  for (;;) {
    struct stat sb;
    if (stat(path, &sb) == 0) {
      if (!S_ISDIR(sb.st_mode))
        return mp__fail(MP_EINVAL, "%s is not a folder", mpb_shown(path, sp));
      char probe[4200];
      snprintf(probe, sizeof probe, "%s/.mpbench-XXXXXX", path);
      if (mkdtemp(probe) == NULL)
        return mp__fail(MP_EINVAL, "cannot write into %s: %s",
                        mpb_shown(path, sp), strerror(errno));
      (void)rmdir(probe);
      return MP_OK;
    }
    int err = errno;
    if (err != ENOENT && err != ENOTDIR) /* ENOTDIR: found above */
      return mp__fail(MP_EINVAL, "cannot use %s: %s", mpb_shown(path, sp),
                      strerror(err));
    /* A symbolic link whose target is not there: mkdir finds the link and
     * makes nothing, so no folder can be made at or under it. */
    struct stat lb;
    if (lstat(path, &lb) == 0 && S_ISLNK(lb.st_mode)) {
      char to[4096];
      ssize_t n = readlink(path, to, sizeof to - 1);
      to[n < 0 ? 0 : n] = '\0';
      return mp__fail(MP_EINVAL,
                      "%s is a symbolic link to %s, which cannot be used "
                      "(%s): no folder can be made there",
                      mpb_shown(path, sp), mpb_shown(to, st_), strerror(err));
    }
    /* "a/b/" is "a/b": that entry next, not the one above it (a file
     * "a/b" fails "a/b/" with ENOTDIR and must be said). */
    size_t len = strlen(path);
    if (len > 1 && path[len - 1] == '/') {
      while (len > 1 && path[len - 1] == '/')
        path[--len] = '\0';
      continue;
    }
    char *slash = strrchr(path, '/');
    if (strcmp(path, ".") == 0) /* the start of every relative path */
      return mp__fail(MP_EINVAL, "cannot use the current folder: %s",
                      strerror(err));
    if (slash == NULL)
      snprintf(path, sizeof path, ".");
    else if (slash == path)
      snprintf(path, sizeof path, "/");
    else
      *slash = '\0';
  }
}

static void mpb_rm_tree(const char *dir) {
  DIR *d = opendir(dir);
  if (d == NULL)
    return;
  struct dirent *e;
  char path[4400];
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path)
      unlink(path);
  }
  closedir(d);
  rmdir(dir);
}

/* A file name for a workload: letters, digits, '.', '-' kept, the rest '_'. */
static void mpb_file_stem(const char *name, char *buf, size_t len) {
  size_t i = 0;
  for (; name[i] && i + 1 < len; i++) {
    char c = name[i];
    bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                (c >= '0' && c <= '9') || c == '.' || c == '-';
    buf[i] = keep ? c : '_';
  }
  buf[i] = '\0';
}

/* Distinct names, each a copy, as many as there are (a run may have any
 * number of workloads, each with its plot). oom: a name could not be
 * added. */
typedef struct mpb_names {
  char **v;
  size_t n, cap;
  bool oom;
} mpb_names_t;

static bool mpb_names_has(const mpb_names_t *ns, const char *s) {
  for (size_t i = 0; i < ns->n; i++)
    if (strcmp(ns->v[i], s) == 0)
      return true;
  return false;
}

static void mpb_names_add(mpb_names_t *ns, const char *s) {
  if (mpb_names_has(ns, s))
    return;
  char *copy = NULL;
  if (!mpb_grow(&ns->v, &ns->cap, ns->n, sizeof *ns->v) ||
      (copy = strdup(s)) == NULL) {
    ns->oom = true;
    return;
  }
  ns->v[ns->n++] = copy;
}

static void mpb_names_free(mpb_names_t *ns) {
  for (size_t i = 0; i < ns->n; i++)
    free(ns->v[i]);
  free(ns->v);
  memset(ns, 0, sizeof *ns);
}

/* Whether name is one mpbench writes into an output folder: one of
 * mpb_out_names, ratios.png, or bytes_STEM.png (mpb_file_stem's letters). */
static bool mpb_own_name(const char *name) {
  for (size_t i = 0; i < sizeof mpb_out_names / sizeof *mpb_out_names; i++)
    if (strcmp(name, mpb_out_names[i]) == 0)
      return true;
  if (strcmp(name, "ratios.png") == 0)
    return true;
  size_t n = strlen(name);
  if (n <= 10 || strncmp(name, "bytes_", 6) != 0 ||
      strcmp(name + n - 4, ".png") != 0)
    return false;
  for (size_t i = 6; i < n - 4; i++)
    if (strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
               "0123456789.-_",
               name[i]) == NULL)
      return false;
  return true;
}

/* The names dir/MPB_OUT_LIST gives (the last run's files), each one
 * mpbench writes; none where there is no list (a folder no run wrote
 * into, or one written before the list was). */
static void mpb_out_list_read(const char *dir, mpb_names_t *old) {
  char path[4400], line[512];
  snprintf(path, sizeof path, "%s/%s", dir, MPB_OUT_LIST);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return;
  bool whole = true; /* line starts a line of the file */
  while (fgets(line, sizeof line, f) != NULL) {
    /* A line longer than line (than any name mpbench writes) comes in
     * pieces: none of them is a name, the last one included. */
    size_t len = strcspn(line, "\n");
    bool ends = line[len] == '\n' || feof(f);
    line[len] = '\0';
    if (whole && ends && mpb_own_name(line))
      mpb_names_add(old, line);
    whole = ends;
  }
  fclose(f);
}

/* tmp/MPB_OUT_LIST: the names of files, one a line. */
static mp_status_t mpb_out_list_write(const char *tmp,
                                      const mpb_names_t *files) {
  char path[4400];
  snprintf(path, sizeof path, "%s/%s", tmp, MPB_OUT_LIST);
  char sp[MPB_SHOWN];
  FILE *f = fopen(path, "w");
  if (f == NULL)
    return mp__fail(MP_EINVAL, "cannot write %s: %s", mpb_shown(path, sp),
                    strerror(errno));
  for (size_t i = 0; i < files->n; i++)
    fprintf(f, "%s\n", files->v[i]);
  bool failed = ferror(f) != 0;
  if (fclose(f) != 0 || failed)
    return mp__fail(MP_EINVAL, "cannot write %s: %s", mpb_shown(path, sp),
                    strerror(errno));
  return MP_OK;
}

/* Removes from dir each of old (the last run's files) that this run did
 * not write (files): a plot of a workload not run again, every plot after
 * --no-plots. A link there is the user's and is left, with its target; so
 * is anything else that is not a regular file. */
static void mpb_out_drop_stale(const char *dir, const mpb_names_t *old,
                               const mpb_names_t *files) {
  for (size_t i = 0; i < old->n; i++) {
    char path[4400];
    struct stat sb;
    if (mpb_names_has(files, old->v[i]) ||
        snprintf(path, sizeof path, "%s/%s", dir, old->v[i]) >=
            (int)sizeof path ||
        lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
      continue;
    unlink(path);
  }
}

static bool mpb_gnuplot_terminal(char *term, size_t len) {
  if (system("gnuplot -e 'set terminal pngcairo' >/dev/null 2>&1") == 0) {
    snprintf(term, len, "pngcairo font ',11' size");
    return true;
  }
  if (system("gnuplot -e 'set terminal png' >/dev/null 2>&1") == 0) {
    snprintf(term, len, "png size");
    return true;
  }
  return false;
}

/* Runs gnuplot on tmp/plot.gp inside tmp, its output into tmp/gnuplot.log.
 * No shell and no folder name in the script: an output folder may have any
 * name, quotes included. */
static bool mpb_run_gnuplot(const char *tmp) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0)
    return false;
  if (pid == 0) {
    int fd = -1;
    if (chdir(tmp) == 0)
      fd = open("gnuplot.log", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
      _exit(126);
    execlp("gnuplot", "gnuplot", "plot.gp", (char *)NULL);
    _exit(127);
  }
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR)
      return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* The plot file of workload name, none of files: names that make one
 * stem ("a b", "a_b") get a file each, the later ones numbered. */
static void mpb_png_name(const char *name, const mpb_names_t *files, char *png,
                         size_t len) {
  char stem[160];
  mpb_file_stem(name, stem, sizeof stem);
  snprintf(png, len, "bytes_%s.png", stem);
  for (unsigned k = 2; mpb_names_has(files, png); k++)
    snprintf(png, len, "bytes_%s_%u.png", stem, k);
}

mp_status_t mpb_report_check_plots(const char *dir, const mpb_workload_t *w,
                                   size_t n) {
  struct stat db;
  if (stat(dir, &db) != 0 || !S_ISDIR(db.st_mode))
    return MP_OK; /* made by the run: nothing there yet */
  /* Without a gnuplot no plot is written (mpb_plot): none is in the way. */
  char term[96];
  if (!mpb_gnuplot_terminal(term, sizeof term))
    return MP_OK;
  /* Each workload's name as mpb_plot_names gives it, as if every one had
   * a plot (one without gets none: its name goes to no later one, so the
   * names a run writes are among these). */
  mpb_names_t seen = {0}, files = {0};
  mp_status_t st = mpb_check_dest(dir, "ratios.png");
  for (size_t i = 0; i < n && st == MP_OK; i++) {
    if (mpb_names_has(&seen, w[i].name))
      continue;
    mpb_names_add(&seen, w[i].name);
    char png[200];
    mpb_png_name(w[i].name, &files, png, sizeof png);
    mpb_names_add(&files, png);
    st = mpb_check_dest(dir, png);
  }
  if (st == MP_OK && (seen.oom || files.oom))
    st = mp__fail(MP_ENOMEM, "out of host memory");
  mpb_names_free(&seen);
  mpb_names_free(&files);
  return st;
}

/* mpb_plot's work, for the workloads wl and allocators al of r. */
/* Closes f, a plot file written to path: a write that failed on the way
 * (ferror: a disk that filled partway) or at the flush (fclose) fails the
 * plots, so that gnuplot does not draw truncated data without a word. */
static mp_status_t mpb_plot_close(FILE *f, const char *path) {
  bool failed = ferror(f) != 0;
  char sp[MPB_SHOWN];
  if (fclose(f) != 0)
    return mp__fail(MP_EINVAL, "cannot write %s: %s", mpb_shown(path, sp),
                    strerror(errno));
  if (failed)
    return mp__fail(MP_EINVAL, "cannot write %s: a write to it failed",
                    mpb_shown(path, sp));
  return MP_OK;
}

static mp_status_t mpb_plot_names(const char *tmp, const char *term,
                                  const mpb_result_t *r, size_t n,
                                  const mpb_names_t *wl, const mpb_names_t *al,
                                  mpb_names_t *files, char *why,
                                  size_t why_len) {
  char path[4400], sp[MPB_SHOWN];
  snprintf(path, sizeof path, "%s/plot.gp", tmp);
  FILE *gp = fopen(path, "w");
  if (gp == NULL)
    return mp__fail(MP_EINVAL, "cannot write %s: %s", mpb_shown(path, sp),
                    strerror(errno));
  fprintf(gp,
          "set terminal %s 1280,720\nset grid\nset key top left noenhanced\n"
          "set datafile missing 'NaN'\n",
          term);
  size_t plots = 0;
  for (size_t w = 0; w < wl->n; w++) {
    /* A workload whose runs all failed before their first point has no
     * line to draw (gnuplot refuses a plot with no valid point). */
    size_t points = 0;
    for (size_t i = 0; i < n; i++)
      if (strcmp(r[i].workload, wl->v[w]) == 0)
        points += r[i].npoints;
    if (points == 0)
      continue;
    plots++;
    snprintf(path, sizeof path, "%s/bytes_%zu.dat", tmp, w);
    FILE *d = fopen(path, "w");
    if (d == NULL) {
      fclose(gp);
      return mp__fail(MP_EINVAL, "cannot write %s: %s", mpb_shown(path, sp),
                      strerror(errno));
    }
    /* One block per allocator (gnuplot "index"), live and reserved. The
     * live line is the same for every allocator that got as far, so it is
     * drawn once, from the block that got furthest (a failed run stops
     * early). */
    size_t blocks = 0, live_block = 0, live_events = 0;
    for (size_t i = 0; i < n; i++) {
      if (strcmp(r[i].workload, wl->v[w]) != 0)
        continue;
      for (size_t k = 0; k < r[i].npoints; k++)
        fprintf(d, "%llu %zu %zu\n", (unsigned long long)r[i].point_event[k],
                r[i].point_live[k], r[i].point_reserved[k]);
      fputs("\n\n", d);
      if (r[i].events > live_events) {
        live_events = r[i].events;
        live_block = blocks;
      }
      blocks++;
    }
    if (mpb_plot_close(d, path) != MP_OK) {
      fclose(gp);
      return MP_EINVAL;
    }
    char png[200];
    mpb_png_name(wl->v[w], files, png, sizeof png);
    fprintf(gp, "set output '%s'\nset title ", png);
    char t[MPB_MAX_NAME + 64];
    snprintf(t, sizeof t, "%s: device memory reserved vs live", wl->v[w]);
    mpb_put_quoted(gp, t, '\'', true);
    /* From 0, so heights compare as ratios; x ends with the data. */
    fprintf(gp, " noenhanced\nset xlabel 'event (allocations and frees, in "
                "order)'\nset ylabel 'device memory (MiB)'\n"
                "set yrange [0:*]\nset xrange [0:*]\nset autoscale xfix\n"
                "set key below noenhanced\nset style data lines\nplot ");
    size_t b = 0;
    for (size_t i = 0; i < n; i++) {
      if (strcmp(r[i].workload, wl->v[w]) != 0)
        continue;
      char title[MPB_MAX_ALLOCATOR + 32];
      snprintf(title, sizeof title, "%s reserved%s", r[i].allocator,
               r[i].completed ? "" : " (failed)");
      /* Each line a little thinner than the one before, so allocators
       * whose lines coincide still show as nested bands. */
      double lw = 1.5 + 0.9 * (double)(blocks - 1 - b);
      fprintf(gp,
              "'bytes_%zu.dat' index %zu using 1:($3/1048576) lw %.1f "
              "title ",
              w, b, lw);
      mpb_put_quoted(gp, title, '\'', true);
      fputs(", ", gp);
      b++;
    }
    fprintf(gp,
            "'bytes_%zu.dat' index %zu using 1:($2/1048576) lw 2 dt 2 "
            "lc rgb 'black' title 'live (requested by the workload)'\n",
            w, live_block);
    mpb_names_add(files, png);
  }
  /* The bar chart of ratios: one cluster per workload, a bar per allocator
   * that completed at least one; none when no run completed (gnuplot
   * refuses a plot with no valid point, which would lose the byte plots of
   * the failed runs too). */
  bool ratios = false;
  for (size_t i = 0; i < n; i++)
    ratios = ratios || (r[i].completed && isfinite(r[i].ratio));
  if (!ratios)
    goto run;
  plots++;
  snprintf(path, sizeof path, "%s/ratios.dat", tmp);
  FILE *d = fopen(path, "w");
  if (d == NULL) {
    fclose(gp);
    return mp__fail(MP_EINVAL, "cannot write %s: %s", mpb_shown(path, sp),
                    strerror(errno));
  }
  for (size_t w = 0; w < wl->n; w++) {
    fputc('"', d);
    for (const char *c = wl->v[w]; *c; c++)
      if (*c != '"')
        fputc(mpb_gp_byte(*c), d);
    fputc('"', d);
    for (size_t a = 0; a < al->n; a++) {
      double v = NAN;
      for (size_t i = 0; i < n; i++)
        if (strcmp(r[i].workload, wl->v[w]) == 0 &&
            strcmp(r[i].allocator, al->v[a]) == 0 && r[i].completed)
          v = r[i].ratio;
      if (isfinite(v))
        fprintf(d, " %.4f", v);
      else
        fputs(" NaN", d);
    }
    fputc('\n', d);
  }
  if (mpb_plot_close(d, path) != MP_OK) {
    fclose(gp);
    return MP_EINVAL;
  }
  fprintf(gp,
          "set terminal %s 1600,900\nset output 'ratios.png'\n"
          "set title 'peak reserved / peak live (1.0 is the limit; lower "
          "is better)'\nset xlabel ''\nset ylabel 'ratio'\n"
          "set style data histograms\n"
          "set style histogram clustered gap 1\n"
          "set style fill solid 0.85 border -1\nset boxwidth 0.9\n"
          "set xtics rotate by 35 right noenhanced\nset yrange [0:*]\n"
          "set offsets 0, 0, graph 0.12, 0\n"
          "set key inside top right noenhanced\n"
          "set bmargin 16\nset lmargin 12\nset ytics nomirror\n"
          "set arrow 1 from graph 0, first 1 to graph 1, first 1 nohead "
          "lc rgb 'black' dt 2 front\n",
          term);
  fputs("plot ", gp);
  /* The tick labels ride on the first column plotted. */
  bool first = true;
  for (size_t a = 0; a < al->n; a++) {
    bool any = false;
    for (size_t i = 0; i < n; i++)
      any = any || (strcmp(r[i].allocator, al->v[a]) == 0 && r[i].completed &&
                    isfinite(r[i].ratio));
    if (!any)
      continue;
    fprintf(gp, "%s'ratios.dat' using %zu%s title ", first ? "" : ", ", a + 2,
            first ? ":xtic(1)" : "");
    mpb_put_quoted(gp, al->v[a], '\'', true);
    first = false;
  }
  fputs("\n", gp);
  mpb_names_add(files, "ratios.png");
run:
  snprintf(path, sizeof path, "%s/plot.gp", tmp);
  if (mpb_plot_close(gp, path) != MP_OK)
    return MP_EINVAL;
  if (plots == 0) {
    snprintf(why, why_len, "no run got as far as a figure to plot");
    return MP_ENOTSUP;
  }
  if (!mpb_run_gnuplot(tmp)) {
    /* Its first message, since the temporary folder goes away. */
    char msg[200] = "";
    snprintf(path, sizeof path, "%s/gnuplot.log", tmp);
    FILE *log = fopen(path, "r");
    if (log != NULL) {
      while (fgets(msg, sizeof msg, log) != NULL)
        if (strspn(msg, " \t\n^") != strlen(msg))
          break;
      fclose(log);
    }
    msg[strcspn(msg, "\n")] = '\0';
    char sm[sizeof msg]; /* its line may quote a name (a title, a file) */
    snprintf(why, why_len, "gnuplot failed: %s",
             mp__clip(msg, strlen(msg), sm, sizeof sm));
    return MP_EINVAL;
  }
  return MP_OK;
}

/* Writes the plot data and script into tmp, runs gnuplot; the PNG names it
 * made are added to files. */
static mp_status_t mpb_plot(const char *tmp, const mpb_result_t *r, size_t n,
                            mpb_names_t *files, char *why, size_t why_len) {
  char term[96];
  if (!mpb_gnuplot_terminal(term, sizeof term)) {
    snprintf(why, why_len,
             "gnuplot (with a png or pngcairo terminal) is not installed: "
             "no plots (install gnuplot-nox)");
    return MP_ENOTSUP;
  }
  mpb_names_t wl = {0}, al = {0};
  for (size_t i = 0; i < n; i++) {
    mpb_names_add(&wl, r[i].workload);
    mpb_names_add(&al, r[i].allocator);
  }
  mp_status_t st =
      wl.oom || al.oom
          ? mp__fail(MP_ENOMEM, "out of host memory for the plots")
          : mpb_plot_names(tmp, term, r, n, &wl, &al, files, why, why_len);
  mpb_names_free(&wl);
  mpb_names_free(&al);
  return st;
}

static mp_status_t mpb_write_file(const char *tmp, const char *name,
                                  const mpb_result_t *r, size_t n, int which) {
  char path[4400];
  snprintf(path, sizeof path, "%s/%s", tmp, name);
  char sp[MPB_SHOWN];
  FILE *f = fopen(path, "w");
  if (f == NULL)
    return mp__fail(MP_EINVAL, "cannot write %s: %s", mpb_shown(path, sp),
                    strerror(errno));
  mp_status_t st = MP_OK;
  if (which == 0)
    st = mpb_report_json(f, r, n);
  else if (which == 1)
    st = mpb_report_csv(f, r, n);
  else
    st = mpb_report_markdown(f, r, n);
  /* Each writer says a write that failed (ferror): fclose tells only of
   * its own flush, which may succeed after an earlier one failed. */
  if (fclose(f) != 0 && st == MP_OK)
    st = mp__fail(MP_EINVAL, "cannot write %s: %s", mpb_shown(path, sp),
                  strerror(errno));
  return st;
}

static mp_status_t mpb_write_html(const char *tmp, const mpb_result_t *r,
                                  size_t n, const mpb_blockmap_t *maps,
                                  size_t nmaps) {
  char path[4400];
  snprintf(path, sizeof path, "%s/report.html", tmp);
  char sp[MPB_SHOWN];
  FILE *f = fopen(path, "w");
  if (f == NULL)
    return mp__fail(MP_EINVAL, "cannot write %s: %s", mpb_shown(path, sp),
                    strerror(errno));
  mp_status_t st = mpb_report_html(f, r, n, maps, nmaps);
  if (fclose(f) != 0 && st == MP_OK)
    st = mp__fail(MP_EINVAL, "cannot write %s: %s", mpb_shown(path, sp),
                  strerror(errno));
  return st;
}

mp_status_t mpb_report_write(const char *dir, const mpb_result_t *r, size_t n,
                             bool want_plots, bool *plotted, char *why_not,
                             size_t why_len) {
  return mpb_report_write_maps(dir, r, n, NULL, 0, want_plots, plotted, why_not,
                               why_len);
}

mp_status_t mpb_report_write_maps(const char *dir, const mpb_result_t *r,
                                  size_t n, const mpb_blockmap_t *maps,
                                  size_t nmaps, bool want_plots, bool *plotted,
                                  char *why_not, size_t why_len) {
  *plotted = false;
  why_not[0] = '\0';
  mp_status_t st = mpb_mkdir_p(dir);
  if (st != MP_OK)
    return st;
  char tmp[4200], sd[MPB_SHOWN];
  snprintf(tmp, sizeof tmp, "%s/.mpbench-tmp-XXXXXX", dir);
  if (mkdtemp(tmp) == NULL)
    return mp__fail(MP_EINVAL, "cannot create a temporary folder in %s: %s",
                    mpb_shown(dir, sd), strerror(errno));
  mpb_names_t files = {0};
  for (int i = 0; i < 3 && st == MP_OK; i++) {
    st = mpb_write_file(tmp, mpb_out_names[i], r, n, i);
    mpb_names_add(&files, mpb_out_names[i]);
  }
  if (st == MP_OK) {
    st = mpb_write_html(tmp, r, n, maps, nmaps);
    mpb_names_add(&files, mpb_out_names[3]);
  }
  if (st == MP_OK && want_plots) {
    mpb_names_t pngs = {0};
    mp_status_t pst = mpb_plot(tmp, r, n, &pngs, why_not, why_len);
    if (pst == MP_OK && !pngs.oom) {
      for (size_t i = 0; i < pngs.n; i++)
        mpb_names_add(&files, pngs.v[i]);
      *plotted = true;
    } else if (why_not[0] == '\0') {
      snprintf(why_not, why_len, "%s",
               pst == MP_OK ? "out of host memory for the plots"
                            : mp_last_error());
    }
    mpb_names_free(&pngs);
  }
  if (st == MP_OK && files.oom)
    st = mp__fail(MP_ENOMEM, "out of host memory");
  if (st == MP_OK) {
    st = mpb_out_list_write(tmp, &files);
    mpb_names_add(&files, MPB_OUT_LIST);
  }
  /* What the last run wrote, read before this one's list replaces it. */
  mpb_names_t old = {0};
  if (st == MP_OK)
    mpb_out_list_read(dir, &old);
  if (st == MP_OK && (files.oom || old.oom))
    st = mp__fail(MP_ENOMEM, "out of host memory");
  /* Every destination is found, and every file that goes through a link
   * is copied beside its target, before anything is renamed: a bad link
   * leaves the output folder, and every target, as they were. */
  mpb_move_t *mv = st == MP_OK ? calloc(files.n + 1, sizeof *mv) : NULL;
  if (st == MP_OK && mv == NULL)
    st = mp__fail(MP_ENOMEM, "out of host memory");
  for (size_t i = 0; i < files.n && st == MP_OK; i++) {
    bool linked;
    st = mpb_out_dest(dir, files.v[i], mv[i].to, sizeof mv[i].to, &linked);
    snprintf(mv[i].from, sizeof mv[i].from, "%s/%s", tmp, files.v[i]);
    if (st == MP_OK && linked) {
      char staged[4400];
      st = mpb_stage_beside(mv[i].from, mv[i].to, staged, sizeof staged);
      if (st == MP_OK) {
        memcpy(mv[i].from, staged, sizeof staged);
        mv[i].staged = true;
      }
    }
  }
  /* The file each rename replaces is kept under a second name until every
   * rename is done, so that one failing midway puts the earlier ones back:
   * the folder then holds the last run's files, not a mix of the two. */
  for (size_t i = 0; i < files.n && st == MP_OK; i++)
    mpb_keep_old(mv[i].to, mv[i].old, sizeof mv[i].old, &mv[i].existed,
                 &mv[i].kept);
  size_t done = 0;
  for (; done < files.n && st == MP_OK; done++) {
    if (rename(mv[done].from, mv[done].to) != 0) {
      int err = errno;
      char why[512] = "", sp[MPB_SHOWN];
      if (mpb_put_back(mv, done, why, sizeof why))
        st = mp__fail(MP_EINVAL,
                      "cannot move %s into place: %s: results not written",
                      mpb_shown(mv[done].to, sp), strerror(err));
      else
        st = mp__fail(MP_EINVAL,
                      "cannot move %s into place: %s; putting the run "
                      "before's files back failed: %s",
                      mpb_shown(mv[done].to, sp), strerror(err), why);
      break;
    }
    mv[done].staged = false;
    mv[done].moved = true;
  }
  for (size_t i = 0; mv != NULL && i < files.n; i++) {
    if (mv[i].staged)
      unlink(mv[i].from);
    /* A kept file whose put-back failed stays (the message names it). */
    if (mv[i].kept && (st == MP_OK || !mv[i].moved))
      unlink(mv[i].old);
  }
  /* All in place: the folder holds this run's files, none of the last's. */
  if (st == MP_OK)
    mpb_out_drop_stale(dir, &old, &files);
  free(mv);
  mpb_names_free(&old);
  mpb_names_free(&files);
  mpb_rm_tree(tmp);
  return st;
}
