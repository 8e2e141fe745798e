/* report.html's data: the block map recorded during a replay, and the page
 * html.c writes (its results are results.json's, its data cannot close a
 * script element, big maps keep their largest blocks). Drawing is checked
 * in headless Chromium by report_html_check.py. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpbench.h"

static char *page(const mpb_result_t *r, size_t n, const mpb_blockmap_t *m,
                  size_t nm, size_t *len) {
  char *buf = NULL;
  FILE *f = open_memstream(&buf, len);
  cr_assert_not_null(f);
  cr_assert_eq(mpb_report_html(f, r, n, m, nm), MP_OK, "%s", mp_last_error());
  fclose(f);
  return buf;
}

/* Replays w through the pool with a block map. */
static void replay_with_map(const mpb_workload_t *w, mpb_blockmap_t *m,
                            mpb_result_t *r) {
  cr_assert(mpb_blockmap_init(m, w, "pool"));
  mpb_replay_opts_t o = {.device_spec = "host",
                         .on_block = mpb_blockmap_on_block,
                         .on_block_ctx = m};
  cr_assert_eq(mpb_replay(w, "pool", &o, r), MP_OK, "%s", mp_last_error());
  cr_assert(r->completed, "%s", r->error);
}

Test(report_html, block_map_has_every_allocation_and_no_two_live_overlap) {
  mpb_workload_t w;
  cr_assert_eq(
      mpb_workload_generate("random:n=400,max_size=2M,max_live=16M", &w),
      MP_OK);
  mpb_blockmap_t m;
  mpb_result_t *r = calloc(1, sizeof *r);
  replay_with_map(&w, &m, r);
  size_t allocs = 0;
  for (size_t i = 0; i < w.n; i++)
    allocs += w.ev[i].op == MPB_ALLOC && w.ev[i].size != 0;
  cr_expect_eq(m.n, allocs);
  cr_expect_not(m.out_of_memory);
  for (size_t i = 0; i < m.n; i++) {
    const mpb_block_t *a = &m.b[i];
    cr_assert(a->t0 < a->t1 && a->t1 <= w.n, "block %zu: %llu..%llu", i,
              (unsigned long long)a->t0, (unsigned long long)a->t1);
    cr_assert_eq(w.ev[a->t0].op, MPB_ALLOC);
    cr_assert_eq(w.ev[a->t0].size, a->size);
    /* Blocks alive at the same time never share an address. */
    for (size_t j = i + 1; j < m.n && m.b[j].t0 < a->t1; j++)
      cr_assert(m.b[j].addr >= a->addr + a->size ||
                    m.b[j].addr + m.b[j].size <= a->addr,
                "blocks %zu and %zu overlap while both live", i, j);
  }
  mpb_blockmap_free(&m);
  mpb_workload_free(&w);
  free(r);
}

Test(report_html, page_holds_results_json_and_no_data_closes_a_script) {
  mpb_result_t *r = calloc(2, sizeof *r);
  snprintf(r[0].workload, sizeof r[0].workload, "evil</script><b>x");
  snprintf(r[0].allocator, sizeof r[0].allocator, "pool");
  r[0].peak_live = 12345;
  r[0].peak_reserved = 23456;
  r[0].completed = true;
  r[0].npoints = 2;
  r[0].point_event[0] = 1;
  r[0].point_event[1] = 2;
  r[1] = r[0];
  snprintf(r[1].allocator, sizeof r[1].allocator, "direct");
  size_t len;
  char *html = page(r, 2, NULL, 0, &len);
  char *json = NULL;
  size_t jlen;
  FILE *f = open_memstream(&json, &jlen);
  cr_assert_eq(mpb_report_json(f, r, 2), MP_OK);
  fclose(f);
  cr_expect(strstr(html, json) != NULL, "results.json is not in the page");
  /* One script element per data block and the page's own: the name's
   * "</script>" is escaped. */
  size_t closes = 0;
  for (const char *p = html; (p = strstr(p, "</script>")) != NULL; p++)
    closes++;
  cr_expect_eq(closes, 4);
  cr_expect(strstr(html, "<!--MPB_DATA-->") == NULL);
  cr_expect(strstr(html, "http") == NULL, "the page refers to the network");
  free(json);
  free(html);
  free(r);
}

Test(report_html, big_maps_keep_their_largest_blocks) {
  mpb_blockmap_t m = {0};
  snprintf(m.workload, sizeof m.workload, "w");
  snprintf(m.allocator, sizeof m.allocator, "pool");
  m.n = m.cap = MPB_HTML_MAX_BLOCKS + 500;
  m.events = 2 * m.n;
  m.b = calloc(m.n, sizeof *m.b);
  for (size_t i = 0; i < m.n; i++)
    m.b[i] = (mpb_block_t){.addr = 0x1000000 + 0x10000 * i,
                           .size = 1000 + (i * 7919) % m.n,
                           .t0 = i,
                           .t1 = i + 1};
  /* The threshold: the MPB_HTML_MAX_BLOCKS-th largest size. */
  size_t *sizes = malloc(m.n * sizeof *sizes), smallest_kept = SIZE_MAX;
  for (size_t i = 0; i < m.n; i++)
    sizes[i] = m.b[i].size;
  for (size_t k = 0; k < MPB_HTML_MAX_BLOCKS; k++) {
    size_t best = k;
    for (size_t i = k + 1; i < m.n; i++)
      if (sizes[i] > sizes[best])
        best = i;
    size_t t = sizes[k];
    sizes[k] = sizes[best];
    sizes[best] = t;
    smallest_kept = sizes[k];
  }
  mpb_result_t *r = calloc(1, sizeof *r);
  size_t len;
  char *html = page(r, 1, &m, 1, &len);
  const char *blocks = strstr(html, "\"blocks\": [");
  cr_assert_not_null(blocks);
  char total[64];
  snprintf(total, sizeof total, "\"blocks_total\": %zu", m.n);
  cr_expect(strstr(html, total) != NULL);
  size_t shown = 0;
  for (const char *p = blocks + 11; *p == '['; shown++) {
    unsigned long long off, size, t0, t1;
    cr_assert_eq(sscanf(p, "[%llu,%llu,%llu,%llu]", &off, &size, &t0, &t1), 4);
    cr_expect_geq(size, smallest_kept);
    p = strchr(p, ']') + 1;
    if (*p == ',')
      p++;
  }
  cr_expect_eq(shown, MPB_HTML_MAX_BLOCKS);
  free(sizes);
  free(html);
  free(r);
  mpb_blockmap_free(&m);
}

/* A run that failed at its first event has an empty block map (no blocks,
 * no array): the page is still written, with the map empty (a sanitized
 * mpbench stopped on a memcpy from NULL there). */
Test(report_html, an_empty_block_map_is_written) {
  mpb_result_t r = {0};
  snprintf(r.workload, sizeof r.workload, "big");
  snprintf(r.allocator, sizeof r.allocator, "pool");
  mpb_blockmap_t m = {0};
  snprintf(m.workload, sizeof m.workload, "big");
  snprintf(m.allocator, sizeof m.allocator, "pool");
  size_t len;
  char *html = page(&r, 1, &m, 1, &len);
  cr_expect(strstr(html, "\"workload\": \"big\"") != NULL);
  free(html);
}
