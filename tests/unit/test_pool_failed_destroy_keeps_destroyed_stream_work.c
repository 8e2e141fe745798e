/* A destroy that fails in its wait for the streams (mp_pool_destroy from a
 * host function, where the device refuses every call) leaves the pool as it
 * was, and a stream the program destroyed with work still queued stays
 * unfinished to the pool. The events for the wait took that stream's last
 * marker (mp__streams_sync_events) and gave it back to the event cache when
 * the wait failed: the slot had no marker and no debt left, so the next
 * pool synchronize (here the out-of-memory ladder's) waited for the live
 * streams only, counted the destroyed stream done, and handed a block freed
 * on it to another stream while its work was still queued. Found by a
 * review, 2026-12-07. */
#include <criterion/criterion.h>
#include <stdatomic.h>

#include <mempool/mempool.h>

#include "../support/device_helpers.h"
#include "../support/stream_gate.h"

#define MiB ((size_t)1 << 20)

static struct {
  mp_pool_t *pool;
  mp_status_t st;
} call;

static void destroy_from_host_fn(void *unused) {
  (void)unused;
  call.st = mp_pool_destroy(call.pool);
}

Test(pool_failed_destroy_keeps_destroyed_stream_work,
     a_block_freed_on_it_waits_for_its_work) {
  mp_device_t *dev = open_dev("host");
  mp_pool_config_t cfg;
  mp_pool_config_init(&cfg);
  cr_assert_eq(
      mp_pool_config_parse(&cfg, "max_bytes=1M,segment_bytes=1M,virtual=0"),
      MP_OK, "%s", mp_last_error());
  mp_pool_t *pool = NULL;
  cr_assert_eq(mp_pool_create(dev, &cfg, &pool), MP_OK, "%s", mp_last_error());
  mp_stream_t a, b;
  cr_assert_eq(mp_stream_create(dev, &a), MP_OK);
  cr_assert_eq(mp_stream_create(dev, &b), MP_OK);

  /* x, written on a behind a closed gate, freed on a; then a destroyed
   * with that work still queued (its slot closed with a marker). */
  gate_t gate;
  gate_init(&gate);
  void *x = NULL;
  cr_assert_eq(mp_pool_alloc(pool, MiB, a, &x), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_launch_host(dev, a, gate_wait, &gate), MP_OK);
  cr_assert_eq(mp_memset_async(dev, x, 0xAA, MiB, a), MP_OK);
  cr_assert_eq(mp_pool_free(pool, x), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, a), MP_OK, "%s", mp_last_error());

  /* A destroy that cannot wait: refused, the pool as it was. */
  call.pool = pool;
  call.st = MP_OK;
  run_in_host_fn(dev, destroy_from_host_fn, NULL);
  cr_assert_neq(call.st, MP_OK, "the pool was destroyed from a host function");

  /* b wants 1 MiB, which only x can give (max_bytes): it waits for a's
   * work, or is refused, but never gets x while that work is queued. */
  gate_timer_t timer;
  cr_assert_eq(gate_timer_start(&timer, &gate, 300000), 0);
  void *y = NULL;
  mp_status_t st = mp_pool_alloc(pool, MiB, b, &y);
  bool opened = atomic_load(&timer.opened) != 0;
  gate_timer_join(&timer);
  if (st == MP_OK && y == x)
    cr_expect(opened,
              "a block freed on a destroyed stream went to another stream "
              "while the destroyed stream's work on it was still queued");
  if (st == MP_OK)
    cr_assert_eq(mp_pool_free(pool, y), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, b), MP_OK);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_stream_destroy(dev, b), MP_OK);
  mp_device_close(dev);
}
