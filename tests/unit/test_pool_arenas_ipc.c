/* IPC export from a pool with arenas (arenas=N, src/pool/export.c): any
 * thread exports a block of any arena; the importer sees its bytes; freed
 * while imported, the block is held (not reused, still allocated) until
 * the importer lets go, and then a poll or a trim gives it back; pause
 * refuses while an export is open; bad pointers are MP_EINVAL and change
 * nothing. White-box: it reads which arena holds a block. */
#include <criterion/criterion.h>

#include "../support/pool_helpers.h"
#include "arena_workers.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_arenas_ipc, "host:capacity=64M");

static size_t held_blocks(mp_pool_t *pool) {
  size_t held = SIZE_MAX;
  cr_assert_eq(mp_pool_ipc_poll(pool, &held), MP_OK, "%s", mp_last_error());
  return held;
}

Test(pool_arenas_ipc, a_block_of_another_arena_is_held_while_imported) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  job_t a = {.pool = pool, .bytes = 2 * MiB, .tag = 0x10, .count = 1};
  job_t b = {.pool = pool, .bytes = 2 * MiB, .tag = 0x20, .count = 1};
  two_arenas(pool, &a, &b);
  /* This thread exports a's block (its arena is not this thread's). */
  mp_ipc_handle_t h;
  cr_assert_eq(mp_pool_ipc_export(pool, a.ptrs[0], &h), MP_OK, "%s",
               mp_last_error());
  void *imported = NULL;
  cr_assert_eq(mp_ipc_import(dev, &h, &imported), MP_OK, "%s", mp_last_error());
  unsigned char *in = imported;
  cr_expect(in[0] == 0x10 && in[2 * MiB - 1] == 0x10, "the block's bytes");
  in[0] = 0x77;
  cr_expect_eq(((unsigned char *)a.ptrs[0])[0], 0x77, "one memory");
  cr_expect_eq(held_blocks(pool), 0);

  /* Freed while imported: held, still allocated, never handed out. */
  void *at = a.ptrs[0];
  cr_assert_eq(on_worker(&wa, &a, FREE), MP_OK, "%s", a.why);
  cr_expect_eq(held_blocks(pool), 1);
  cr_expect_eq(stats(pool).allocated_bytes, 4 * MiB);
  cr_assert_eq(on_worker(&wa, &a, ALLOC), MP_OK, "%s", a.why);
  cr_expect_neq(a.ptrs[0], at, "a held block was handed out again");
  cr_expect_eq(in[1], 0x10, "the importer's bytes kept");
  /* No pause while an export is open; nothing changed. */
  cr_expect_eq(mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT), MP_EBUSY);
  cr_expect_eq(held_blocks(pool), 1);
  check(pool);

  /* The importer lets go: the poll gives the block back. */
  cr_assert_eq(mp_ipc_close(dev, imported), MP_OK, "%s", mp_last_error());
  cr_expect_eq(held_blocks(pool), 0);
  cr_expect_eq(stats(pool).allocated_bytes, 4 * MiB);
  check(pool);
  cr_expect_eq(on_worker(&wa, &a, FREE), MP_OK, "%s", a.why);
  cr_expect_eq(on_worker(&wb, &b, FREE), MP_OK, "%s", b.why);
  worker_stop(&wa);
  worker_stop(&wb);
  cr_expect_eq(stats(pool).allocated_bytes, 0);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

/* a's block allocated on worker wa (started here), exported once: *h. */
static void export_one(job_t *a, mp_ipc_handle_t *h) {
  worker_start(&wa);
  cr_assert_eq(on_worker(&wa, a, ALLOC), MP_OK, "%s", a->why);
  cr_assert_eq(mp_pool_ipc_export(a->pool, a->ptrs[0], h), MP_OK, "%s",
               mp_last_error());
}

/* A held block whose importer let go goes back at a trim, without a poll. */
Test(pool_arenas_ipc, a_trim_gives_back_blocks_nobody_imports) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  job_t a = {.pool = pool, .bytes = 4 * MiB, .tag = 0x30, .count = 1};
  mp_ipc_handle_t h;
  export_one(&a, &h);
  cr_assert_eq(on_worker(&wa, &a, FREE), MP_OK, "%s", a.why);
  cr_expect_eq(stats(pool).allocated_bytes, 4 * MiB, "held");
  cr_assert_eq(mp_ipc_handle_close(&h), MP_OK);
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  mp_stats_t s = stats(pool);
  cr_expect_eq(s.allocated_bytes, 0);
  cr_expect_eq(s.reserved_bytes, 0, "the trim gave the memory back too");
  cr_expect_eq(held_blocks(pool), 0);
  check(pool);
  worker_stop(&wa);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

/* The same at a pause: a lease closed, the pause goes through without a
 * poll, as in a pool without arenas. It was refused (MP_EBUSY, "1
 * exported block is still imported by another process"): the arenas'
 * check counted the export before any arena let closed leases go. */
Test(pool_arenas_ipc, a_pause_lets_go_of_blocks_nobody_imports) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  job_t a = {.pool = pool, .bytes = 2 * MiB, .tag = 0x50, .count = 1};
  mp_ipc_handle_t h;
  export_one(&a, &h);
  cr_assert_eq(mp_ipc_handle_close(&h), MP_OK);
  cr_expect_eq(mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(((unsigned char *)a.ptrs[0])[0], 0x50, "content kept");
  cr_assert_eq(on_worker(&wa, &a, FREE), MP_OK, "%s", a.why);
  check(pool);
  worker_stop(&wa);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

Test(pool_arenas_ipc, bad_pointers_are_einval_and_change_nothing) {
  mp_pool_t *pool = make_pool(dev, "arenas=2");
  job_t a = {.pool = pool, .bytes = MiB, .tag = 0x40, .count = 1};
  worker_start(&wa);
  cr_assert_eq(on_worker(&wa, &a, ALLOC), MP_OK, "%s", a.why);
  mp_stats_t before = stats(pool);
  mp_ipc_handle_t h;
  memset(&h, 0xab, sizeof h);
  mp_ipc_handle_t untouched = h;
  int local = 0;
  void *bad[3] = {(char *)a.ptrs[0] + 512, &local, (char *)a.ptrs[0] + MiB};
  for (int i = 0; i < 3; i++) {
    cr_expect_eq(mp_pool_ipc_export(pool, bad[i], &h), MP_EINVAL, "%p", bad[i]);
    cr_expect_gt(strlen(mp_last_error()), 0);
  }
  cr_expect_eq(mp_pool_ipc_export(pool, NULL, &h), MP_EINVAL);
  cr_expect_eq(mp_pool_ipc_export(pool, a.ptrs[0], NULL), MP_EINVAL);
  cr_expect_eq(memcmp(&h, &untouched, sizeof h), 0, "*out written");
  mp_stats_t after = stats(pool);
  cr_expect_eq(memcmp(&before, &after, sizeof before), 0);
  cr_expect_eq(held_blocks(pool), 0);
  /* Paused: MP_EBUSY, the export and the poll. */
  cr_assert_eq(mp_pool_pause(pool, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(mp_pool_ipc_export(pool, a.ptrs[0], &h), MP_EBUSY);
  size_t held = 7;
  cr_expect_eq(mp_pool_ipc_poll(pool, &held), MP_EBUSY);
  cr_expect_eq(held, 7);
  cr_assert_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  cr_expect_eq(on_worker(&wa, &a, FREE), MP_OK, "%s", a.why);
  worker_stop(&wa);
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

/* A plain segment's block may not be freed while imported (export.c):
 * destroy is MP_EBUSY, asked of every arena before it ends any (a's, made
 * first, ends nothing either), and goes once the importer let go. */
Test(pool_arenas_ipc, destroy_waits_for_an_imported_plain_segment_block) {
  mp_device_t *plain = NULL;
  cr_assert_eq(mp_device_open("host:capacity=64M,vmm=0", &plain), MP_OK, "%s",
               mp_last_error());
  mp_pool_t *pool = make_pool(plain, "arenas=2");
  job_t a = {.pool = pool, .bytes = MiB, .tag = 0x50, .count = 1};
  job_t b = {.pool = pool, .bytes = MiB, .tag = 0x60, .count = 1};
  two_arenas(pool, &a, &b);
  mp_ipc_handle_t h;
  cr_assert_eq(mp_pool_ipc_export(pool, b.ptrs[0], &h), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_destroy(pool), MP_EBUSY);
  cr_expect_neq(strstr(mp_last_error(), "imported"), NULL, "%s",
                mp_last_error());
  expect_kept(&a);
  expect_kept(&b);
  cr_expect_eq(arenas_made(pool), 2);
  check(pool);
  cr_expect_eq(on_worker(&wa, &a, FREE), MP_OK, "%s", a.why);
  cr_expect_eq(on_worker(&wb, &b, FREE), MP_OK, "%s", b.why);
  worker_stop(&wa);
  worker_stop(&wb);
  cr_assert_eq(mp_ipc_handle_close(&h), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  mp_device_close(plain);
}
