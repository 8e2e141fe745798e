/* A snapshot's block states are PyTorch's: "active_allocated" while the
 * program holds a block, "active_pending_free" once it let go but the
 * block is not yet reusable, "inactive" when free
 * (torch/csrc/cuda/memory_snapshot.cpp writes allocated, else active,
 * else inactive; CUDACachingAllocator.cpp's snapshot() calls a block
 * active while it is allocated or its reuse waits for events or stream
 * uses). And its trace says free_requested when the program frees and
 * free_completed when the block can be reused, as PyTorch's does
 * (bench/core/pickle.c reads them so). A block freed while another
 * process imports it is held until its leases close (export.c): it was
 * written as active_allocated, and both free events came only when the
 * leases closed. The ladder's block: test_pool_pause.c. A free block
 * that every stream would have to wait for (work on two streams, as far
 * as the pool knows) is pending too, as a PyTorch block freed with stream
 * uses is until its events are done; one whose only unfinished work is on
 * one stream is that stream's at once, and inactive. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "../support/dump_json.h"
#include "../support/pool_helpers.h"
#include "../support/snapshot_devices.h"
#include "../support/snapshot_fields.h"
#include "../support/stream_gate.h"

#define MiB ((size_t)1 << 20)

MP_DEVICE_SUITE(pool_snapshot_states, "host:capacity=64M");

Test(pool_snapshot_states, a_block_freed_while_imported_is_pending_free) {
  mp_pool_t *pool = make_pool(dev, "history=100");
  void *a, *b;
  cr_assert_eq(mp_pool_alloc(pool, MiB, NULL, &a), MP_OK);
  cr_assert_eq(mp_pool_alloc(pool, 2 * MiB, NULL, &b), MP_OK);
  mp_ipc_handle_t h;
  cr_assert_eq(mp_pool_ipc_export(pool, a, &h), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, a), MP_OK, "%s", mp_last_error());

  size_t len, n;
  char *s = (char *)snapshot_bytes(pool, &len);
  cr_expect_eq(snapshot_str_count(s, len, "active_allocated"), 1);
  cr_expect_eq(snapshot_str_count(s, len, "active_pending_free"), 1);
  cr_expect_eq(snapshot_sum(s, len, "allocated_size", &n), 2 * MiB);
  cr_expect_eq(snapshot_sum(s, len, "active_size", &n), 3 * MiB);
  /* Each block's requested_size, and each segment's, which sums them. */
  cr_expect_eq(snapshot_sum(s, len, "requested_size", &n), 2 * 3 * MiB);
  cr_expect_eq(snapshot_str_count(s, len, "free_requested"), 1);
  cr_expect_eq(snapshot_str_count(s, len, "free_completed"), 0);
  free(s);

  /* The lease closed: a poll reaps it and the block goes back. */
  cr_assert_eq(mp_ipc_handle_close(&h), MP_OK);
  size_t held;
  cr_assert_eq(mp_pool_ipc_poll(pool, &held), MP_OK, "%s", mp_last_error());
  cr_assert_eq(held, 0);
  cr_assert_eq(mp_pool_free(pool, b), MP_OK, "%s", mp_last_error());
  check(pool);
  s = (char *)snapshot_bytes(pool, &len);
  cr_expect_eq(snapshot_str_count(s, len, "active_allocated"), 0);
  cr_expect_eq(snapshot_str_count(s, len, "active_pending_free"), 0);
  cr_expect_eq(snapshot_sum(s, len, "active_size", &n), 0);
  cr_expect_eq(snapshot_str_count(s, len, "free_requested"), 2);
  cr_expect_eq(snapshot_str_count(s, len, "free_completed"), 2);
  free(s);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
}

/* The torch dump's inactive_split_bytes. */
static size_t inactive_split_bytes(mp_pool_t *pool) {
  static const char key[] = "\"inactive_split_bytes.all.current\":";
  char *t = dump_of(pool, "torch");
  const char *k = strstr(t, key);
  cr_assert_not_null(k, "%s", t);
  size_t v = strtoull(k + strlen(key), NULL, 10);
  free(t);
  return v;
}

Test(pool_snapshot_states,
     a_block_freed_with_work_on_two_busy_streams_is_pending) {
  /* s1 and s2, each held back by its gate. */
  mp_stream_t st[2];
  gate_t g[2];
  for (int i = 0; i < 2; i++) {
    gate_init(&g[i]);
    cr_assert_eq(mp_stream_create(dev, &st[i]), MP_OK);
    cr_assert_eq(mp_stream_launch_host(dev, st[i], gate_wait, &g[i]), MP_OK);
  }
  mp_stream_t s1 = st[0], s2 = st[1];
  mp_pool_t *pool = make_pool(dev, NULL);
  void *a, *x, *b, *c;
  cr_assert_eq(mp_pool_alloc(pool, MiB, s1, &a), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, MiB, s1, &x), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, MiB, s1, &b), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_alloc(pool, MiB, s1, &c), MP_OK, "%s", mp_last_error());

  /* b freed on busy s1 alone: s1 may take it at once. */
  cr_assert_eq(mp_pool_free(pool, b), MP_OK, "%s", mp_last_error());
  size_t len, n;
  char *s = (char *)snapshot_bytes(pool, &len);
  cr_expect_eq(snapshot_str_count(s, len, "active_pending_free"), 0);
  cr_expect_eq(snapshot_sum(s, len, "active_size", &n), 3 * MiB);
  free(s);
  size_t split = inactive_split_bytes(pool);
  cr_expect_geq(split, MiB, "b lies between live x and c: %zu", split);

  /* a used on busy s2 too, then freed: whichever stream asks waits. It
   * lies below live x, apart from b. */
  cr_assert_eq(mp_pool_record_stream(pool, a, s2), MP_OK, "%s",
               mp_last_error());
  cr_assert_eq(mp_pool_free(pool, a), MP_OK, "%s", mp_last_error());
  s = (char *)snapshot_bytes(pool, &len);
  cr_expect_eq(snapshot_str_count(s, len, "active_allocated"), 2);
  cr_expect_eq(snapshot_str_count(s, len, "active_pending_free"), 1);
  cr_expect_eq(snapshot_sum(s, len, "active_size", &n), 3 * MiB);
  cr_expect_eq(snapshot_sum(s, len, "allocated_size", &n), 2 * MiB);
  /* Blocks and segments: x's and c's requests, nothing for a. */
  cr_expect_eq(snapshot_sum(s, len, "requested_size", &n), 2 * 2 * MiB);
  free(s);
  cr_expect_eq(inactive_split_bytes(pool), split,
               "the pending block counted as inactive split");

  /* The streams done and the pool told (a trim syncs them): inactive. */
  gate_open(&g[0]);
  gate_open(&g[1]);
  cr_assert_eq(mp_pool_trim(pool, 0), MP_OK, "%s", mp_last_error());
  s = (char *)snapshot_bytes(pool, &len);
  cr_expect_eq(snapshot_str_count(s, len, "active_pending_free"), 0);
  cr_expect_eq(snapshot_sum(s, len, "active_size", &n), 2 * MiB);
  free(s);
  cr_expect_geq(inactive_split_bytes(pool), split + MiB);
  cr_assert_eq(mp_pool_free(pool, x), MP_OK, "%s", mp_last_error());
  cr_assert_eq(mp_pool_free(pool, c), MP_OK, "%s", mp_last_error());
  check(pool);
  cr_assert_eq(mp_pool_destroy(pool), MP_OK, "%s", mp_last_error());
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(mp_stream_destroy(dev, st[i]), MP_OK);
    gate_destroy(&g[i]);
  }
}
