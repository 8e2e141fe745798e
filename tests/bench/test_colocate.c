/* mpbench's colocate workload: two tenants take turns on one device
 * through pause and resume. The generated events never put both tenants
 * on the device at once; a pool replays them on a device too small for
 * both and reports ms per GiB of a pause and a resume (table section,
 * results.json, results.csv); allocators that cannot pause fail the run
 * with MP_ENOTSUP instead of faking it. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "mpbench.h"

#define MiB  ((size_t)1 << 20)
#define SPEC "colocate:size=16M,rounds=2,churn=4"

static mpb_workload_t generated(const char *spec) {
  mpb_workload_t w;
  cr_assert_eq(mpb_workload_generate(spec, &w), MP_OK, "%s", mp_last_error());
  return w;
}

Test(colocate, tenants_take_turns_and_are_never_on_the_device_together) {
  mpb_workload_t w = generated(SPEC);
  cr_assert_eq(w.ntenants, 2);
  bool paused[2] = {false, false};
  size_t live[2] = {0, 0}, peak[2] = {0, 0};
  unsigned pauses = 0, resumes = 0;
  uint8_t *owner = calloc(w.nslots, 1);
  cr_assert_not_null(owner);
  for (size_t i = 0; i < w.n; i++) {
    const mpb_event_t *e = &w.ev[i];
    switch (e->op) {
    case MPB_PAUSE:
      cr_assert(!paused[e->tenant], "event %zu pauses a paused tenant", i);
      paused[e->tenant] = true;
      pauses++;
      break;
    case MPB_RESUME:
      cr_assert(paused[e->tenant], "event %zu resumes a running tenant", i);
      cr_assert(paused[!e->tenant], "event %zu: both tenants on the device", i);
      paused[e->tenant] = false;
      resumes++;
      break;
    case MPB_ALLOC:
      cr_assert(!paused[e->tenant], "event %zu allocates while paused", i);
      owner[e->slot] = e->tenant;
      live[e->tenant] += e->size;
      if (live[e->tenant] > peak[e->tenant])
        peak[e->tenant] = live[e->tenant];
      break;
    case MPB_FREE:
      cr_assert(!paused[owner[e->slot]], "event %zu frees while paused", i);
      live[owner[e->slot]] -= e->size;
      break;
    }
  }
  /* A pause after the trainer's fill, one per turn (2 rounds x 2 tenants),
   * one when the last tenant is done; a resume per turn and a last one. */
  cr_expect_eq(pauses, 6);
  cr_expect_eq(resumes, 5);
  cr_expect_eq(peak[0], 16 * MiB);
  cr_expect_eq(peak[1], 16 * MiB);
  cr_expect_eq(live[0] + live[1], 0, "the workload ends empty");
  free(owner);
  mpb_workload_t again = generated(SPEC);
  bool same = again.n == w.n;
  for (size_t i = 0; same && i < w.n; i++)
    same = again.ev[i].op == w.ev[i].op && again.ev[i].size == w.ev[i].size &&
           again.ev[i].slot == w.ev[i].slot &&
           again.ev[i].tenant == w.ev[i].tenant;
  cr_expect(same, "the same spec gives the same events");
  mpb_workload_free(&again);
  mpb_workload_free(&w);
}

Test(colocate, bad_parameters_are_einval) {
  mpb_workload_t w;
  cr_expect_eq(mpb_workload_generate("colocate:rounds=0", &w), MP_EINVAL);
  cr_expect_eq(mpb_workload_generate("colocate:size=1K", &w), MP_EINVAL);
  cr_expect_eq(mpb_workload_generate("colocate:tenants=3", &w), MP_EINVAL);
}

static mpb_result_t replayed(const char *allocator, const char *device) {
  mpb_workload_t w = generated(SPEC);
  mpb_replay_opts_t o = {.device_spec = device};
  mpb_result_t *r = malloc(sizeof *r); /* big: the plot series */
  cr_assert_not_null(r);
  cr_assert_eq(mpb_replay(&w, allocator, &o, r), MP_OK, "%s", mp_last_error());
  mpb_result_t out = *r;
  free(r);
  mpb_workload_free(&w);
  return out;
}

Test(colocate, a_pool_takes_turns_on_a_device_too_small_for_both) {
  /* 16 MiB each, 24 MiB of device: only pausing lets both run. */
  mpb_result_t r = replayed("pool", "host:capacity=24M");
  cr_assert(r.completed, "%s", r.error);
  cr_expect_eq(r.pauses, 6);
  cr_expect_gt(r.pause_ms_per_gib, 0.0);
  cr_expect_gt(r.resume_ms_per_gib, 0.0);
  cr_expect_eq(r.peak_live, 16 * MiB,
               "a paused tenant is not live on the "
               "device");
  cr_expect_leq(r.peak_reserved, 24 * MiB);
  cr_expect_geq(r.peak_reserved, r.peak_live);

  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  cr_assert_eq(mpb_report_json(f, &r, 1), MP_OK);
  fclose(f);
  cr_expect_not_null(strstr(buf, "\"pauses\": 6, \"pause_ms_per_gib\": "));
  cr_expect_null(strstr(buf, "\"resume_ms_per_gib\": null"));
  free(buf);
  f = open_memstream(&buf, &len);
  mpb_report_markdown(f, &r, 1);
  fclose(f);
  cr_expect_not_null(strstr(buf, "| pauses | pause ms/GiB | resume ms/GiB |"));
  free(buf);
  f = open_memstream(&buf, &len);
  cr_assert_eq(mpb_report_csv(f, &r, 1), MP_OK);
  fclose(f);
  cr_expect_not_null(
      strstr(buf, ",pauses,pause_ms_per_gib,resume_ms_per_gib,"));
  free(buf);
}

Test(colocate, allocators_that_cannot_pause_fail_with_enotsup) {
  const char *names[] = {"direct", "pool:virtual=0"};
  for (int i = 0; i < 2; i++) {
    mpb_result_t r = replayed(names[i], "host:capacity=64M");
    cr_expect(!r.completed, "%s replayed pauses it cannot make", names[i]);
    cr_expect_not_null(strstr(r.error, "MP_ENOTSUP"), "%s: %s", names[i],
                       r.error);
    cr_expect_eq(r.pauses, 0);
  }
}

Test(colocate, other_workloads_report_no_pauses) {
  mpb_workload_t w = generated("random:seed=3");
  cr_expect_eq(w.ntenants, 1);
  for (size_t i = 0; i < w.n; i++)
    cr_assert(w.ev[i].op == MPB_ALLOC || w.ev[i].op == MPB_FREE);
  mpb_workload_free(&w);
}
