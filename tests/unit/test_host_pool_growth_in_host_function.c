/* mp_host_pool_alloc from a host function (mp_stream_launch_host,
 * cuLaunchHostFunc: "The host function must not make any CUDA API calls",
 * cuda.h) that needs the pool to grow is refused, as it must be: growing
 * is a cuMemHostAlloc. But the refusal named mp_device_host_alloc, the
 * host device's own call under the pinned view (src/device/pinned.c),
 * which the program never made. It names the program's call,
 * mp_host_pool_alloc, and says why (a host function may not call into the
 * device), and nothing changes: no chunk, no buffer, the stats as they
 * were, the stream's slot not kept (trim and destroy wait for no stream
 * that never used the pool). Found by a review, 2026-12-06. */
#include <criterion/criterion.h>
#include <string.h>

#include <mempool/host_pool.h>
#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "../support/host_pool_fixture.h"

static void setup(void) {
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_assert_eq(mp_pool_config_parse(&cfg, "max_bytes=8M"), MP_OK, "%s",
               mp_last_error());
  hp_open(&cfg);
}

TestSuite(host_pool_growth_in_host_function, .init = setup, .fini = hp_close);

/* The call a host function makes, and its answer. */
static struct {
  mp_stream_t s; /* the stream the allocation names */
  void *p;
  mp_status_t st;
  char why[512];
} call;

static void alloc_from_host_fn(void *unused) {
  (void)unused;
  call.st = mp_host_pool_alloc(hp, MiB, call.s, &call.p);
  snprintf(call.why, sizeof call.why, "%s", mp_last_error());
}

/* mp_host_pool_alloc on s from a host function: refused, and it changed
 * nothing. */
static void refused_on(mp_stream_t s) {
  mp_stats_t before = hp_stats();
  call.s = s;
  run_in_host_fn(dev, alloc_from_host_fn, NULL);
  cr_expect_eq(call.st, MP_EINVAL, "%s: %s", mp_status_name(call.st), call.why);
  cr_expect_null(call.p, "a buffer was handed out");
  cr_expect(strncmp(call.why, "mp_host_pool_alloc: ", 20) == 0,
            "the refusal names another call: %s", call.why);
  cr_expect_null(strstr(call.why, "mp_device_host_alloc"),
                 "the refusal names the device's call: %s", call.why);
  cr_expect_neq(strstr(call.why, "host function"), NULL, "%s", call.why);
  cr_expect_neq(strstr(call.why, "grow"), NULL, "does not say what: %s",
                call.why);
  mp_stats_t after = hp_stats();
  cr_expect_eq(after.reserved_bytes, before.reserved_bytes, "a chunk stayed");
  cr_expect_eq(after.segment_count, before.segment_count);
  cr_expect_eq(after.allocated_bytes, before.allocated_bytes);
  cr_expect_eq(after.live_blocks, before.live_blocks);
  cr_expect_eq(after.alloc_count, before.alloc_count);
  cr_expect_eq(after.device_alloc_count, before.device_alloc_count);
  cr_expect_eq(after.oom_count, before.oom_count, "counted as out of memory");
  cr_expect_eq(mp_host_pool_check(hp), MP_OK, "%s", mp_last_error());
}

Test(host_pool_growth_in_host_function, on_the_default_stream) {
  mp_stats_t before = hp_stats();
  refused_on(NULL);
  /* The same call outside a host function grows the pool as ever. */
  void *p = NULL;
  cr_assert_eq(mp_host_pool_alloc(hp, MiB, NULL, &p), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(hp_stats().live_blocks, before.live_blocks + 1);
  cr_assert_eq(mp_host_pool_free(hp, p), MP_OK, "%s", mp_last_error());
}

/* On a stream of the device the pool never met: refused the same, and the
 * slot made for the call goes with it (a trim waits for no stream). */
Test(host_pool_growth_in_host_function, on_a_stream_the_pool_never_met) {
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK, "%s", mp_last_error());
  refused_on(s);
  cr_expect_eq(mp_host_pool_trim(hp, 0), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK, "%s", mp_last_error());
}
