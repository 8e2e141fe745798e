/* The built-in workloads: deterministic, parameterised, well formed. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "mpbench.h"

/* Every free names a live slot with its allocation's size; it ends empty. */
static void expect_well_formed(const mpb_workload_t *w) {
  size_t *size = calloc(w->nslots + 1, sizeof *size);
  char *live = calloc(w->nslots + 1, 1);
  size_t nlive = 0;
  for (size_t i = 0; i < w->n; i++) {
    const mpb_event_t *e = &w->ev[i];
    if (e->op == MPB_GRAPH) {
      cr_assert_leq(e->slot, MPB_GRAPH_RELEASE, "%s: graph event %u", w->name,
                    e->slot);
      continue;
    }
    if (e->op == MPB_PAUSE || e->op == MPB_RESUME) {
      cr_assert_lt(e->tenant, w->ntenants, "%s: no such tenant", w->name);
      continue; /* colocate's turns: test_colocate.c */
    }
    cr_assert_lt(e->slot, w->nslots);
    if (e->op == MPB_ALLOC) {
      cr_assert_not(live[e->slot], "%s: slot %u reused while live", w->name,
                    e->slot);
      live[e->slot] = 1;
      size[e->slot] = e->size;
      nlive++;
    } else {
      cr_assert(live[e->slot], "%s: free of a dead slot", w->name);
      cr_assert_eq(e->size, size[e->slot]);
      live[e->slot] = 0;
      nlive--;
    }
  }
  cr_expect_eq(nlive, 0, "%s ends with %zu live", w->name, nlive);
  free(size);
  free(live);
}

/* Field by field: mpb_event_t has padding, which memcmp would compare. */
static bool same_events(const mpb_workload_t *a, const mpb_workload_t *b) {
  if (a->n != b->n)
    return false;
  for (size_t i = 0; i < a->n; i++)
    if (a->ev[i].size != b->ev[i].size || a->ev[i].slot != b->ev[i].slot ||
        a->ev[i].stream != b->ev[i].stream || a->ev[i].op != b->ev[i].op ||
        a->ev[i].tenant != b->ev[i].tenant)
      return false;
  return true;
}

Test(workloads, every_builtin_is_well_formed_and_deterministic) {
  for (size_t i = 0; mpb_builtin_names[i] != NULL; i++) {
    mpb_workload_t a, b;
    cr_assert_eq(mpb_workload_generate(mpb_builtin_names[i], &a), MP_OK, "%s",
                 mp_last_error());
    cr_assert_eq(mpb_workload_generate(mpb_builtin_names[i], &b), MP_OK);
    cr_expect_gt(a.n, 100, "%s is too small to say anything", a.name);
    expect_well_formed(&a);
    cr_expect(same_events(&a, &b), "%s is not deterministic", a.name);
    mpb_workload_free(&a);
    mpb_workload_free(&b);
  }
}

Test(workloads, parameters_change_the_events) {
  mpb_workload_t a, b;
  cr_assert_eq(mpb_workload_generate("random:n=500,seed=1", &a), MP_OK);
  cr_assert_eq(mpb_workload_generate("random:n=500,seed=2", &b), MP_OK);
  size_t allocs = 0;
  for (size_t i = 0; i < a.n; i++)
    allocs += a.ev[i].op == MPB_ALLOC;
  cr_expect_eq(allocs, 500);
  cr_expect_not(same_events(&a, &b));
  cr_expect_str_eq(a.name, "random:n=500,seed=1");
  mpb_workload_free(&a);
  mpb_workload_free(&b);
}

Test(workloads, random_respects_max_live) {
  mpb_workload_t w;
  cr_assert_eq(
      mpb_workload_generate("random:n=2000,max_size=1M,max_live=4M", &w),
      MP_OK);
  size_t live = 0;
  for (size_t i = 0; i < w.n; i++) {
    live += w.ev[i].op == MPB_ALLOC ? w.ev[i].size : -w.ev[i].size;
    cr_assert_leq(live, (size_t)4 << 20);
    cr_assert_leq(w.ev[i].size, (size_t)1 << 20);
  }
  mpb_workload_free(&w);
}

/* The LLM's KV caches grow by concatenation: within a decode step a layer's
 * cache is allocated bigger before the old one is freed. */
Test(workloads, llm_kv_cache_grows_by_allocating_before_freeing) {
  mpb_workload_t w;
  cr_assert_eq(mpb_workload_generate("llm:requests=1,layers=1,max_gen=4,"
                                     "max_prompt=16,max_batch=1",
                                     &w),
               MP_OK, "%s", mp_last_error());
  expect_well_formed(&w);
  /* hidden 2048, batch 1: the cache is 2 * seq * 4096 bytes; find a free
   * of one cache size right after the allocation of the next. */
  bool grew = false;
  for (size_t i = 1; i < w.n; i++)
    if (w.ev[i].op == MPB_FREE && w.ev[i - 1].op == MPB_ALLOC &&
        w.ev[i - 1].size == w.ev[i].size + 2 * 4096)
      grew = true;
  cr_expect(grew);
  mpb_workload_free(&w);
}

Test(workloads, bad_names_and_parameters_are_einval_naming_them) {
  mpb_workload_t w;
  cr_expect_eq(mpb_workload_generate("lmm", &w), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "lmm") != NULL, "%s", mp_last_error());
  cr_expect_eq(mpb_workload_generate("llm:layrs=3", &w), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "layrs") != NULL, "%s", mp_last_error());
  cr_expect_eq(mpb_workload_generate("random:n=0", &w), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "n") != NULL, "%s", mp_last_error());
  cr_expect_eq(mpb_workload_generate("cnn:batches=x", &w), MP_EINVAL);
  cr_expect_eq(mpb_workload_generate("random:max_size=8M,max_live=1M", &w),
               MP_EINVAL);
}

/* mpb_workload_check: the same refusals without generating anything, and
 * a spec that would take hours to generate is checked at once. */
Test(workloads, specs_are_checked_without_generating) {
  cr_expect_eq(mpb_workload_check("lmm"), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "lmm") != NULL, "%s", mp_last_error());
  cr_expect_eq(mpb_workload_check("llm:layrs=3"), MP_EINVAL);
  cr_expect(strstr(mp_last_error(), "layrs") != NULL, "%s", mp_last_error());
  cr_expect_eq(mpb_workload_check("cnn:batches=x"), MP_EINVAL);
  cr_expect_eq(mpb_workload_check("llm:requests=100001"), MP_EINVAL);
  cr_expect_eq(mpb_workload_check(NULL), MP_EINVAL);
  for (const char *const *n = mpb_builtin_names; *n != NULL; n++)
    cr_expect_eq(mpb_workload_check(*n), MP_OK, "%s: %s", *n, mp_last_error());
  cr_expect_eq(mpb_workload_check("llm:requests=100000,layers=1000,"
                                  "max_gen=100000,max_prompt=1000000"),
               MP_OK, "%s", mp_last_error());
}

/* The refusal of an unknown name lists every built-in (it once left out
 * graph and named a list kept apart from the table). */
Test(workloads, unknown_name_lists_every_builtin) {
  cr_assert_eq(mpb_workload_check("nosuch"), MP_EINVAL);
  char msg[512];
  snprintf(msg, sizeof msg, "%s", mp_last_error());
  for (const char *const *n = mpb_builtin_names; *n != NULL; n++)
    cr_expect(strstr(msg, *n) != NULL, "'%s' not named in: %s", *n, msg);
}

/* spec is refused with MP_EINVAL, its message naming what (a workload
 * generated after all is freed). */
static void expect_refused(const char *spec, const char *what) {
  mpb_workload_t w;
  mp_status_t st = mpb_workload_generate(spec, &w);
  if (st == MP_OK)
    mpb_workload_free(&w);
  cr_expect_eq(st, MP_EINVAL, "%s", spec);
  cr_expect(strstr(mp_last_error(), what) != NULL, "%s", mp_last_error());
}

/* Parameters each in range can make more bytes live at once than a size_t
 * holds (round 6 of this one: 100 blocks of 1.9 EB); every figure built on
 * the live bytes would wrap, so the spec is refused, as a trace is. */
Test(workloads, live_bytes_beyond_a_size_t_are_einval) {
  expect_refused("adversarial:size=1T,growth=1000,count=100,rounds=7",
                 "live bytes");
}

/* Parameters each in range can together ask for hours of generating and
 * more host memory than there is (llm at these: about 10^13 events): the
 * generator stops at MPB_MAX_GENERATED_EVENTS and says why. They were all
 * accepted, and generated until the host ran out. Just under the bound is
 * generated (random with max_live=1: each of its n allocations freed
 * before the next, the last by the drain at its end: 2n events). */
Test(workloads, parameters_that_make_too_many_events_are_einval) {
  expect_refused("llm:requests=100000,layers=1000,max_gen=100000", "events");
  cr_expect(strstr(mp_last_error(), "lower them") != NULL, "%s",
            mp_last_error());
  expect_refused("random:n=100000000", "more than 4194304 events");
  char spec[64];
  snprintf(spec, sizeof spec, "random:n=%zu,max_size=1,max_live=1",
           (size_t)MPB_MAX_GENERATED_EVENTS / 2);
  mpb_workload_t w;
  cr_assert_eq(mpb_workload_generate(spec, &w), MP_OK, "%s", mp_last_error());
  cr_expect_eq(w.n, MPB_MAX_GENERATED_EVENTS);
  mpb_workload_free(&w);
}

/* adversarial grows its block size each round; a size past what a size_t
 * holds (round 7 here: 2.1e19 bytes) wrapped to a small one, and the
 * spec generated rounds of blocks smaller than the round before. */
Test(workloads, adversarial_block_size_beyond_a_size_t_is_einval) {
  expect_refused("adversarial:size=1T,growth=1000,count=1,rounds=8", "growth");
  mpb_workload_t w;
  /* One round fewer stops below the limit: 1 TiB x 11^6, about 1.9e18. */
  cr_assert_eq(mpb_workload_generate(
                   "adversarial:size=1T,growth=1000,count=1,rounds=7", &w),
               MP_OK, "%s", mp_last_error());
  size_t last = 0;
  for (size_t i = 0; i < w.n; i++)
    if (w.ev[i].op == MPB_ALLOC && w.ev[i].size > last)
      last = w.ev[i].size;
  cr_expect_gt(last, (size_t)1 << 60);
  mpb_workload_free(&w);
}
