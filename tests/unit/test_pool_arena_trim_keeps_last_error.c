/* test_pool_arena_trim_keeps_last_error.c - mp_pool_trim of a pool with
 * arenas (arena.c mp__arena_trim_one) tries again to free a staging buffer
 * an arena's defragmentation kept (defrag.c). That try may be refused
 * again, and the trim still succeeds; it then leaves the thread's last
 * error as it was (status.h: "A later success does not clear it; the next
 * failure replaces it"), as test_pool_trim_retries_keep_last_error.c checks
 * for a pool without arenas. Before, the trim answered MP_OK with the
 * refused retry's message ("fake free refused: ...") as the last error. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"
#include "pool/pool_internal.h"
#include "pool_fakedev.h"

/* The staging buffers p's arenas keep. */
static unsigned kept(mp_pool_t *p) {
  unsigned n = 0;
  for (size_t i = 0; i < p->cfg.arenas; i++) {
    mp_pool_t *a = mp__arena_at(p, i);
    if (a != NULL)
      n += a->nstage_kept;
  }
  return n;
}

/* Records why (the hook's ctx) as the thread's last error: the refused
 * free's own message, as a driver records one. */
static void record_why(void *why) {
  (void)mp__fail(MP_EDRIVER, "%s", (const char *)why);
}

Test(pool_arena_trim_keeps_last_error, a_kept_staging_buffer) {
  mp_device_t *dev = fake_open((size_t)1 << 30, 0);
  fake_dev_t *f = fake_of(dev);
  mp_pool_t *p = make_pool(
      dev, "virtual=0,max_bytes=8M,segment_bytes=2M,align=512,arenas=2");
  cr_assert_neq(p->arenas, NULL, "no arenas");
  /* The slide of a 1 MiB movable block 4 KiB up, its staging buffer's
   * free refused: the arena keeps the buffer. */
  mp_handle_t *h[2];
  size_t sizes[2] = {4096, (size_t)1 << 20}, moved = 0;
  for (int i = 0; i < 2; i++)
    cr_assert_eq(mp_pool_alloc_movable(p, sizes[i], NULL, &h[i]), MP_OK, "%s",
                 mp_last_error());
  cr_assert_eq(mp_handle_free(h[0]), MP_OK);
  f->refuse_frees = 1;
  cr_assert_eq(mp_pool_defragment(p, NULL, &moved), MP_EDRIVER, "%s",
               mp_last_error());
  cr_assert_eq(kept(p), 1, "no staging buffer kept");
  /* The caller's failure, still to be reported. */
  cr_assert_eq(mp_pool_trim(NULL, 0), MP_EINVAL);
  char msg[MP__ERROR_MAX];
  snprintf(msg, sizeof msg, "%s", mp_last_error());
  cr_assert_neq(msg[0], '\0');
  f->refuse_frees = 1;
  f->on_free = record_why;
  f->on_free_ctx = (void *)"fake free of a kept buffer refused: it says why";
  mp_status_t st = mp_pool_trim(p, 0);
  cr_expect_eq(st, MP_OK, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect_str_eq(mp_last_error(), msg);
  cr_expect_eq(mp_last_status(), MP_EINVAL);
  cr_expect_eq(f->refuse_frees, 0, "the kept buffer's free was not tried");
  check(p);
  cr_expect_eq(mp_pool_trim(p, 0), MP_OK, "%s", mp_last_error());
  cr_expect_eq(kept(p), 0, "the kept buffer is still kept");
  cr_assert_eq(mp_handle_free(h[1]), MP_OK);
  fake_pool_finish(p, dev);
}
