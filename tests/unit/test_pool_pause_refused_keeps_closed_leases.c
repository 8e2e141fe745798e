/* test_pool_pause_refused_keeps_closed_leases.c - a pause that the pool's
 * own state refuses (here a child pool live) changes nothing (status.h):
 * the exported blocks whose leases were closed (mp_ipc_handle_close) stay
 * held until a call that goes on lets them go. Before, mp__pause_one
 * (pause.c) let them go (mp__export_reap) before its check. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/device_helpers.h"
#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)

Test(pool_pause_refused_keeps_closed_leases, a_child_pool_live) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  mp_pool_t *pool = make_pool(dev, NULL);
  /* First: its allocation in the pool would let a held block go. */
  mp_pool_t *child = NULL;
  cr_assert_eq(mp_pool_create_child(pool, MiB, &child), MP_OK, "%s",
               mp_last_error());
  void *v;
  mp_ipc_handle_t h;
  cr_assert_eq(mp_pool_alloc(pool, MiB, NULL, &v), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_ipc_export(pool, v, &h), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, v), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_handle_close(&h), MP_OK, "%s", mp_last_error());
  cr_assert_eq(pool->nheld, 1, "the test needs the block held");
  mp_stats_t before = stats(pool);
  mp_status_t st = mp_pool_pause(pool, 0);
  cr_expect_eq(st, MP_EBUSY, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect(strstr(mp_last_error(), "child") != NULL, "%s", mp_last_error());
  cr_expect_eq(pool->nheld, 1, "the refused pause let the held block go");
  cr_expect_eq(pool->nexports, 1, "the refused pause closed the lease");
  cr_expect_eq(stats(pool).allocated_bytes, before.allocated_bytes);
  cr_assert_eq(mp_pool_destroy(child), MP_OK, "%s", mp_last_error());
  /* A pause that goes on lets it go. */
  cr_expect_eq(mp_pool_pause(pool, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(pool->nheld, 0);
  cr_expect_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}
