/* test_pool_pause_refused_keeps_closed_leases.c - a refused pause changes
 * nothing (status.h): the exported blocks whose leases were closed
 * (mp_ipc_handle_close) stay held until a call that goes on lets them go;
 * with arenas too. Refused by the pool's own state (a child pool live):
 * before, mp__pause_one and mp__arenas_pause (pause.c) let them go
 * (mp__export_reap, mp__arenas_reap) before their checks. Refused by what
 * the pool holds (an export still imported, a block in use in a plain
 * segment): before, they let them go and then refused, as those checks
 * read the pool after the reap; now they read what it will hold after the
 * reap (pause.c, mp__pause_check_held) before it. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/device_helpers.h"
#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)
#define KiB ((size_t)1 << 10)

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

/* Exports the block at v and frees it, its lease closed: held. */
static void hold_closed(mp_pool_t *pool, void *v) {
  mp_ipc_handle_t h;
  cr_assert_eq(mp_pool_ipc_export(pool, v, &h), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, v), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_ipc_handle_close(&h), MP_OK, "%s", mp_last_error());
}

/* The pause is refused with want and keeps the held block, its figures
 * and the caller's view as they were. */
static void refused_keeping(mp_pool_t *pool, mp_status_t want,
                            const char *says) {
  cr_assert_eq(held(pool), 1, "the test needs the block held");
  mp_stats_t before = stats(pool);
  mp_status_t st = mp_pool_pause(pool, 0);
  cr_expect_eq(st, want, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect(strstr(mp_last_error(), says) != NULL, "%s", mp_last_error());
  cr_expect_eq(held(pool), 1, "the refused pause let the held block go");
  mp_stats_t after = stats(pool);
  cr_expect_eq(after.allocated_bytes, before.allocated_bytes);
  cr_expect_eq(after.reserved_bytes, before.reserved_bytes);
  cr_expect_eq(after.segment_count, before.segment_count);
  check(pool);
}

/* An export still imported refuses the pause (MP_EBUSY); another block's
 * lease closed stays held. Once the import is closed too, a pause goes on
 * and lets both go. */
static void an_open_import(const char *opts) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  mp_pool_t *pool = make_pool(dev, opts);
  void *v, *w;
  cr_assert_eq(mp_pool_alloc(pool, MiB, NULL, &v), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, MiB, NULL, &w), MP_OK, "%s",
               mp_last_error());
  mp_ipc_handle_t open_h;
  cr_assert_eq(mp_pool_ipc_export(pool, w, &open_h), MP_OK, "%s",
               mp_last_error());
  hold_closed(pool, v);
  refused_keeping(pool, MP_EBUSY, "still imported");
  cr_assert_eq(mp_ipc_handle_close(&open_h), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(held(pool), 0);
  cr_expect_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, w), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

/* max_bytes=21M is no whole number of 2 MiB granules: each 256 KiB block
 * past the 20 MiB one is a plain segment of its own (as in
 * test_pool_pause_arenas_closed_lease.c). A live one refuses the pause
 * (MP_ENOTSUP); another one's lease closed stays held. Once the live one
 * is freed, a pause goes on, lets the held one go and gives both plain
 * segments back. */
static void a_plain_segment_in_use(const char *opts) {
  mp_device_t *dev = open_dev("host:capacity=64M");
  mp_pool_t *pool = make_pool(dev, opts);
  void *big, *live, *gone;
  cr_assert_eq(mp_pool_alloc(pool, 20 * MiB, NULL, &big), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, 256 * KiB, NULL, &live), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, 256 * KiB, NULL, &gone), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(stats(pool).segment_count, 3, "the test needs plain segments");
  hold_closed(pool, gone);
  refused_keeping(pool, MP_ENOTSUP, "plain segments");
  cr_assert_eq(mp_pool_free(pool, live), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(held(pool), 0);
  cr_expect_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(stats(pool).segment_count, 1);
  cr_assert_eq(mp_pool_free(pool, big), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(dev);
}

Test(pool_pause_refused_keeps_closed_leases, an_open_import) {
  an_open_import(NULL);
}

Test(pool_pause_refused_keeps_closed_leases, an_open_import_arenas) {
  an_open_import("arenas=2");
}

Test(pool_pause_refused_keeps_closed_leases, a_plain_segment_in_use) {
  a_plain_segment_in_use("max_bytes=21M");
}

Test(pool_pause_refused_keeps_closed_leases, a_plain_segment_in_use_arenas) {
  a_plain_segment_in_use("max_bytes=21M,arenas=2");
}
