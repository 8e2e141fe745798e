/* mpbench's page-locked allocators on the staging workload: the host pool
 * holds fewer bytes than power-of-two rounding and makes far fewer driver
 * calls than one per request; host-direct makes exactly two per request
 * and holds exactly what is live; the capacity search does not apply;
 * host-jemalloc's arena draws page-locked chunks, not device memory. */
#include <criterion/criterion.h>
#include <string.h>

#include "mpbench.h"

static mpb_workload_t w;

static void setup(void) {
  cr_assert_eq(mpb_workload_generate("staging:steps=400", &w), MP_OK, "%s",
               mp_last_error());
}

static void teardown(void) {
  mpb_workload_free(&w);
}

static mpb_result_t run(const char *allocator) {
  mpb_replay_opts_t o = {.device_spec = "host", .capacity_search = true};
  mpb_result_t r;
  cr_assert_eq(mpb_replay(&w, allocator, &o, &r), MP_OK, "%s: %s", allocator,
               mp_last_error());
  cr_assert(r.completed, "%s: %s", allocator, r.error);
  cr_expect_eq(r.capacity_state, MPB_CAP_NA, "%s", allocator);
  return r;
}

static uint64_t allocations(void) {
  uint64_t n = 0;
  for (size_t i = 0; i < w.n; i++)
    n += w.ev[i].op == MPB_ALLOC;
  return n;
}

TestSuite(host_allocators, .init = setup, .fini = teardown);

Test(host_allocators, host_direct_calls_the_driver_twice_per_request) {
  mpb_result_t r = run("host-direct");
  cr_expect_eq(r.device_calls, 2 * allocations());
  cr_expect_eq(r.peak_reserved, r.peak_live);
}

Test(host_allocators, host_pool_holds_less_than_power_of_two_rounding) {
  mpb_result_t pool = run("host-pool"), pow2 = run("host-pow2");
  cr_expect_lt(pool.peak_reserved, pow2.peak_reserved,
               "host-pool %zu bytes, host-pow2 %zu", pool.peak_reserved,
               pow2.peak_reserved);
  cr_expect_geq(pool.peak_reserved, pool.peak_live);
  cr_expect_lt(pool.device_calls * 100, allocations(),
               "host-pool made %llu driver calls for %llu requests",
               (unsigned long long)pool.device_calls,
               (unsigned long long)allocations());
}

Test(host_allocators, unknown_host_allocator_is_einval) {
  cr_expect_eq(mpb_allocator_check_name("host-pool:bogus=1"), MP_OK);
  cr_expect_eq(mpb_allocator_check_name("host-pow3"), MP_EINVAL);
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host", &dev), MP_OK);
  mpb_allocator_t *a = NULL;
  cr_expect_eq(mpb_allocator_open("host-pool:bogus=1", dev, NULL, &a),
               MP_EINVAL);
  cr_expect_null(a);
  mp_device_close(dev);
}

/* Options appended to mp_pool_config_t after its first size reach the host
 * pool: "host-pool:arenas=2" was refused as if mpbench were built against
 * an older header (its config had struct_size 0, read as the first size). */
Test(host_allocators, host_pool_takes_options_of_every_config_size) {
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host", &dev), MP_OK);
  const char *specs[] = {"host-pool:arenas=2", "host-pool:map_piece=4M",
                         "host-pool:max_bytes=64M,arenas=2"};
  for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) {
    mpb_allocator_t *a = NULL;
    cr_expect_eq(mpb_allocator_open(specs[i], dev, NULL, &a), MP_OK, "%s: %s",
                 specs[i], mp_last_error());
    if (a != NULL)
      mpb_allocator_close(a);
  }
  mp_device_close(dev);
  mpb_result_t r = run("host-pool:arenas=2");
  cr_expect_geq(r.peak_reserved, r.peak_live);
}

/* host-jemalloc exists where mpbench has jemalloc (not in sanitizer
 * builds). */
static void need_jemalloc(void) {
  mp_device_t *dev;
  char why[160];
  cr_assert_eq(mp_device_open("host", &dev), MP_OK);
  bool have = mpb_allocator_available("host-jemalloc", dev, why, sizeof why);
  mp_device_close(dev);
  if (!have)
    cr_skip_test("%s", why);
}

/* On a device of 1 MiB, host-jemalloc serves 4 MiB: its chunks are
 * page-locked host memory, and the device's memory is untouched. */
Test(host_allocators, host_jemalloc_draws_page_locked_chunks) {
  need_jemalloc();
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host:capacity=1M", &dev), MP_OK);
  size_t free0, total, free1;
  cr_assert_eq(mp_device_mem_info(dev, &free0, &total), MP_OK);
  mpb_allocator_t *a = NULL;
  cr_assert_eq(mpb_allocator_open("host-jemalloc", dev, NULL, &a), MP_OK, "%s",
               mp_last_error());
  void *p;
  cr_assert_eq(mpb_allocator_alloc(a, 4u << 20, NULL, &p), MP_OK, "%s",
               mp_last_error());
  memset(p, 0x3c, 4u << 20);
  cr_assert_eq(mp_device_mem_info(dev, &free1, &total), MP_OK);
  cr_expect_eq(free1, free0, "device memory was used");
  mpb_sample_t smp;
  mpb_allocator_sample(a, &smp);
  cr_expect_geq(smp.reserved, (size_t)4 << 20);
  cr_expect_gt(smp.device_calls, 0);
  cr_expect_eq(mpb_allocator_free(a, p), MP_OK);
  mpb_allocator_close(a);
  mp_device_close(dev);
}

Test(host_allocators, host_jemalloc_runs_the_staging_workload) {
  need_jemalloc();
  mpb_result_t r = run("host-jemalloc");
  cr_expect_geq(r.peak_reserved, r.peak_live);
  cr_expect_lt(r.device_calls, allocations());
}
