/* test_pool_defrag_no_staging_room_keeps_last_error.c - a defragmentation
 * whose staging buffer the device has no room for (defrag.c: the cap
 * leaves room, the device does not) slides in gap-sized chunks instead and
 * succeeds; it then leaves the thread's last error as it was (status.h:
 * "A later success does not clear it; the next failure replaces it").
 * Before, mp_pool_defragment answered MP_OK with the refused buffer's "out
 * of memory" as the last error, replacing the failure the caller was still
 * to report. */
#include <criterion/criterion.h>
#include <string.h>

#include "../support/pool_helpers.h"

#define MiB ((size_t)1 << 20)

/* 2.5 MiB: the pool's 2 MiB segment fits, a 1 MiB staging buffer beside it
 * does not. */
MP_DEVICE_SUITE(pool_defrag_no_staging_room_keeps_last_error,
                "host:capacity=2560K");

Test(pool_defrag_no_staging_room_keeps_last_error, a_slide_in_small_chunks) {
  mp_pool_t *p =
      make_pool(dev, "virtual=0,max_bytes=8M,segment_bytes=2M,align=512");
  mp_handle_t *small, *big;
  cr_assert_eq(mp_pool_alloc_movable(p, 4096, NULL, &small), MP_OK);
  cr_assert_eq(mp_pool_alloc_movable(p, MiB, NULL, &big), MP_OK);
  char *low = mp_handle_ptr(small);
  cr_assert_eq((char *)mp_handle_ptr(big), low + 4096);
  cr_assert_eq(mp_handle_free(small), MP_OK);
  /* The caller's failure, still to be reported. */
  cr_assert_eq(mp_pool_trim(NULL, 0), MP_EINVAL);
  char msg[512];
  snprintf(msg, sizeof msg, "%s", mp_last_error());
  size_t moved = 0;
  mp_status_t st = mp_pool_defragment(p, NULL, &moved);
  cr_expect_eq(st, MP_OK, "%s: %s", mp_status_name(st), mp_last_error());
  cr_expect_eq(moved, MiB, "the block did not slide");
  cr_expect_eq((char *)mp_handle_ptr(big), low);
  cr_expect_str_eq(mp_last_error(), msg);
  cr_expect_eq(mp_last_status(), MP_EINVAL, "%s",
               mp_status_name(mp_last_status()));
  check(p);
  cr_assert_eq(mp_handle_free(big), MP_OK);
  mp_pool_destroy(p);
}
