/* test_pool_release_threshold.c - release_threshold=SIZE: idle memory above
 * SIZE goes back to the device as frees happen, without a trim call, once
 * the streams that used it are done (a query, never a wait); in single-
 * and multi-stream pools. Without the option the pool keeps its cache. */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <unistd.h>

#include <mempool/mempool.h>

#include "../support/pool_helpers.h"
#include "../support/stream_gate.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(release_threshold, "host:capacity=2G");

/* Allocates n blocks of `each` round-robin on the streams, frees them all,
 * lets the device finish, then makes a few small pairs (a free is when the
 * pool looks; after a try that found memory in use, every 8th). Returns
 * the stats after. */

static mp_stats_t churn(mp_pool_t *p, mp_stream_t *s, int ns, int n,
                        size_t each) {
  void *b[16];
  cr_assert_leq(n, 16);
  for (int i = 0; i < n; i++)
    cr_assert_eq(mp_pool_alloc(p, each, s[i % ns], &b[i]), MP_OK, "%s",
                 mp_last_error());
  for (int i = 0; i < n; i++)
    cr_assert_eq(mp_pool_free(p, b[i]), MP_OK);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  release_pairs(p, s[0]);
  return stats(p);
}

Test(release_threshold, single_stream_cache_shrinks_to_the_threshold) {
  mp_pool_t *p = make_pool(dev, "release_threshold=64M");
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  mp_stats_t st = churn(p, &s, 1, 10, 32 * MiB);
  cr_assert_gt(st.peak_reserved_bytes, 300 * MiB);
  cr_assert_leq(st.reserved_bytes, 64 * MiB + 2 * MiB,
                "reserved %zu after the frees", st.reserved_bytes);
  cr_assert_gt(st.device_free_count, 0);
  cr_assert_eq(mp_pool_check(p), MP_OK);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
}

Test(release_threshold, multi_stream_cache_shrinks_once_the_streams_are_done) {
  mp_pool_t *p = make_pool(dev, "release_threshold=32M");
  mp_stream_t s[3];
  for (int i = 0; i < 3; i++)
    cr_assert_eq(mp_stream_create(dev, &s[i]), MP_OK);
  mp_stats_t st = churn(p, s, 3, 12, 16 * MiB);
  cr_assert_gt(st.peak_reserved_bytes, 180 * MiB);
  cr_assert_leq(st.reserved_bytes, 32 * MiB + 2 * MiB,
                "reserved %zu after the frees", st.reserved_bytes);
  cr_assert_eq(mp_pool_check(p), MP_OK);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(mp_stream_destroy(dev, s[i]), MP_OK);
}

/* A block used on more streams than its record names (four
 * record_stream calls) waits for a device sync once freed; the streams it
 * was used on are not known any more, so a free that looks for memory to
 * give back must find one of them busy, and keep it, while a use still
 * runs (it gave it back: every stream looked clean). */
Test(release_threshold, block_of_many_streams_stays_while_a_use_runs) {
  mp_pool_t *p = make_pool(dev, "release_threshold=16M");
  mp_stream_t s[5];
  for (int i = 0; i < 5; i++)
    cr_assert_eq(mp_stream_create(dev, &s[i]), MP_OK);
  gate_t g;
  gate_init(&g);
  void *a, *c;
  cr_assert_eq(mp_pool_alloc(p, 128 * MiB, s[0], &a), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, MiB, s[0], &c), MP_OK);
  for (int i = 1; i < 5; i++)
    cr_assert_eq(mp_pool_record_stream(p, a, s[i]), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, s[4], gate_wait, &g), MP_OK);
  cr_assert_eq(mp_pool_free(p, a), MP_OK);
  cr_assert_eq(mp_pool_free(p, c), MP_OK); /* this free looks */
  mp_stats_t st = stats(p);
  gate_open(&g);
  cr_assert_eq(mp_device_synchronize(dev), MP_OK);
  cr_expect_geq(st.reserved_bytes, 128 * MiB,
                "given back while s[4] still ran: reserved %zu, %llu frees",
                st.reserved_bytes, (unsigned long long)st.device_free_count);
  /* Once the streams are done, a later look gives it back. */
  release_pairs(p, s[0]);
  cr_expect_leq(stats(p).reserved_bytes, 16 * MiB + 2 * MiB);
  cr_assert_eq(mp_pool_check(p), MP_OK);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  for (int i = 0; i < 5; i++)
    cr_assert_eq(mp_stream_destroy(dev, s[i]), MP_OK);
  gate_destroy(&g);
}

/* Memory a stream still uses stays (no wait), and goes at a later free. */
Test(release_threshold, busy_streams_keep_their_memory_until_done) {
  mp_pool_t *p = make_pool(dev, "release_threshold=16M");
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  gate_t g;
  gate_init(&g);
  void *a, *c;
  cr_assert_eq(mp_pool_alloc(p, 128 * MiB, s, &a), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 8 * MiB, s, &c), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, s, gate_wait, &g), MP_OK);
  cr_assert_eq(mp_pool_free(p, a), MP_OK); /* returns: never waits */
  cr_assert_geq(stats(p).reserved_bytes, 136 * MiB);
  gate_open(&g);
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  cr_assert_eq(mp_pool_free(p, c), MP_OK); /* the later free */
  cr_assert_leq(stats(p).reserved_bytes, 16 * MiB + 8 * MiB, "reserved %zu",
                stats(p).reserved_bytes);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
  gate_destroy(&g);
}

/* A host function that says it has started, then waits for its gate: once
 * `entered` is set, everything queued on the stream before it is done,
 * and the stream is still busy. */
typedef struct {
  gate_t gate;
  atomic_bool entered;
} entry_gate_t;

static void enter_then_wait(void *arg) {
  entry_gate_t *e = arg;
  atomic_store(&e->entered, true);
  gate_wait(&e->gate);
}

/* A stream that is never idle when the pool looks (an engine's stream,
 * fed all the time) still gets what it freed back to the device: a look
 * that finds the stream busy closes its epoch with a marker, which a later
 * look finds done. Before, a busy stream's open epoch stayed open (only a
 * query that found it idle closed it), and the 128 MiB stayed. */
Test(release_threshold, a_stream_never_idle_still_gives_its_memory_back) {
  mp_pool_t *p = make_pool(dev, "release_threshold=16M");
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  gate_t g1;
  gate_init(&g1);
  entry_gate_t g2;
  gate_init(&g2.gate);
  atomic_init(&g2.entered, false);
  void *a, *sep, *c, *x;
  cr_assert_eq(mp_pool_alloc(p, 128 * MiB, s, &a), MP_OK);
  /* The small blocks below come from c's memory, the best fit, kept from a
   * by a live block, so that a does not take in their later frees (and
   * wait for those too). */
  cr_assert_eq(mp_pool_alloc(p, 4096, s, &sep), MP_OK);
  cr_assert_eq(mp_pool_alloc(p, 8 * MiB, s, &c), MP_OK);
  cr_assert_eq(mp_pool_free(p, c), MP_OK);
  /* From here to the gates' opening only expectations: a failed assert
   * would leave s blocked and the device's close waiting for it. */
  cr_assert_eq(mp_stream_launch_host(dev, s, gate_wait, &g1), MP_OK);
  cr_expect_eq(mp_pool_free(p, a), MP_OK);
  /* A free looks before its own block goes back: this one, with a free,
   * finds s busy. */
  cr_expect_eq(mp_pool_alloc(p, 4096, s, &x), MP_OK);
  cr_expect_eq(mp_pool_free(p, x), MP_OK);
  size_t held = stats(p).reserved_bytes;
  /* s gets past what was queued so far, and is busy again at once. */
  mp_status_t launched = mp_stream_launch_host(dev, s, enter_then_wait, &g2);
  gate_open(&g1);
  while (launched == MP_OK && !atomic_load(&g2.entered))
    usleep(100);
  for (int i = 0; i < 9; i++) { /* later looks, s busy at each */
    cr_expect_eq(mp_pool_alloc(p, 4096, s, &x), MP_OK);
    cr_expect_eq(mp_pool_free(p, x), MP_OK);
  }
  mp_stats_t st = stats(p);
  gate_open(&g2.gate);
  cr_assert_eq(mp_stream_synchronize(dev, s), MP_OK);
  cr_assert_eq(launched, MP_OK);
  cr_expect_geq(held, 128 * MiB, "given back while s still ran");
  cr_expect_leq(st.reserved_bytes, 16 * MiB + 2 * MiB,
                "reserved %zu while s stayed busy", st.reserved_bytes);
  cr_assert_eq(mp_pool_free(p, sep), MP_OK);
  cr_assert_eq(mp_pool_check(p), MP_OK);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
  gate_destroy(&g1);
  gate_destroy(&g2.gate);
}

Test(release_threshold, without_the_option_the_cache_stays) {
  mp_pool_t *p = make_pool(dev, NULL);
  mp_stream_t s;
  cr_assert_eq(mp_stream_create(dev, &s), MP_OK);
  mp_stats_t st = churn(p, &s, 1, 10, 32 * MiB);
  cr_assert_geq(st.reserved_bytes, 320 * MiB);
  cr_assert_eq(st.device_free_count, 0);
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s), MP_OK);
}

/* Frees through mp_handle_free (movable blocks) are frees too: memory
 * above the threshold goes back as with mp_pool_free (the last block freed
 * stays until a later free, as there). Before, it did not look: a pool of
 * movable blocks kept 32 MiB above a 2 MiB threshold. A destroyed child's
 * range gives back too (15cb6ce), but when depends on whether the range's
 * last stream marker has completed at the destroy, even with the device
 * caught up before it (16 MiB left in 2 of 400 runs): not asserted here. */
Test(release_threshold, movable_frees_give_back_too) {
  mp_pool_t *p = make_pool(dev, "release_threshold=2M");
  mp_handle_t *h[4];
  for (int i = 0; i < 4; i++)
    cr_assert_eq(mp_pool_alloc_movable(p, 8 * MiB, NULL, &h[i]), MP_OK, "%s",
                 mp_last_error());
  cr_assert_eq(stats(p).reserved_bytes, 32 * MiB);
  for (int i = 0; i < 4; i++) {
    cr_assert_eq(mp_device_synchronize(dev), MP_OK);
    cr_assert_eq(mp_handle_free(h[i]), MP_OK, "%s", mp_last_error());
  }
  mp_stats_t st = stats(p);
  cr_expect_leq(st.reserved_bytes, 8 * MiB, "reserved %zu after the frees",
                st.reserved_bytes);
  cr_assert_eq(mp_pool_check(p), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_destroy(p), MP_OK);
}
