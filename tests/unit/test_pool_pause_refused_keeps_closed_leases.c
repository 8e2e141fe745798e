/* test_pool_pause_refused_keeps_closed_leases.c - a pause that the pool's
 * own state refuses (here a child pool live) changes nothing (status.h):
 * the exported blocks whose leases were closed (mp_ipc_handle_close) stay
 * held until a call that goes on lets them go; with arenas too. Before,
 * mp__pause_one and mp__arenas_pause (pause.c) let them go (mp__export_reap,
 * mp__arenas_reap) before their checks. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/device_helpers.h"
#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)

/* The blocks pool holds for their importers, its arenas' included. */
static size_t held(mp_pool_t *pool) {
  size_t n = pool->nheld;
  for (size_t i = 0; pool->arenas != NULL && i < pool->cfg.arenas; i++)
    if (mp__arena_at(pool, i) != NULL)
      n += mp__arena_at(pool, i)->nheld;
  return n;
}

/* A pool made with opts, a child pool live and a block held for a closed
 * lease: the pause is refused and keeps the block; once the child is gone,
 * a pause lets it go. */
static void refused_keeps_the_held_block(const char *opts) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  mp_pool_t *pool = make_pool(dev, opts);
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
  cr_assert_eq(held(pool), 1, "the test needs the block held");
  mp_stats_t before = stats(pool);
  mp_status_t st = mp_pool_pause(pool, 0);
  cr_expect_eq(st, MP_EBUSY, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect_eq(held(pool), 1, "the refused pause let the held block go");
  cr_expect_eq(stats(pool).allocated_bytes, before.allocated_bytes);
  cr_assert_eq(mp_pool_destroy(child), MP_OK, "%s", mp_last_error());
  /* A pause that goes on lets it go. */
  cr_expect_eq(mp_pool_pause(pool, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(held(pool), 0);
  cr_expect_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

Test(pool_pause_refused_keeps_closed_leases, a_child_pool_live) {
  refused_keeps_the_held_block(NULL);
}

Test(pool_pause_refused_keeps_closed_leases, a_child_pool_live_arenas) {
  refused_keeps_the_held_block("arenas=2");
}
