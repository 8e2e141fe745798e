/* test_preload_peak_live_after_refused_free.c - the report's peak of live
 * bytes is never below its live bytes. A free is recorded before the call
 * that makes it (so that another thread's allocation of the address comes
 * after it in the trace), and a free that call refuses is recorded live
 * again (mp__pl_record_unfree): when another thread allocated in between,
 * the block live again raises the live bytes past any peak seen so far.
 * The recording calls are made here in that order, in this process. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "preload/hooks.h"

Test(preload_peak_live_after_refused_free, a_block_live_again_raises_the_peak) {
  unsetenv("MEMPOOL_TRACE");
  mp__pl_record_alloc(0x10000, 100, 0, true); /* live 100 */
  mp__pl_record_free(0x10000, 100, 0);        /* the free, first: live 0 */
  mp__pl_record_alloc(0x20000, 100, 0, true); /* another thread: live 100 */
  mp__pl_record_unfree(0x10000, 100, 0);      /* refused: live 200 */
  mp__pl_counts_t n;
  cr_assert(mp__pl_record_close(&n));
  cr_expect_eq(n.live, 200, "live bytes %zu", n.live);
  cr_expect_geq(n.peak_live, n.live, "peak live bytes %zu below live %zu",
                n.peak_live, n.live);
  cr_expect_eq(n.allocs, 2);
  cr_expect_eq(n.frees, 0);
}
