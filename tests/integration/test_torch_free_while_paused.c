/* test_torch_free_while_paused.c - mp_torch_free while the default pool is
 * paused (mp_pool_pause: an engine's sleep mode). The pool refuses every
 * free then (MP_EBUSY, pool.h), but the hook cannot fail and PyTorch
 * forgets the pointer: refused, the block stayed live for good. The free
 * is kept and made at the first hook called after the resume (malloc,
 * free, or reset, torch.cuda.empty_cache), without changing what that
 * hook reports; a second free of the same pointer while paused is refused,
 * not kept twice. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include <mempool/mempool.h>
#include <mempool/torch.h>

#include "../support/default_pool_host.h"

#define MiB ((size_t)1 << 20)

/* A block of 1 MiB freed through the hook while the pool is paused; the
 * pool then resumed. */
static void freed_while_paused(void) {
  void *p = mp_torch_malloc(MiB, 0, NULL);
  cr_assert_not_null(p, "%s", mp_last_error());
  cr_assert_eq(mp_pool_pause(mp_default_pool(), MP_PAUSE_KEEP_CONTENT), MP_OK,
               "%s", mp_last_error());
  mp_torch_free(p, MiB, 0, NULL);
  cr_assert(strstr(mp_last_error(), "kept") != NULL, "%s", mp_last_error());
  cr_assert_eq(stats().live_blocks, 1, "freed while paused");
  mp_torch_free(p, MiB, 0, NULL);
  cr_assert(strstr(mp_last_error(), "freed already") != NULL, "%s",
            mp_last_error());
  cr_assert_eq(mp_pool_resume(mp_default_pool()), MP_OK, "%s", mp_last_error());
  cr_assert_eq(stats().live_blocks, 1, "no hook called since the resume");
}

TestSuite(torch_free_while_paused, .init = on_host);

Test(torch_free_while_paused, made_at_the_next_malloc) {
  freed_while_paused();
  void *q = mp_torch_malloc(2 * MiB, 0, NULL);
  cr_assert_not_null(q, "%s", mp_last_error());
  mp_stats_t s = stats();
  cr_assert_eq(s.live_blocks, 1, "the block freed while paused is still live");
  cr_assert_eq(s.requested_bytes, 2 * MiB);
  mp_torch_free(q, 2 * MiB, 0, NULL);
  cr_assert_eq(stats().live_blocks, 0);
  cr_assert_eq(mp_pool_check(mp_default_pool()), MP_OK, "%s", mp_last_error());
}

Test(torch_free_while_paused, the_next_hook_reports_its_own_outcome) {
  freed_while_paused();
  cr_assert_null(mp_torch_malloc(0, 0, NULL));
  cr_assert(strstr(mp_last_error(), "is not positive") != NULL, "%s",
            mp_last_error());
  cr_assert_eq(stats().live_blocks, 0, "the kept free was not made");
}

Test(torch_free_while_paused, made_at_empty_cache) {
  freed_while_paused();
  mp_torch_reset();
  mp_stats_t s = stats();
  cr_assert_eq(s.live_blocks, 0, "the kept free was not made");
  cr_assert_eq(s.reserved_bytes, 0, "empty_cache kept the block's memory");
  cr_assert_eq(mp_pool_check(mp_default_pool()), MP_OK, "%s", mp_last_error());
}

Test(torch_free_while_paused, kept_again_while_still_paused) {
  void *p = mp_torch_malloc(MiB, 0, NULL);
  cr_assert_not_null(p, "%s", mp_last_error());
  cr_assert_eq(mp_pool_pause(mp_default_pool(), 0), MP_OK, "%s",
               mp_last_error());
  mp_torch_free(p, MiB, 0, NULL);
  mp_torch_reset(); /* tries the kept free: still paused */
  cr_assert_eq(stats().live_blocks, 1);
  cr_assert_eq(mp_pool_resume(mp_default_pool()), MP_OK, "%s", mp_last_error());
  mp_torch_free(NULL, 0, 0, NULL);
  cr_assert_eq(stats().live_blocks, 0, "the kept free was lost");
}
