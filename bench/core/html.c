/* html.c - report.html: one self-contained page that draws itself.
 *
 * The page is bench/core/report.html.in (compiled in as a byte array, so
 * mpbench needs no file beside it), with the data put in at its
 * <!--MPB_DATA--> marker as three JSON script elements:
 *   mp-results  exactly what results.json holds (mpb_report_json);
 *   mp-series   each run's reserved and live bytes over events (the
 *               MPB_SERIES_POINTS buckets the PNG plots draw);
 *   mp-blocks   block maps: for one allocator per workload, each block's
 *               address, size, and the events of its allocation and free
 *               (the picture of PyTorch's memory_viz: address on y, time
 *               on x). At most MPB_HTML_MAX_BLOCKS per map, the largest.
 * The page's script (inline, no network) builds the table and draws on
 * canvases; JSON strings escape '<', so no data can close a script element.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* mp__fail (errors through mp_last_error) */
#include "mpbench.h"
#include "report_html_template.h"

bool mpb_blockmap_init(mpb_blockmap_t *m, const mpb_workload_t *w,
                       const char *allocator) {
  memset(m, 0, sizeof *m);
  snprintf(m->workload, sizeof m->workload, "%s", w->name);
  snprintf(m->allocator, sizeof m->allocator, "%s", allocator);
  m->nslots = w->nslots;
  m->events = w->n;
  m->open = calloc(w->nslots ? w->nslots : 1, sizeof *m->open);
  return m->open != NULL;
}

void mpb_blockmap_on_block(void *ctx, size_t event, const mpb_event_t *e,
                           void *ptr) {
  mpb_blockmap_t *m = ctx;
  if (e->slot >= m->nslots)
    return;
  if (e->op == MPB_ALLOC) {
    if (!mpb_grow(&m->b, &m->cap, m->n, sizeof *m->b)) {
      m->out_of_memory = true;
      return;
    }
    m->b[m->n] = (mpb_block_t){.addr = (uint64_t)(uintptr_t)ptr,
                               .size = e->size,
                               .t0 = event,
                               .t1 = m->events};
    m->open[e->slot] = ++m->n;
  } else if (m->open[e->slot] != 0) {
    m->b[m->open[e->slot] - 1].t1 = event;
    m->open[e->slot] = 0;
  }
}

void mpb_blockmap_end(mpb_blockmap_t *m, uint64_t events) {
  if (events >= m->events)
    return;
  m->events = events;
  for (uint32_t s = 0; s < m->nslots; s++)
    if (m->open[s] != 0)
      m->b[m->open[s] - 1].t1 = events;
}

void mpb_blockmap_free(mpb_blockmap_t *m) {
  free(m->b);
  free(m->open);
  memset(m, 0, sizeof *m);
}

static int mpb_cmp_block_size_desc(const void *a, const void *b) {
  const mpb_block_t *x = a, *y = b;
  return x->size < y->size ? 1 : x->size > y->size ? -1 : 0;
}

static void mpb_html_series(FILE *out, const mpb_result_t *r, size_t n) {
  fputs("<script type=\"application/json\" id=\"mp-series\">[", out);
  for (size_t i = 0; i < n; i++) {
    fprintf(out, "%s\n{\"run\": %zu, \"event\": [", i ? "," : "", i);
    for (size_t k = 0; k < r[i].npoints; k++)
      fprintf(out, "%s%llu", k ? "," : "",
              (unsigned long long)r[i].point_event[k]);
    fputs("], \"live\": [", out);
    for (size_t k = 0; k < r[i].npoints; k++)
      fprintf(out, "%s%zu", k ? "," : "", r[i].point_live[k]);
    fputs("], \"reserved\": [", out);
    for (size_t k = 0; k < r[i].npoints; k++)
      fprintf(out, "%s%zu", k ? "," : "", r[i].point_reserved[k]);
    fputs("]}", out);
  }
  fputs("]</script>\n", out);
}

/* One map; the largest MPB_HTML_MAX_BLOCKS blocks, addresses relative to
 * the lowest, so that they stay exact as JavaScript numbers. */
static mp_status_t mpb_html_map(FILE *out, const mpb_blockmap_t *m) {
  size_t keep = m->n < MPB_HTML_MAX_BLOCKS ? m->n : MPB_HTML_MAX_BLOCKS;
  mpb_block_t *b = malloc((m->n ? m->n : 1) * sizeof *b);
  if (b == NULL)
    return mp__fail(MP_ENOMEM, "out of host memory writing report.html");
  if (m->n > 0) /* a run that failed at its first event has no block */
    memcpy(b, m->b, m->n * sizeof *b);
  if (keep < m->n)
    qsort(b, m->n, sizeof *b, mpb_cmp_block_size_desc);
  uint64_t base = UINT64_MAX;
  for (size_t i = 0; i < keep; i++)
    if (b[i].addr < base)
      base = b[i].addr;
  fputs("{\"workload\": ", out);
  mpb_json_str(out, m->workload);
  fputs(", \"allocator\": ", out);
  mpb_json_str(out, m->allocator);
  fprintf(out,
          ", \"events\": %llu, \"blocks_total\": %zu, \"incomplete\": %s, "
          "\"base\": \"0x%llx\", \"blocks\": [",
          (unsigned long long)m->events, m->n,
          m->out_of_memory ? "true" : "false",
          (unsigned long long)(keep ? base : 0));
  /* [offset, size, first event, last event] */
  for (size_t i = 0; i < keep; i++)
    fprintf(out, "%s[%llu,%llu,%llu,%llu]", i ? "," : "",
            (unsigned long long)(b[i].addr - base),
            (unsigned long long)b[i].size, (unsigned long long)b[i].t0,
            (unsigned long long)b[i].t1);
  fputs("]}", out);
  free(b);
  return MP_OK;
}

mp_status_t mpb_report_html(FILE *out, const mpb_result_t *r, size_t n,
                            const mpb_blockmap_t *maps, size_t nmaps) {
  static const char marker[] = "<!--MPB_DATA-->";
  const char *tpl = mpb_html_template;
  const char *at = strstr(tpl, marker);
  if (at == NULL)
    return mp__fail(MP_ECORRUPT, "report.html template has no %s", marker);
  fwrite(tpl, 1, (size_t)(at - tpl), out);
  fputs("<script type=\"application/json\" id=\"mp-results\">", out);
  mp_status_t st = mpb_report_json(out, r, n);
  fputs("</script>\n", out);
  mpb_html_series(out, r, n);
  fputs("<script type=\"application/json\" id=\"mp-blocks\">[", out);
  for (size_t i = 0; i < nmaps && st == MP_OK; i++) {
    fputs(i ? ",\n" : "\n", out);
    st = mpb_html_map(out, &maps[i]);
  }
  fputs("]</script>\n", out);
  fputs(at + strlen(marker), out);
  if (st == MP_OK && ferror(out))
    st = mp__fail(MP_EINVAL, "cannot write report.html");
  return st;
}
