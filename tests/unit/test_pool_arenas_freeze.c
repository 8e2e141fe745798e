/* mp_pool_freeze on a pool with arenas (arenas=N, src/pool/arena.c): every
 * arena made fences the blocks it holds live at the call (nothing moves:
 * arenas have no movable blocks), those allocated later are not fenced,
 * frozen blocks are still freed from any thread; while paused it is
 * MP_EBUSY and fences nothing. White-box: it reads the blocks' flags. */
#include <criterion/criterion.h>

#include "../support/pool_helpers.h"
#include "arena_workers.h"
#include "pool/pool_internal.h"

MP_DEVICE_SUITE(pool_arenas_freeze, "host:capacity=64M");

/* Whether p's block, in whichever arena holds it, is frozen below its
 * segment's fence. */
static bool frozen(mp_pool_t *pool, void *p) {
  int i = arena_holding(pool, p);
  cr_assert_geq(i, 0, "%p is in no arena", p);
  mp_pool_t *a = mp__arena_at(pool, (size_t)i);
  mp__pool_lock(a);
  mp__block_t *b = mp__map_find(a, (uintptr_t)p);
  bool in = (b->flags & MP__B_FROZEN) && b->seg->fence >= b->addr + b->size;
  mp__pool_unlock(a);
  return in;
}

Test(pool_arenas_freeze, every_arena_fences_what_it_holds_live) {
  mp_pool_t *pool = make_pool(dev, "arenas=4");
  job_t a = {.pool = pool, .bytes = 64 * 1024, .tag = 0x10, .count = 3};
  job_t b = {.pool = pool, .bytes = 3 << 20, .tag = 0x20, .count = 2};
  two_arenas(pool, &a, &b);
  cr_assert_eq(mp_pool_freeze(pool), MP_OK, "%s", mp_last_error());
  for (int i = 0; i < 3; i++)
    cr_expect(frozen(pool, a.ptrs[i]), "arena of a: block %d not frozen", i);
  for (int i = 0; i < 2; i++)
    cr_expect(frozen(pool, b.ptrs[i]), "arena of b: block %d not frozen", i);
  expect_kept(&a); /* nothing moved */
  expect_kept(&b);
  /* Later blocks are not fenced, in the arenas made or in a new one. */
  job_t later = {.pool = pool, .bytes = 4096, .tag = 0x30, .count = 1};
  job_t fresh = {.pool = pool, .bytes = 4096, .tag = 0x40, .count = 1};
  cr_assert_eq(on_worker(&wa, &later, ALLOC), MP_OK, "%s", later.why);
  cr_assert_eq(on_thread(&fresh, ALLOC), MP_OK, "%s", fresh.why);
  cr_expect(!frozen(pool, later.ptrs[0]));
  cr_expect(!frozen(pool, fresh.ptrs[0]));
  /* Frozen blocks are freed as any, from another thread too. */
  cr_expect_eq(on_worker(&wb, &a, FREE), MP_OK, "%s", a.why);
  cr_expect_eq(on_worker(&wa, &b, FREE), MP_OK, "%s", b.why);
  cr_expect_eq(on_worker(&wa, &later, FREE), MP_OK, "%s", later.why);
  cr_expect_eq(on_thread(&fresh, FREE), MP_OK, "%s", fresh.why);
  cr_expect_eq(stats(pool).allocated_bytes, 0);
  check(pool);
  worker_stop(&wa);
  worker_stop(&wb);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}

Test(pool_arenas_freeze, a_paused_pool_refuses_and_fences_nothing) {
  mp_pool_t *pool = make_pool(dev, "arenas=4");
  job_t a = {.pool = pool, .bytes = 4096, .tag = 0x50, .count = 2};
  job_t b = {.pool = pool, .bytes = 8192, .tag = 0x60, .count = 2};
  two_arenas(pool, &a, &b);
  cr_assert_eq(mp_pool_pause(pool, MP_PAUSE_KEEP_CONTENT), MP_OK, "%s",
               mp_last_error());
  cr_expect_eq(mp_pool_freeze(pool), MP_EBUSY);
  cr_expect(strstr(mp_last_error(), "paused") != NULL, "%s", mp_last_error());
  cr_assert_eq(mp_pool_resume(pool), MP_OK, "%s", mp_last_error());
  for (int i = 0; i < 2; i++) {
    cr_expect(!frozen(pool, a.ptrs[i]), "a refused freeze fenced a block");
    cr_expect(!frozen(pool, b.ptrs[i]), "a refused freeze fenced a block");
  }
  cr_expect_eq(on_worker(&wa, &a, FREE), MP_OK, "%s", a.why);
  cr_expect_eq(on_worker(&wb, &b, FREE), MP_OK, "%s", b.why);
  cr_expect_eq(mp_pool_freeze(NULL), MP_EINVAL);
  check(pool);
  worker_stop(&wa);
  worker_stop(&wb);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK);
}
