/* The smallest-capacity search: bisection over the host device's capacity,
 * a fresh device per probe.
 *
 * The allocator is a toy that never reuses memory: every request is a new
 * device allocation and frees give nothing back, so a workload completes
 * exactly when the capacity holds the sum of all its requests. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "mpbench.h"

#define MiB ((size_t)1 << 20)

typedef struct hoard {
  mp_device_t *dev;
  void *p[64];
  int n;
  size_t reserved;
} hoard_t;

static mp_status_t hoard_alloc(void *self, size_t bytes, mp_stream_t s,
                               void **out) {
  (void)s;
  hoard_t *h = self;
  if (h->n == 64)
    return MP_ENOMEM;
  mp_status_t st = mp_device_alloc(h->dev, bytes, &h->p[h->n]);
  if (st != MP_OK)
    return st;
  h->reserved += bytes;
  *out = h->p[h->n++];
  return MP_OK;
}

static mp_status_t hoard_free(void *self, void *ptr) {
  (void)self, (void)ptr;
  return MP_OK;
}

static mp_status_t hoard_stats(void *self, mp_stats_t *out) {
  hoard_t *h = self;
  memset(out, 0, sizeof *out);
  out->reserved_bytes = out->peak_reserved_bytes = h->reserved;
  out->device_alloc_count = (uint64_t)h->n;
  return MP_OK;
}

static mp_status_t hoard_destroy(void *self) {
  hoard_t *h = self;
  for (int i = 0; i < h->n; i++)
    mp_device_free(h->dev, h->p[i]);
  free(h);
  return MP_OK;
}

static const mp_allocator_ops_t hoard_ops = {.kind = "pool",
                                             .alloc = hoard_alloc,
                                             .free = hoard_free,
                                             .get_stats = hoard_stats,
                                             .destroy = hoard_destroy};

static mp_status_t make_hoard(mp_device_t *dev, const char *name,
                              mp_allocator_t **out) {
  hoard_t *h = calloc(1, sizeof *h);
  h->dev = dev;
  mp_status_t st = mp_allocator_wrap(&hoard_ops, h, name, out);
  if (st != MP_OK)
    free(h);
  return st;
}

/* Allocations of 3, 5 and 7 MiB, each freed before the next: live at most
 * 7 MiB, but the hoard needs 3 + 5 + 7 = 15 MiB (plus nothing: the host
 * device counts exactly the bytes asked for). */
static mpb_workload_t three_blocks(void) {
  mpb_workload_t w;
  mpb_workload_init(&w, "three");
  uint32_t s;
  for (size_t mib = 3; mib <= 7; mib += 2) {
    cr_assert_eq(mpb_workload_alloc(&w, mib * MiB, 0, &s), MP_OK);
    cr_assert_eq(mpb_workload_free_slot(&w, s), MP_OK);
  }
  return w;
}

Test(capacity_search, finds_the_capacity_to_within_the_granularity) {
  mpb_workload_t w = three_blocks();
  size_t cap;
  bool exact;
  unsigned probes;
  cr_assert_eq(mpb_capacity_search(&w, "hoard", make_hoard, "host", 7 * MiB,
                                   15 * MiB, 4096, 0, &cap, &exact, &probes),
               MP_OK, "%s", mp_last_error());
  cr_expect(exact);
  cr_expect_geq(cap, 15 * MiB);
  cr_expect_lt(cap, 15 * MiB + 4096);
  /* Bisection of an 8 MiB range down to 4 KiB: about log2(2048) probes,
   * plus the one that checks the upper bound. */
  cr_expect_leq(probes, 14);
  cr_expect_geq(probes, 11);
  mpb_workload_free(&w);
}

Test(capacity_search, an_upper_bound_that_does_not_fit_is_raised) {
  mpb_workload_t w = three_blocks();
  size_t cap;
  bool exact;
  unsigned probes;
  cr_assert_eq(mpb_capacity_search(&w, "hoard", make_hoard, "host", 7 * MiB,
                                   8 * MiB, MiB, 0, &cap, &exact, &probes),
               MP_OK, "%s", mp_last_error());
  cr_expect(exact);
  cr_expect_geq(cap, 15 * MiB);
  cr_expect_lt(cap, 16 * MiB);
  bool fits;
  char *spec;
  cr_assert_eq(mpb_spec_with_capacity("host", cap, &spec), MP_OK);
  cr_assert_eq(mpb_replay_fits(&w, "hoard", spec, make_hoard, &fits), MP_OK);
  cr_expect(fits);
  free(spec);
  cr_assert_eq(mpb_spec_with_capacity("host", 15 * MiB - 1, &spec), MP_OK);
  cr_assert_eq(mpb_replay_fits(&w, "hoard", spec, make_hoard, &fits), MP_OK);
  cr_expect_not(fits);
  free(spec);
  mpb_workload_free(&w);
}

Test(capacity_search, a_spent_budget_gives_an_upper_bound) {
  mpb_workload_t w = three_blocks();
  size_t cap;
  bool exact;
  unsigned probes;
  cr_assert_eq(mpb_capacity_search(&w, "hoard", make_hoard, "host", 7 * MiB,
                                   20 * MiB, 4096, 1e-9, &cap, &exact, &probes),
               MP_OK, "%s", mp_last_error());
  cr_expect_not(exact);
  cr_expect_eq(cap, 20 * MiB, "only the upper bound was probed");
  mpb_workload_free(&w);
}

Test(capacity_search, replay_searches_from_its_own_figures) {
  mpb_workload_t w = three_blocks();
  mpb_replay_opts_t o = {
      .device_spec = "host", .make = make_hoard, .capacity_search = true};
  mpb_result_t *r = calloc(1, sizeof *r);
  cr_assert_eq(mpb_replay(&w, "hoard", &o, r), MP_OK, "%s", mp_last_error());
  cr_expect_eq(r->peak_live, 7 * MiB);
  cr_expect_eq(r->peak_reserved, 15 * MiB);
  cr_expect_eq(r->capacity_state, MPB_CAP_EXACT);
  /* Granularity max(1 MiB, 0.1% of peak live) = 1 MiB. */
  cr_expect_geq(r->min_capacity, 15 * MiB);
  cr_expect_lt(r->min_capacity, 16 * MiB);
  free(r);
  mpb_workload_free(&w);
}

/* A pool capped at a share of its device (max_fraction) cannot be made on
 * a probe device whose share is under the pool's alignment: that probe
 * does not fit, and the search goes on. Before, the whole replay failed
 * with MP_EINVAL, naming a device of a few hundred bytes the user never
 * gave, where the same run without the search completed. */
Test(capacity_search, a_probe_too_small_for_the_pool_options_does_not_fit) {
  mpb_workload_t w;
  mpb_workload_init(&w, "small");
  uint32_t s;
  cr_assert_eq(mpb_workload_alloc(&w, 4096, 0, &s), MP_OK);
  cr_assert_eq(mpb_workload_free_slot(&w, s), MP_OK);
  mpb_replay_opts_t o = {.device_spec = "host", .capacity_search = true};
  mpb_result_t *r = calloc(1, sizeof *r);
  cr_assert_eq(mpb_replay(&w, "pool:max_fraction=0.0001", &o, r), MP_OK, "%s",
               mp_last_error());
  cr_expect(r->completed, "%s", r->error);
  /* A ten-thousandth of the device holds the block: some 40 MB, past the
   * four doublings of the run's peak the search tries, so the capacity
   * stays unknown; every probe was a device too small, none an error. */
  cr_expect_eq(r->capacity_state, MPB_CAP_NONE);
  cr_expect_eq(r->capacity_probes, 4);
  /* With a thousandth, the doublings reach a device that holds it. */
  cr_assert_eq(mpb_replay(&w, "pool:max_fraction=0.001", &o, r), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(r->capacity_state, MPB_CAP_EXACT);
  cr_expect_geq(r->min_capacity, (size_t)4096 * 1000);
  free(r);
  mpb_workload_free(&w);
}

Test(capacity_search, a_spent_run_deadline_leaves_only_the_upper_bound) {
  mpb_workload_t w = three_blocks();
  mpb_replay_opts_t o = {.device_spec = "host",
                         .make = make_hoard,
                         .capacity_search = true,
                         .capacity_budget_s = 100,
                         .capacity_deadline_ns = 1};
  mpb_result_t *r = calloc(1, sizeof *r);
  cr_assert_eq(mpb_replay(&w, "hoard", &o, r), MP_OK, "%s", mp_last_error());
  cr_expect_eq(r->capacity_state, MPB_CAP_BOUND);
  cr_expect_eq(r->min_capacity, 15 * MiB);
  cr_expect_eq(r->capacity_probes, 1);
  free(r);
  mpb_workload_free(&w);
}

/* The spec mpb_spec_with_capacity makes from base. */
static void expect_spec(const char *base, size_t capacity, const char *want) {
  char *spec;
  cr_assert_eq(mpb_spec_with_capacity(base, capacity, &spec), MP_OK, "%s: %s",
               base, mp_last_error());
  cr_expect_str_eq(spec, want);
  free(spec);
}

Test(capacity_search, spec_gets_capacity_as_its_last_option) {
  expect_spec(NULL, 100, "host:capacity=100");
  expect_spec("", 100, "host:capacity=100");
  expect_spec("host", 1, "host:capacity=1");
  expect_spec("host:latency_us=3", 5, "host:latency_us=3,capacity=5");
  expect_spec("host:capacity=8G,vmm=0", 7, "host:vmm=0,capacity=7");
}

/* The device's parser also takes "key:value": capacity:8G is the capacity,
 * replaced like capacity=8G; other options stay as written. */
Test(capacity_search, spec_replaces_a_capacity_written_key_colon_value) {
  expect_spec("host:capacity:8G,vmm=0", 7, "host:vmm=0,capacity=7");
  expect_spec("host:vmm:0,capacity:8G", 7, "host:vmm:0,capacity=7");
  expect_spec("host:latency_us:3", 5, "host:latency_us:3,capacity=5");
}

/* A spec of any length is kept whole: cut, "fail_after=0...01" would read
 * as "fail_after=0...0" (never). */
Test(capacity_search, spec_of_any_length_is_never_cut) {
  char base[1200];
  int n = snprintf(base, sizeof base, "host:fail_after=");
  memset(base + n, '0', 1000);
  snprintf(base + n + 1000, sizeof base - (size_t)n - 1000, "1");
  char want[1300];
  snprintf(want, sizeof want, "%s,capacity=12345678901", base);
  expect_spec(base, 12345678901u, want);
}

Test(capacity_search, spec_with_malformed_options_is_refused) {
  char *spec = (char *)"untouched";
  cr_expect_eq(mpb_spec_with_capacity("host:vmm", 7, &spec), MP_EINVAL);
  cr_expect_null(spec);
  cr_expect(strstr(mp_last_error(), "'vmm' is not key=value") != NULL, "%s",
            mp_last_error());
}

/* The user's own capacity in either form is the measured run's, and the
 * search replaces it (never "'capacity' given twice"). */
Test(capacity_search, replay_takes_the_users_capacity_written_key_colon_value) {
  mpb_workload_t w = three_blocks();
  mpb_replay_opts_t o = {.device_spec = "host:capacity:64M",
                         .make = make_hoard,
                         .capacity_search = true};
  mpb_result_t *r = calloc(1, sizeof *r);
  cr_assert_eq(mpb_replay(&w, "hoard", &o, r), MP_OK, "%s", mp_last_error());
  cr_expect(r->completed, "%s", r->error);
  cr_expect_eq(r->peak_reserved, 15 * MiB);
  cr_expect_eq(r->capacity_state, MPB_CAP_EXACT);
  cr_expect_geq(r->min_capacity, 15 * MiB);
  cr_expect_lt(r->min_capacity, 16 * MiB);
  /* 10 MiB cannot hold the hoard's 15: the user's capacity:10M is used. */
  o.device_spec = "host:capacity:10M";
  cr_assert_eq(mpb_replay(&w, "hoard", &o, r), MP_OK, "%s", mp_last_error());
  cr_expect_not(r->completed);
  free(r);
  mpb_workload_free(&w);
}

/* The measured run gets the user's whole spec, however long: here the
 * first device allocation fails (fail_after=0...01), as with
 * fail_after=1. */
Test(capacity_search, replay_runs_on_the_users_whole_long_spec) {
  mpb_workload_t w = three_blocks();
  char spec[1200];
  int n = snprintf(spec, sizeof spec, "host:fail_after=");
  memset(spec + n, '0', 1000);
  snprintf(spec + n + 1000, sizeof spec - (size_t)n - 1000, "1");
  mpb_result_t *r = calloc(2, sizeof *r);
  mpb_replay_opts_t o = {.device_spec = "host:fail_after=1",
                         .make = make_hoard};
  cr_assert_eq(mpb_replay(&w, "hoard", &o, &r[0]), MP_OK, "%s",
               mp_last_error());
  o.device_spec = spec;
  cr_assert_eq(mpb_replay(&w, "hoard", &o, &r[1]), MP_OK, "%s",
               mp_last_error());
  cr_expect_not(r[0].completed);
  cr_expect_not(r[1].completed, "the spec was cut: fail_after=0");
  cr_expect_str_eq(r[1].error, r[0].error);
  free(r);
  mpb_workload_free(&w);
}
