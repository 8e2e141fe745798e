/* A free beside a block another stream's work still holds, on the host
 * device (the scenario: support/stream_merges.h; its GPU twin is in
 * fakecuda/test_cuda_pool_rules.c): the freed block stays apart and is
 * reusable on its own stream at once, and the two join once that work is
 * done, before the pool would grow. */
#include <criterion/criterion.h>

#include <mempool/mempool.h>

#include "../support/gated_streams_fixture.h"
#include "../support/stream_merges.h"

TestSuite(pool_stream_merges, .init = setup, .fini = teardown);

Test(pool_stream_merges,
     a_block_freed_beside_another_streams_pending_block_serves_its_stream) {
  merges_b_serves_its_stream_at_once(pool, dev, &gate, s1, s2);
}

Test(pool_stream_merges, neighbours_kept_apart_join_before_the_pool_grows) {
  merges_join_before_growth(pool, dev, &gate, s1, s2);
}

/* The pool's own check accepts the pair kept apart, and trim joins it once
 * the work is done (one free block of 2 MiB, which trim gives back). */
Test(pool_stream_merges, trim_joins_the_pair_once_the_work_is_done) {
  merges_t m = merges_free_beside_a_gated_stream(pool, dev, &gate, s1, s2);
  (void)m;
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  gate_open(&gate);
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s2), MP_OK);
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK);
  cr_expect_eq(merges_reserved(pool), 0, "a pair left apart kept memory");
}

/* Three neighbours freed on three streams, each kept apart from the one
 * before (its stream still held): once the work is done, trim joins all
 * three, and the chunk they fill goes back. (The joining walk moved on
 * after one merge and left the third apart: the chunk stayed.) */
Test(pool_stream_merges, a_run_of_three_kept_apart_joins_whole_at_trim) {
  const size_t mib = (size_t)1 << 20;
  mp_stream_t s3;
  cr_assert_eq(mp_stream_create(dev, &s3), MP_OK);
  void *a, *b, *c, *x;
  cr_assert_eq(mp_pool_alloc(pool, mib / 2, s1, &a), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, mib, s2, &b), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, mib / 2, s3, &c), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, mib, s3, &x), MP_OK); /* the next chunk */
  cr_assert_eq((char *)b, (char *)a + mib / 2);
  cr_assert_eq((char *)c, (char *)b + mib);
  cr_assert_eq(merges_reserved(pool), 4 * mib);
  cr_assert_eq(mp_stream_launch_host(dev, s1, gate_wait, &gate), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, s2, gate_wait, &gate), MP_OK);
  cr_assert_eq(mp_pool_free(pool, a), MP_OK);
  cr_assert_eq(mp_pool_free(pool, b), MP_OK);
  cr_assert_eq(mp_pool_free(pool, c), MP_OK);
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  gate_open(&gate);
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s2), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s3), MP_OK);
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK);
  cr_expect_eq(merges_reserved(pool), 2 * mib,
               "the first chunk, wholly free, was kept");
  cr_assert_eq(mp_pool_free(pool, x), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s3), MP_OK);
  cr_assert_eq(mp_stream_forget(dev, s3), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s3), MP_OK);
}

/* A pair kept apart counts as pending: a request that only the two
 * together fit waits the short while (200 us at most) that a block pending
 * on another stream gets, instead of growing at once. Here s1 reaches its
 * work 20 us after it was queued (host:stream_latency_us=20), so a's free
 * is pending when b is freed and the request made; twenty rounds, each on
 * a fresh pool. With the pair counted as nothing pending, every round
 * grew (a review's reproducer: 20 of 20); a loaded machine may miss the
 * window now and then. */
Test(pool_stream_merges, a_request_waits_briefly_for_a_pair_kept_apart) {
  mp_device_t *d;
  cr_assert_eq(mp_device_open("host:stream_latency_us=20", &d), MP_OK, "%s",
               mp_last_error());
  mp_stream_t t1, t2;
  cr_assert_eq(mp_stream_create(d, &t1), MP_OK);
  cr_assert_eq(mp_stream_create(d, &t2), MP_OK);
  const size_t mib = (size_t)1 << 20;
  int grew = 0;
  for (int round = 0; round < 20; round++) {
    mp_pool_t *p;
    cr_assert_eq(mp_pool_create(d, NULL, &p), MP_OK);
    void *a, *b, *y;
    cr_assert_eq(mp_pool_alloc(p, mib, t1, &a), MP_OK);
    cr_assert_eq(mp_pool_alloc(p, mib, t2, &b), MP_OK);
    cr_assert_eq(mp_memset_async(d, a, 1, 4096, t1), MP_OK);
    cr_assert_eq(mp_pool_free(p, a), MP_OK);
    cr_assert_eq(mp_pool_free(p, b), MP_OK);
    size_t before = merges_reserved(p);
    cr_assert_eq(mp_pool_alloc(p, 2 * mib, t2, &y), MP_OK);
    grew += merges_reserved(p) != before;
    cr_assert_eq(mp_pool_free(p, y), MP_OK);
    cr_assert_eq(mp_device_synchronize(d), MP_OK);
    cr_expect_eq(mp_pool_check(p), MP_OK, "%s", mp_last_error());
    cr_assert_eq(mp_pool_destroy(p), MP_OK);
  }
  cr_expect_lt(grew, 10, "grew in %d of 20 rounds", grew);
  mp_stream_destroy(d, t1);
  mp_stream_destroy(d, t2);
  mp_device_close(d);
}

/* Four neighbours freed apart: p0 (s1) and p1 (s2), whose work is then
 * done, and p2 (s3) and p3 (s2, also used on s3), whose work s3 still
 * holds. The joining walk joins p0 with p1 and p2 with p3, and leaves the
 * two results apart (one waits for s3, the other for nothing): they must
 * still be marked so, or the pool's check finds two free neighbours that
 * nobody left apart on purpose (it did: both marks were cleared). */
Test(pool_stream_merges, two_joined_pairs_left_apart_still_pass_the_check) {
  const size_t half = (size_t)1 << 19;
  gate_t g3;
  gate_init(&g3);
  mp_stream_t s3;
  cr_assert_eq(mp_stream_create(dev, &s3), MP_OK);
  void *p[4], *y;
  cr_assert_eq(mp_pool_alloc(pool, half, s1, &p[0]), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, half, s2, &p[1]), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, half, s3, &p[2]), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, half, s2, &p[3]), MP_OK);
  for (int i = 1; i < 4; i++)
    cr_assert_eq((char *)p[i], (char *)p[i - 1] + half, "not neighbours");
  cr_assert_eq(mp_pool_record_stream(pool, p[3], s3), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, s1, gate_wait, &gate), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, s2, gate_wait, &gate), MP_OK);
  cr_assert_eq(mp_stream_launch_host(dev, s3, gate_wait, &g3), MP_OK);
  cr_assert_eq(mp_pool_free(pool, p[0]), MP_OK);
  cr_assert_eq(mp_pool_free(pool, p[1]), MP_OK);
  cr_assert_eq(mp_pool_free(pool, p[3]), MP_OK);
  cr_assert_eq(mp_pool_free(pool, p[2]), MP_OK);
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  gate_open(&gate);
  cr_assert_eq(mp_stream_synchronize(dev, s1), MP_OK);
  cr_assert_eq(mp_stream_synchronize(dev, s2), MP_OK);
  /* A request no block fits alone runs the joining walk, and p0 + p1
   * serve it (its rest stays free, beside p2 + p3). */
  cr_assert_eq(mp_pool_alloc(pool, 3 * half / 2, s1, &y), MP_OK);
  cr_expect_eq(y, p[0], "p0 and p1 did not join");
  cr_expect_eq(mp_pool_check(pool), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, y), MP_OK);
  gate_open(&g3);
  cr_assert_eq(mp_stream_synchronize(dev, s3), MP_OK);
  cr_assert_eq(mp_stream_forget(dev, s3), MP_OK);
  cr_assert_eq(mp_stream_destroy(dev, s3), MP_OK);
  gate_destroy(&g3);
}
