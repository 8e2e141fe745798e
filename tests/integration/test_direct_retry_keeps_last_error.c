/* test_direct_retry_keeps_last_error.c - an allocation of the direct
 * allocator that finds the device full, ends the session and is served by
 * its retry returns MP_OK: status.h, a success leaves the caller's last
 * error as it was. Before, the first try's "host device out of memory"
 * (recorded before the session gave the deferred blocks back) stayed the
 * last error of an allocation that succeeded. A retry that fails still
 * says its own failure. */
#include <criterion/criterion.h>
#include <string.h>

#include <mempool/mempool.h>

#include "../support/device_helpers.h"

#define MiB ((size_t)1 << 20)

static mp_device_t *dev;
static mp_direct_t *d;

static void setup(void) {
  dev = open_dev("host:capacity=64M");
  cr_assert_eq(mp_direct_create(dev, &d), MP_OK, "%s", mp_last_error());
}

static void teardown(void) {
  cr_expect_eq(mp_direct_destroy(d), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

TestSuite(direct_retry_last_error, .init = setup, .fini = teardown);

/* A last error of the caller's own. */
static void set_marker(mp_error_state_t *was) {
  int x;
  cr_assert_eq(mp_direct_free(d, &x), MP_EINVAL);
  mp_error_save(was);
}

Test(direct_retry_last_error, a_retry_that_is_served_keeps_it) {
  void *a = NULL, *b = NULL;
  cr_assert_eq(mp_direct_alloc(d, 40 * MiB, NULL, &a), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_direct_free(d, a), MP_OK, "%s", mp_last_error());
  mp_error_state_t was;
  set_marker(&was);
  /* 40 MiB more do not fit beside the deferred 40: the session ends. */
  cr_assert_eq(mp_direct_alloc(d, 40 * MiB, NULL, &b), MP_OK, "%s",
               mp_last_error());
  mp_stats_t s;
  cr_assert_eq(mp_direct_get_stats(d, &s), MP_OK);
  cr_assert_eq(s.alloc_retry_count, 1, "the allocation retried");
  cr_assert_eq(s.oom_count, 0);
  cr_expect_eq(mp_last_status(), was.status, "%s", mp_last_error());
  cr_expect_str_eq(mp_last_error(), was.message);
  /* A retry that fails says its failure. */
  cr_assert_eq(mp_direct_free(d, b), MP_OK, "%s", mp_last_error());
  void *c = NULL;
  cr_assert_eq(mp_direct_alloc(d, 30 * MiB, NULL, &b), MP_OK, "%s",
               mp_last_error());
  set_marker(&was);
  cr_assert_eq(mp_direct_alloc(d, 40 * MiB, NULL, &c), MP_ENOMEM);
  cr_expect_eq(mp_last_status(), MP_ENOMEM, "%s", mp_last_error());
  cr_expect_neq(strstr(mp_last_error(), "out of memory"), NULL, "%s",
                mp_last_error());
  cr_expect_null(c);
}
