/* An allocation during a capture that waits for the streams' work
 * (mp__pool_sync_partial) counts a destroyed stream done only up to what
 * it waited for. A full synchronize that failed (here as pause.c does when
 * the device gives no event: mp__streams_sync_begin, then
 * mp__streams_sync_failed) had snapshotted the destroyed stream
 * (sync_snap) and, failing, owed it again (dirty). The
 * partial sync keeps a dirty destroyed stream out of its wait (no event
 * can mark it) but left that stale sync_snap in place, so its end counted
 * the stream done up to it: a block freed on it went to the capture while
 * its work was still queued. Found by a review, 2026-12-08. */
#include <criterion/criterion.h>
#include <stdatomic.h>

#include "../support/pool_helpers.h"
#include "../support/stream_gate.h"
#include "pool/pool_internal.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_graph_alloc_waits_for_gone_stream_after_failed_sync,
                "host:capacity=256M");

Test(pool_graph_alloc_waits_for_gone_stream_after_failed_sync,
     a_block_freed_on_it_is_not_handed_out_before_its_work, .timeout = 60) {
  mp_pool_t *pool = make_pool(dev, NULL);
  mp_stream_t a, s1;
  cr_assert_eq(mp_stream_create(dev, &a), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_create(dev, &s1), MP_OK, "%s", mp_last_error());

  /* x, 192 of the device's 256 MiB, used on a behind a closed gate and
   * freed on a; then a destroyed with that work still queued. */
  gate_t gate;
  gate_init(&gate);
  void *x = NULL;
  cr_assert_eq(mp_pool_alloc(pool, 192 * MiB, a, &x), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_stream_launch_host(dev, a, gate_wait, &gate), MP_OK);
  cr_assert_eq(mp_memset_async(dev, x, 0xAA, MiB, a), MP_OK);
  cr_assert_eq(mp_pool_free(pool, x), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, a), MP_OK, "%s", mp_last_error());

  /* A full synchronize that failed (pause.c's path with no events). */
  mp__pool_lock(pool);
  (void)mp__streams_sync_begin(pool);
  mp__streams_sync_failed(pool);
  mp__pool_unlock(pool);

  /* A capture of s1 asks for 160 MiB, which only x can serve: it waits for
   * a's work (or is refused), never answers with it before the gate opens. */
  mp_pool_t *g;
  cr_assert_eq(mp_pool_graph_create(pool, &g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_begin(pool, g, s1), MP_OK, "%s", mp_last_error());
  gate_timer_t timer;
  cr_assert_eq(gate_timer_start(&timer, &gate, 300000), 0);
  void *y = NULL;
  mp_status_t st = mp_pool_alloc(pool, 160 * MiB, s1, &y);
  bool opened = atomic_load(&timer.opened) != 0;
  gate_timer_join(&timer);
  if (st == MP_OK)
    cr_expect(opened, "the capture got memory freed on a destroyed stream "
                      "while that stream's work was still queued");
  if (st == MP_OK)
    cr_assert_eq(mp_pool_free(pool, y), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_end(pool, s1), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_graph_release(g), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, s1), MP_OK);
  gate_destroy(&gate);
}
