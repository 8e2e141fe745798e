/* mpbench on the cuda backend, over the fake libcuda.so.1 of tests/fakecuda
 * (registered only where that is built, with it on LD_LIBRARY_PATH):
 * "cuda-malloc" is the driver per request, "cuda-async" the driver's
 * stream-ordered allocator; jemalloc and the capacity search are host-only.
 * The fake has no memory-pool attributes, so cuda-async's reserved bytes
 * come from cuMemGetInfo here. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "mpbench.h"

#define MiB ((size_t)1 << 20)

/* 4 MiB and 2 MiB live together, then 8 MiB alone: peak live 6 MiB. */
static mpb_workload_t small(void) {
  mpb_workload_t w;
  mpb_workload_init(&w, "small");
  uint32_t a, b, c;
  cr_assert_eq(mpb_workload_alloc(&w, 4 * MiB, 0, &a), MP_OK);
  cr_assert_eq(mpb_workload_alloc(&w, 2 * MiB, 0, &b), MP_OK);
  cr_assert_eq(mpb_workload_free_slot(&w, a), MP_OK);
  cr_assert_eq(mpb_workload_free_slot(&w, b), MP_OK);
  cr_assert_eq(mpb_workload_alloc(&w, 8 * MiB, 0, &c), MP_OK);
  cr_assert_eq(mpb_workload_free_slot(&w, c), MP_OK);
  return w;
}

Test(fakecuda_allocators, cuda_malloc_is_one_driver_call_per_event) {
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("cuda", &dev), MP_OK, "%s", mp_last_error());
  char why[128];
  cr_expect(mpb_allocator_available("cuda-malloc", dev, why, sizeof why));
  cr_expect_not(mpb_allocator_available("jemalloc", dev, why, sizeof why));
  cr_expect(mpb_allocator_available("cuda-async", dev, why, sizeof why));
  mp_device_close(dev);

  mpb_workload_t w = small();
  mpb_replay_opts_t o = {.device_spec = "cuda", .capacity_search = true};
  mpb_result_t *r = calloc(1, sizeof *r);
  cr_assert_eq(mpb_replay(&w, "cuda-malloc", &o, r), MP_OK, "%s",
               mp_last_error());
  cr_expect(r->completed);
  cr_expect_eq(r->peak_live, 8 * MiB);
  /* Reserved is what the driver reports used: at least what is live. */
  cr_expect_geq(r->peak_reserved, 8 * MiB);
  cr_expect_eq(r->device_calls, 6);
  cr_expect_eq(r->capacity_state, MPB_CAP_NA);
  cr_expect(strncmp(r->device, "cuda", 4) == 0, "%s", r->device);
  free(r);
  mpb_workload_free(&w);
}

Test(fakecuda_allocators, cuda_async_replays_with_unknown_device_calls) {
  mpb_workload_t w = small();
  mpb_replay_opts_t o = {.device_spec = "cuda"};
  mpb_result_t *r = calloc(1, sizeof *r);
  cr_assert_eq(mpb_replay(&w, "cuda-async", &o, r), MP_OK, "%s",
               mp_last_error());
  cr_expect(r->completed, "%s", r->error);
  cr_expect_eq(r->peak_live, 8 * MiB);
  cr_expect_geq(r->peak_reserved, 8 * MiB);
  cr_expect_not(r->has_device_calls);
  /* Unknown is null in JSON, not 0. */
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  cr_assert_eq(mpb_report_json(f, r, 1), MP_OK);
  fclose(f);
  cr_expect(strstr(buf, "\"device_calls\": null") != NULL, "%s", buf);
  free(buf);
  free(r);
  mpb_workload_free(&w);
}

Test(fakecuda_allocators, gpu_allocators_are_unavailable_on_the_host_device) {
  mp_device_t *dev;
  cr_assert_eq(mp_device_open("host", &dev), MP_OK);
  char why[128];
  cr_expect_not(mpb_allocator_available("cuda-malloc", dev, why, sizeof why));
  cr_expect(strstr(why, "GPU") != NULL, "%s", why);
  cr_expect_not(mpb_allocator_available("cuda-async", dev, why, sizeof why));
  mpb_allocator_t *a;
  cr_expect_eq(mpb_allocator_open("cuda-async", dev, NULL, &a), MP_ENOTSUP);
  mp_device_close(dev);
}
